package models

import (
	"testing"

	"github.com/halo-shell/halo-shell/engine/quant"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestQuantizeOnLoad: Load with QuantizeOnLoad stores the same NF4 weights as Load followed by
// QuantizeBase (same loss to the bit, from f32 and bf16 checkpoints into f32 and bf16 models,
// nested or not), and the device never holds the full-precision linears: its peak stays below
// the plain load's. A Qwen3-MoE model quantises its attention projections only (its MLPs are
// routed experts).
func TestQuantizeOnLoad(t *testing.T) {
	for _, tc := range []struct {
		family string
		saved  tensor.DType // the checkpoint's dtype
		dt     tensor.DType
		nested bool
		want   int // NF4 weights per layer
	}{
		{"qwen3", tensor.F32, tensor.F32, true, 7},
		{"qwen3", tensor.F32, tensor.BF16, false, 7},
		{"qwen3", tensor.BF16, tensor.BF16, true, 7},
		{"llama", tensor.BF16, tensor.BF16, true, 7},
		{"qwen3_moe", tensor.F32, tensor.BF16, true, 4},
	} {
		src, err := New(tinyConfig(t, tc.family), newCPU(), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := src.InitRandom(31); err != nil {
			t.Fatal(err)
		}
		perturb(t, src, 31)
		dir := t.TempDir()
		if err := src.Save(dir, SaveOptions{DType: tc.saved}); err != nil {
			t.Fatal(err)
		}
		src.Close()
		qc := quant.Config{LoadIn4bit: true, DoubleQuant: tc.nested}

		bAfter := newCPU()
		after, err := Load(dir, bAfter, Options{DType: tc.dt})
		if err != nil {
			t.Fatal(err)
		}
		if err := after.QuantizeBase(qc); err != nil {
			t.Fatal(err)
		}
		bOn := newCPU()
		on, err := Load(dir, bOn, Options{DType: tc.dt, QuantizeOnLoad: &qc})
		if err != nil {
			t.Fatal(err)
		}
		names := on.QuantizedNames()
		if len(names) != tc.want*on.Arch.Layers || len(names) != len(after.QuantizedNames()) {
			t.Fatalf("%s %s: quantised on load %v, after load %v; want %d per layer", tc.family, tc.dt, names, after.QuantizedNames(), tc.want)
		}
		if len(on.Unused) != 0 {
			t.Errorf("%s: unused tensors %v: the quantised weights were read", tc.family, on.Unused)
		}
		batch := packedBatch(on.Arch.Vocab, []int{5, 3}, 9)
		l1, _, err := after.Forward(batch)
		if err != nil {
			t.Fatal(err)
		}
		l2, _, err := on.Forward(batch)
		if err != nil {
			t.Fatal(err)
		}
		if l1 != l2 {
			t.Errorf("%s %s nested=%v: loss %v quantised on load, %v quantised after", tc.family, tc.dt, tc.nested, l2, l1)
		}
		if pOn, pAfter := bOn.MemStats().Peak, bAfter.MemStats().Peak; pOn >= pAfter {
			t.Errorf("%s %s: peak %d bytes quantising on load, %d after: the full-precision linears reached the device", tc.family, tc.dt, pOn, pAfter)
		}
		after.Close()
		on.Close()
	}
}
