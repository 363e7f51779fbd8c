package models

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
	"github.com/halo-shell/halo-shell/engine/quant"
)

// writeBitsandbytesCheckpoint saves m and rewrites the checkpoint as transformers saves a model
// loaded with load_in_4bit: every linear weight in bitsandbytes' NF4 layout, the rest as is,
// and a bitsandbytes quantization_config in config.json. edit, if set, changes the tensors.
func writeBitsandbytesCheckpoint(t *testing.T, m *Model, nested bool, edit func([]safetensors.Tensor) []safetensors.Tensor) string {
	t.Helper()
	dir := t.TempDir()
	if err := m.Save(dir, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "model.safetensors")
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	linear := map[string]bool{}
	for _, l := range m.linearLayers() {
		linear[l.Name+".weight"] = true
	}
	var out []safetensors.Tensor
	for _, n := range f.Names() {
		info, _ := f.Tensor(n)
		if !linear[n] {
			out = append(out, safetensors.Tensor{Name: n, DType: info.DType, Shape: info.Shape, Data: append([]byte(nil), info.Data...)})
			continue
		}
		v, err := safetensors.ToFloat32(info)
		if err != nil {
			t.Fatal(err)
		}
		w, err := quant.QuantizeNF4(v, info.Shape, quant.Options{DoubleQuant: nested})
		if err != nil {
			t.Fatal(err)
		}
		ts, err := w.BitsandbytesTensors(n, "bfloat16")
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ts...)
	}
	f.Close()
	if edit != nil {
		out = edit(out)
	}
	if err := safetensors.Save(path, out, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["quantization_config"] = map[string]any{"quant_method": "bitsandbytes", "load_in_4bit": true, "load_in_8bit": false,
		"bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": nested, "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_storage": "uint8"}
	raw, _ = json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestLoadBitsandbytesCheckpoint: a checkpoint in bitsandbytes' 4-bit layout loads with its
// linears in NF4 and no full-precision copy of them, and computes exactly the loss of the
// original model quantised in memory; damaged checkpoints are refused with the tensor named.
func TestLoadBitsandbytesCheckpoint(t *testing.T) {
	for _, nested := range []bool{false, true} {
		b := newCPU()
		m, err := New(tinyConfig(t, "qwen3"), b, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if err := m.InitRandom(21); err != nil {
			t.Fatal(err)
		}
		perturb(t, m, 21)
		dir := writeBitsandbytesCheckpoint(t, m, nested, nil)
		mq, err := Load(dir, b, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer mq.Close()
		if ok, _, _ := mq.Quantized(); !ok || len(mq.QuantizedNames()) != 7*mq.Arch.Layers {
			t.Fatalf("loaded %d NF4 weights, want the 7 linears of %d layers", len(mq.QuantizedNames()), mq.Arch.Layers)
		}
		if len(mq.Unused) != 0 {
			t.Errorf("unused tensors %v: the quantisation state belongs to the NF4 weights", mq.Unused)
		}
		if mq.NumParams() != m.NumParams() || mq.Params.Flat.Numel() >= m.Params.Flat.Numel() {
			t.Errorf("NumParams %d (want %d), arena %d elements (want fewer than %d)", mq.NumParams(), m.NumParams(), mq.Params.Flat.Numel(), m.Params.Flat.Numel())
		}
		if err := m.QuantizeBase(quant.Config{LoadIn4bit: true, DoubleQuant: nested}); err != nil {
			t.Fatal(err)
		}
		batch := packedBatch(m.Arch.Vocab, []int{5, 3}, 9)
		l1, _, err := m.Forward(batch)
		if err != nil {
			t.Fatal(err)
		}
		l2, _, err := mq.Forward(batch)
		if err != nil {
			t.Fatal(err)
		}
		if l1 != l2 {
			t.Fatalf("nested=%v: loss %v from the 4-bit checkpoint, %v from the model quantised in memory", nested, l2, l1)
		}
		if err := mq.EnableGrads(); err == nil || !strings.Contains(err.Error(), "use_peft") {
			t.Errorf("EnableGrads on a 4-bit base: %v", err)
		}
	}
	b := newCPU()
	m, err := New(tinyConfig(t, "qwen3"), b, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	const victim = "model.layers.1.mlp.up_proj.weight"
	for _, tc := range []struct {
		name string
		edit func([]safetensors.Tensor) []safetensors.Tensor
		want string
	}{
		{"fp4", func(ts []safetensors.Tensor) []safetensors.Tensor {
			for i := range ts {
				if ts[i].Name == victim+quant.SuffixQuantStateNF4 {
					ts[i].Name = victim + ".quant_state.bitsandbytes__fp4"
				}
			}
			return ts
		}, "fp4"},
		{"wrong shape", func(ts []safetensors.Tensor) []safetensors.Tensor {
			for i := range ts {
				if ts[i].Name == victim+quant.SuffixQuantStateNF4 {
					ts[i].Data = []byte(strings.Replace(string(ts[i].Data), `"shape":[48,32]`, `"shape":[32,48]`, 1))
					ts[i].Shape = []int{len(ts[i].Data)}
				}
			}
			return ts
		}, "config.json implies"},
	} {
		dir := writeBitsandbytesCheckpoint(t, m, true, tc.edit)
		if mq, err := Load(dir, b, Options{}); err == nil {
			mq.Close()
			t.Errorf("%s: the checkpoint loaded", tc.name)
		} else if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}
