package models

import (
	"encoding/json"
	"flag"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

var updateLoRA = flag.Bool("update-lora", false, "rewrite the adapters and logprobs under testdata/lora")

// loraGoldenCases are adapters trained for a few steps over checkpoints of testdata/saved.
// Each directory holds the adapter (PEFT's files; base_model_name_or_path names its base
// relative to the repository root) and halo.json:
// our logprobs of the base's ids.json with the adapter and after merging it. The GPU script
// scripts/gpu/peft_check.py loads the same adapters with PEFT and writes peft.json beside them.
var loraGoldenCases = []struct {
	name, base string
	cfg        LoRAConfig
}{
	{"qwen2_all_linear", "qwen2", LoRAConfig{R: 4, Alpha: 8, Dropout: 0.1, Targets: []string{AllLinear}, Seed: 21}},
	{"llama_tied_qv_rslora", "llama_tied", LoRAConfig{R: 2, Alpha: 4, Targets: []string{"q_proj", "v_proj"}, RSLoRA: true, Seed: 22}},
	{"qwen3_bf16_pattern", "qwen3_bf16", LoRAConfig{R: 3, Alpha: 6, TargetPattern: `model\.layers\.1\.(self_attn\.o_proj|mlp\.up_proj)`, Seed: 23}},
}

type loraGolden struct {
	IDs      []int32   `json:"input_ids"`
	Adapted  []float32 `json:"logprobs"`
	Merged   []float32 `json:"merged_logprobs"`
	Disabled []float32 `json:"base_logprobs"`
}

func TestLoRAGoldens(t *testing.T) {
	for _, tc := range loraGoldenCases {
		t.Run(tc.name, func(t *testing.T) {
			base := filepath.Join("testdata", "saved", tc.base)
			dir := filepath.Join("testdata", "lora", tc.name)
			var ids struct {
				IDs []int32 `json:"input_ids"`
			}
			readJSON(t, filepath.Join(base, "ids.json"), &ids)
			if *updateLoRA {
				writeLoRAGolden(t, base, dir, tc.cfg, ids.IDs)
			}
			var g loraGolden
			readJSON(t, filepath.Join(dir, "halo.json"), &g)
			m, err := Load(base, newCPU(), Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if err := m.LoadAdapter(dir); err != nil {
				t.Fatal(err)
			}
			got, _ := m.Logprobs(g.IDs)
			if !slices.Equal(got, g.Adapted) {
				t.Fatalf("adapter logprobs %v, golden %v", got, g.Adapted)
			}
			m.SetAdaptersEnabled(false)
			off, _ := m.Logprobs(g.IDs)
			m.SetAdaptersEnabled(true)
			if !slices.Equal(off, g.Disabled) || slices.Equal(off, g.Adapted) {
				t.Fatal("logprobs with the adapter off are not the base's")
			}
			if err := m.MergeLoRA(); err != nil {
				t.Fatal(err)
			}
			merged, _ := m.Logprobs(g.IDs)
			if !slices.Equal(merged, g.Merged) {
				t.Fatalf("merged logprobs %v, golden %v", merged, g.Merged)
			}
			if d := maxAbsDiff(merged, got); d > 1e-5 {
				t.Fatalf("merged model differs from base+adapter by %g in fp32", d)
			}
			raw, err := os.ReadFile(filepath.Join(dir, "peft.json"))
			if os.IsNotExist(err) {
				t.Skipf("no %s/peft.json yet: run scripts/gpu/peft_check.py where PEFT is installed", dir)
			}
			var ref struct {
				Logprobs []float64 `json:"logprobs"`
			}
			if err := json.Unmarshal(raw, &ref); err != nil {
				t.Fatal(err)
			}
			for i := range ref.Logprobs {
				if d := math.Abs(float64(got[i]) - ref.Logprobs[i]); d > 1e-4 {
					t.Errorf("token %d: logprob %.6f, PEFT %.6f", i+1, got[i], ref.Logprobs[i])
				}
			}
		})
	}
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// writeLoRAGolden trains adapters over base for a few SGD steps and saves them with their
// logprobs.
func writeLoRAGolden(t *testing.T, base, dir string, c LoRAConfig, ids []int32) {
	m, err := Load(base, newCPU(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.AttachLoRA(c); err != nil {
		t.Fatal(err)
	}
	batch := packedBatch(m.Arch.Vocab, []int{12, 9}, 31)
	for range 6 {
		if err := m.ZeroGrads(); err != nil {
			t.Fatal(err)
		}
		if _, _, err := m.ForwardBackward(batch, 1.0/19); err != nil {
			t.Fatal(err)
		}
		sgdAdapters(t, m, 2)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := m.SaveAdapter(dir, "engine/models/"+filepath.ToSlash(base)); err != nil {
		t.Fatal(err)
	}
	// The golden is what a fresh load computes (adapters stored in F32 are exact here).
	m2, err := Load(base, newCPU(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if err := m2.LoadAdapter(dir); err != nil {
		t.Fatal(err)
	}
	var g loraGolden
	g.IDs = ids
	g.Adapted, _ = m2.Logprobs(ids)
	m2.SetAdaptersEnabled(false)
	g.Disabled, _ = m2.Logprobs(ids)
	m2.SetAdaptersEnabled(true)
	if err := m2.MergeLoRA(); err != nil {
		t.Fatal(err)
	}
	g.Merged, _ = m2.Logprobs(ids)
	raw, _ := json.Marshal(g)
	if err := os.WriteFile(filepath.Join(dir, "halo.json"), append(raw, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoRASaveLoadRoundTripIsBitExact(t *testing.T) {
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			m, err := Load(filepath.Join("testdata", "saved", "qwen2"), newCPU(), Options{DType: dt})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if err := m.AttachLoRA(LoRAConfig{R: 3, Alpha: 7, Dropout: 0.05, Targets: []string{"k_proj", "mlp.down_proj"}, RSLoRA: true, Seed: 9}); err != nil {
				t.Fatal(err)
			}
			randomizeB(t, m, 4)
			dir := t.TempDir()
			if err := m.SaveAdapter(dir, "Qwen/tiny"); err != nil {
				t.Fatal(err)
			}
			var pc map[string]any
			readJSON(t, filepath.Join(dir, AdapterConfigFile), &pc)
			for k, want := range map[string]any{"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 3.0, "lora_alpha": 7.0,
				"lora_dropout": 0.05, "use_rslora": true, "bias": "none", "fan_in_fan_out": false, "base_model_name_or_path": "Qwen/tiny"} {
				if pc[k] != want {
					t.Errorf("adapter_config.json %s = %v, want %v", k, pc[k], want)
				}
			}
			if tm, _ := json.Marshal(pc["target_modules"]); string(tm) != `["k_proj","mlp.down_proj"]` {
				t.Errorf("target_modules %s", tm)
			}
			m2, err := Load(filepath.Join("testdata", "saved", "qwen2"), newCPU(), Options{DType: dt})
			if err != nil {
				t.Fatal(err)
			}
			defer m2.Close()
			if err := m2.LoadAdapter(dir); err != nil {
				t.Fatal(err)
			}
			if m2.LoRA().Config.Seed != 0 || m2.LoRA().Config.R != 3 || !m2.LoRA().Config.RSLoRA {
				t.Fatalf("loaded config %+v", m2.LoRA().Config)
			}
			for _, s := range m.LoRA().Specs {
				a, _ := m.AdapterFloat32(s.Name)
				b, err := m2.AdapterFloat32(s.Name)
				if err != nil || !slices.Equal(a, b) {
					t.Fatalf("%s differs after save and load (%v)", s.Name, err)
				}
			}
			ids := []int32{3, 9, 27, 1, 50}
			l1, _ := m.Logprobs(ids)
			l2, _ := m2.Logprobs(ids)
			if !slices.Equal(l1, l2) {
				t.Fatal("logprobs differ after save and load")
			}
		})
	}
}

func TestLoadAdapterRefusesWhatItCannotApply(t *testing.T) {
	base := filepath.Join("testdata", "saved", "qwen2")
	good := filepath.Join("testdata", "lora", "qwen2_all_linear")
	cfgRaw, err := os.ReadFile(filepath.Join(good, AdapterConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	weights, _ := os.ReadFile(filepath.Join(good, AdapterWeightsFile))
	for _, c := range []struct {
		name, set, want string
	}{
		{"dora", `"use_dora": true`, "use_dora is not supported"},
		{"bias", `"bias": "all"`, `bias "all"`},
		{"modules_to_save", `"modules_to_save": ["lm_head"]`, "modules_to_save"},
		{"rank pattern", `"rank_pattern": {"q_proj": 8}`, "rank_pattern"},
		{"prefix tuning", `"peft_type": "PREFIX_TUNING"`, "only LORA"},
		{"other rank", `"r": 8`, "has shape"},
		{"fewer targets", `"target_modules": ["q_proj"]`, "no adapter of the modules"},
		{"unknown module", `"target_modules": ["c_attn"]`, "matches no linear layer"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var pc map[string]any
			_ = json.Unmarshal(cfgRaw, &pc)
			var kv map[string]any
			if err := json.Unmarshal([]byte("{"+c.set+"}"), &kv); err != nil {
				t.Fatal(err)
			}
			for k, v := range kv {
				pc[k] = v
			}
			dir := t.TempDir()
			raw, _ := json.Marshal(pc)
			_ = os.WriteFile(filepath.Join(dir, AdapterConfigFile), raw, 0o644)
			_ = os.WriteFile(filepath.Join(dir, AdapterWeightsFile), weights, 0o644)
			m, err := Load(base, newCPU(), Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			err = m.LoadAdapter(dir)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
			if m.LoRA() != nil {
				t.Fatal("a refused adapter stayed attached")
			}
		})
	}
	m, _ := Load(base, newCPU(), Options{})
	defer m.Close()
	if err := m.LoadAdapter(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no adapter_config.json") {
		t.Fatalf("empty directory: %v", err)
	}
}
