package train

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/models"
)

// TestLoRARunResumesExactlyAndKeepsTheBase trains adapters (with dropout, over every linear
// layer), saves, resumes and compares every loss bit for bit with an uninterrupted run; the
// base never moves, has no gradients and no optimizer state, and checkpoints hold the adapter.
func TestLoRARunResumesExactlyAndKeepsTheBase(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra []string
	}{
		{"all-linear dropout", []string{"--lora_target_modules=all-linear", "--lora_dropout=0.1"}},
		{"q v rslora checkpointing bf16", []string{"--use_rslora=true", "--gradient_checkpointing=true", "--bf16=true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := writeJSONL(t, dir, "d.jsonl", pcRecords(40))
			extra := append([]string{"--use_peft=true", "--lora_r=4", "--lora_alpha=8", "--learning_rate=1e-2", "--gradient_accumulation_steps=2"}, tc.extra...)
			cfg := tinyConfig(t, path, extra...)
			fullRun := newTrainer(t, cfg)
			m := fullRun.model
			base := map[string][]float32{}
			for _, s := range m.Specs {
				base[s.Name], _ = m.ParamFloat32(s.Name)
			}
			full := steps(t, fullRun, 6)
			if m.Grads != nil {
				t.Fatal("a LoRA run allocated gradients for the base")
			}
			ad := m.LoRA()
			if ad == nil || ad.Grads.Flat.Numel() != ad.NumParams() {
				t.Fatal("adapter gradients do not cover exactly the adapters")
			}
			_, sts, err := fullRun.opt.Export()
			if err != nil {
				t.Fatal(err)
			}
			for _, st := range sts {
				if !strings.Contains(st.Name, ".lora_") {
					t.Fatalf("optimizer state %q is not an adapter's: the frozen base must have none", st.Name)
				}
			}
			for _, s := range m.Specs {
				v, _ := m.ParamFloat32(s.Name)
				if !slices.Equal(v, base[s.Name]) {
					t.Fatalf("base weight %s moved during LoRA training", s.Name)
				}
			}
			if !(full[5] < full[0]) {
				t.Fatalf("adapter training did not lower the loss: %v", full)
			}

			first := newTrainer(t, cfg)
			got := steps(t, first, 3)
			ck := filepath.Join(dir, "ck")
			if err := first.Save(ck); err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{models.AdapterConfigFile, models.AdapterWeightsFile, "tokenizer.json", StateFile, OptimizerFile} {
				if _, err := os.Stat(filepath.Join(ck, f)); err != nil {
					t.Errorf("checkpoint lacks %s", f)
				}
			}
			if _, err := os.Stat(filepath.Join(ck, "model.safetensors")); err == nil {
				t.Error("a LoRA checkpoint holds the whole model")
			}
			second := newTrainer(t, cfg)
			if err := second.Resume(ck); err != nil {
				t.Fatal(err)
			}
			got = append(got, steps(t, second, 3)...)
			for i := range full {
				if math.Float64bits(full[i]) != math.Float64bits(got[i]) {
					t.Fatalf("step %d: uninterrupted loss %v, resumed %v (all: %v vs %v)", i+1, full[i], got[i], full, got)
				}
			}
		})
	}
}

func TestLoRARunWritesTheAdapterToOutputDir(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(20))
	cfg := tinyConfig(t, path, "--use_peft=true", "--max_steps=3", "--lora_target_modules=[q_proj, o_proj, down_proj]")
	tr := newTrainer(t, cfg)
	if _, err := Run(context.Background(), tr, RunOptions{}); err != nil {
		t.Fatal(err)
	}
	out := cfg.Run.OutputDir
	lc, pc, err := models.ReadAdapterConfig(out)
	if err != nil {
		t.Fatal(err)
	}
	if lc.R != 16 || lc.Alpha != 32 || lc.Dropout != 0.05 || !slices.Equal(lc.Targets, []string{"down_proj", "o_proj", "q_proj"}) {
		t.Fatalf("adapter config %+v (TRL defaults r=16, alpha=32, dropout=0.05)", lc)
	}
	if pc.BaseModelNameOrPath != "qwen3" {
		t.Fatalf("base_model_name_or_path %q", pc.BaseModelNameOrPath)
	}
	if _, err := os.Stat(filepath.Join(out, models.AdapterWeightsFile)); err != nil {
		t.Fatal(err)
	}
}

