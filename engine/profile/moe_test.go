package profile

import (
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestWrapRecordsMoEOps: the mixture-of-experts ops are reached through the wrapper and recorded
// with the classes that split the layer in the live profile (router, permute, combine; the packed
// SwiGLU as mlp_activation).
func TestWrapRecordsMoEOps(t *testing.T) {
	rec := NewRecorder()
	rec.Enable(true, true)
	b := Wrap(cpu.New(cpu.Options{Workers: 1}), rec)
	opt := b.Optional()
	const n, e, k, c = 4, 3, 2, 8
	s := n * k
	alloc := func(dt tensor.DType, shape ...int) T {
		x, err := b.Alloc(dt, shape...)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	r := backend.MoERouting{TopK: k, NormTopK: true}
	ra := backend.MoERouteArgs{MoERouting: r, Logits: mustF32(t, b, n, e), Probs: alloc(tensor.F32, n, e), Sel: alloc(tensor.I32, n, k), Weights: alloc(tensor.F32, n, k)}
	pa := backend.MoEPermuteArgs{E: e, Sel: ra.Sel, X: mustF32(t, b, n, c), Offsets: alloc(tensor.I32, e+1), Order: alloc(tensor.I32, s), Slot: alloc(tensor.I32, n, k), Xs: alloc(tensor.F32, s, c)}
	gu, act := mustF32(t, b, s, 2*c), alloc(tensor.F32, s, c)
	rec.BeginStep(1)
	calls := []struct {
		name, class string
		call        func() error
	}{
		{"MoERoute", ClassRouter, func() error { return opt.MoERoute(ra) }},
		{"MoEPermute", ClassPermute, func() error { return opt.MoEPermute(pa) }},
		{"SwiGLUPacked", ClassMLPActivation, func() error { return opt.SwiGLUPacked(act, gu) }},
		{"SwiGLUPackedBackward", ClassMLPActivation, func() error { return opt.SwiGLUPackedBackward(gu, act, gu) }},
		{"GeGLUPacked", ClassMLPActivation, func() error { return opt.GeGLUPacked(act, gu) }},
		{"GeGLUPackedBackward", ClassMLPActivation, func() error { return opt.GeGLUPackedBackward(gu, act, gu) }},
		{"MoECombine", ClassCombine, func() error {
			return opt.MoECombine(backend.MoECombineArgs{Ys: pa.Xs, Slot: pa.Slot, Weights: ra.Weights, Out: alloc(tensor.F32, n, c)})
		}},
		{"MoECombineBackward", ClassCombine, func() error {
			return opt.MoECombineBackward(backend.MoECombineBackwardArgs{DOut: pa.X, Ys: pa.Xs, Slot: pa.Slot, Weights: ra.Weights, DYs: alloc(tensor.F32, s, c), DWeights: alloc(tensor.F32, n, k)})
		}},
		{"MoEPermuteBackward", ClassPermute, func() error {
			return opt.MoEPermuteBackward(backend.MoEPermuteBackwardArgs{DXs: pa.Xs, Slot: pa.Slot, DX: alloc(tensor.F32, n, c)})
		}},
		{"MoERouteBackward", ClassRouter, func() error {
			return opt.MoERouteBackward(backend.MoERouteBackwardArgs{MoERouting: r, Probs: ra.Probs, Sel: ra.Sel, Weights: ra.Weights, DWeights: ra.Weights, DLogits: alloc(tensor.F32, n, e)})
		}},
	}
	for _, c := range calls {
		if err := c.call(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
	}
	st, ok := rec.EndStep()
	if !ok {
		t.Fatal("no step")
	}
	if len(st.Spans) != len(calls) {
		t.Fatalf("%d spans for %d calls", len(st.Spans), len(calls))
	}
	for i, c := range calls {
		if sp := st.Spans[i]; sp.Name != c.name || sp.Class != c.class || sp.Bytes <= 0 {
			t.Errorf("span %d = %s class %s bytes %d, want %s class %s with its bytes", i, sp.Name, sp.Class, sp.Bytes, c.name, c.class)
		}
	}
}