func TestLoRAConfigKeys(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(4))
	for _, c := range []struct {
		name  string
		extra []string
		want  string // "" accepts
	}{
		{"defaults", []string{"--use_peft=true"}, ""},
		{"rank without use_peft", []string{"--lora_r=8"}, "lora_r: is set but use_peft is false"},
		{"targets without use_peft", []string{"--lora_target_modules=all-linear"}, "lora_target_modules: is set but use_peft is false"},
		{"zero rank", []string{"--use_peft=true", "--lora_r=0"}, "lora_r"},
		{"negative alpha", []string{"--use_peft=true", "--lora_alpha=-1"}, "lora_alpha: -1 must be"},
		{"dropout 1", []string{"--use_peft=true", "--lora_dropout=1"}, "lora_dropout: 1 must be in [0, 1)"},
		{"all-linear with names", []string{"--use_peft=true", "--lora_target_modules=[all-linear, q_proj]"}, "stands alone"},
		{"lm head", []string{"--use_peft=true", "--lora_target_modules=lm_head"}, "LM head"},
		{"data parallel", []string{"--use_peft=true", "--devices=cpu:2", "--gradient_accumulation_steps=2"}, ""},
		{"fsdp", []string{"--use_peft=true", "--devices=cpu:2", "--fsdp=true"}, "rule adapters"},
		{"tensor parallel", []string{"--use_peft=true", "--devices=cpu:2", "--tensor_parallel_size=2"}, "rule adapters"},
		{"misspelt", []string{"--use_peft=true", "--lora_rank=8"}, "lora_r"},
	} {
		t.Run(c.name, func(t *testing.T) {
			y := "init: {arch: qwen3, preset: tiny}\ntokenizer_name_or_path: " + quickTok + "\ndataset: {path: " + path + "}\noutput_dir: " + t.TempDir() + "\n"
			_, err := ParseConfig([]byte(y), "test.yaml", MethodSFT, c.extra)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// TestLoRAMemoryEstimate checks that the dry-run estimate counts the adapters (exactly as
// many as the model gets) and no gradients or moments for the base.
func TestLoRAMemoryEstimate(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(8))
	cfg := tinyConfig(t, path, "--use_peft=true", "--lora_target_modules=all-linear", "--lora_r=3")
	mc, err := ModelConfigFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e, err := EstimateMemory(cfg, mc)
	if err != nil {
		t.Fatal(err)
	}
	tr := newTrainer(t, cfg)
	n := int64(tr.model.LoRA().NumParams())
	if e.Adapters != n {
		t.Fatalf("estimate counts %d adapter parameters, the model has %d", e.Adapters, n)
	}
	if e.GradBytes != 4*n || e.OptimBytes != 8*n || e.ParamBytes != 4*(e.Params+n) {
		t.Fatalf("estimate %+v: want gradients and fp32 moments for the %d adapter parameters only", e, n)
	}
	if !strings.Contains(e.String(), "LoRA") {
		t.Fatalf("the estimate does not show the adapters:\n%s", e)
	}
	full := tinyConfig(t, path)
	ef, _ := EstimateMemory(full, mc)
	if !(e.GradBytes < ef.GradBytes/10) {
		t.Fatalf("LoRA gradients %d bytes vs full fine-tuning %d", e.GradBytes, ef.GradBytes)
	}
}

// TestLoRADataParallelRunMatchesOneDevice trains adapters (with dropout) on two simulated
// devices: the losses follow the single-device run, a checkpoint saved from the plan holds the
// adapter, and resuming it on two devices continues on the same track.
func TestLoRADataParallelRunMatchesOneDevice(t *testing.T) {
	dir := t.TempDir()
	path := writeJSONL(t, dir, "d.jsonl", pcRecords(40))
	extra := []string{"--use_peft=true", "--lora_r=4", "--lora_target_modules=all-linear", "--lora_dropout=0.1",
		"--learning_rate=1e-2", "--gradient_accumulation_steps=2"}
	one := steps(t, newTrainer(t, tinyConfig(t, path, extra...)), 6)
	dp := tinyConfig(t, path, append(extra, "--devices=cpu:2")...)
	first := newTrainer(t, dp)
	got := steps(t, first, 3)
	ck := filepath.Join(dir, "ck")
	if err := first.Save(ck); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(ck, models.AdapterWeightsFile)); err != nil {
		t.Fatalf("checkpoint of the plan: %v", err)
	}
	second := newTrainer(t, dp)
	if err := second.Resume(ck); err != nil {
		t.Fatal(err)
	}
	got = append(got, steps(t, second, 3)...)
	for i := range one {
		if math.Abs(got[i]-one[i]) > 1e-5*math.Abs(one[i]) {
			t.Fatalf("step %d: loss on 2 devices %v, on one %v (all: %v vs %v)", i+1, got[i], one[i], got, one)
		}
	}
}
