package cuda

import (
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestGPUAdamWThroughput measures the fused AdamW's bandwidth on bf16 weights, gradients and
// moments (the bench's adamw_bf16_nearest layout), over one large tensor and over the same
// elements cut into expert-sized tensors of Qwen3-30B-A3B (2048 x 768, one launch each), against
// a device-to-device copy of the same bytes timed in the same test. It reports figures and
// fails only when an update errs: the gap between the two AdamW figures is the per-launch cost
// an optimizer over many expert tensors pays.
func TestGPUAdamWThroughput(t *testing.T) {
	g := gpu(t)
	const per, pieces = 2048 * 768, 96
	const n = per * pieces
	alloc := func(dt tensor.DType, v float32) tensor.Tensor {
		x, err := g.Alloc(dt, n)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Fill(x, v); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Free(x) })
		return x
	}
	p, gr, m, v := alloc(tensor.BF16, 0.5), alloc(tensor.BF16, 1e-3), alloc(tensor.BF16, 0), alloc(tensor.BF16, 0)
	args := func(lo, hi int, step int) backend.AdamWArgs {
		view := func(x tensor.Tensor) tensor.Tensor {
			s, err := x.View(lo, hi-lo)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		return backend.AdamWArgs{Param: view(p), Grad: view(gr), M: view(m), V: view(v), LR: 1e-4, Beta1: 0.9,
			Beta2: 0.95, Eps: 1e-8, GradScale: 1, Step: step}
	}
	step := 0
	whole := timeIt(t, g, 5, func() error { step++; return g.AdamW(args(0, n, step)) })
	split := timeIt(t, g, 5, func() error {
		step++
		for i := range pieces {
			if err := g.AdamW(args(i*per, (i+1)*per, step)); err != nil {
				return err
			}
		}
		return nil
	})
	bytes := float64(backend.AdamWCost(args(0, n, 1)).Bytes)
	src, dst := alloc(tensor.BF16, 1), alloc(tensor.BF16, 0)
	cp := timeIt(t, g, 5, func() error { return g.Copy(dst, src) })
	cpBytes := float64(2 * 2 * n)
	t.Logf("AdamW bf16, %d elements: one launch %.3f ms %.0f GB/s; %d launches of %d: %.3f ms %.0f GB/s; copy %.0f GB/s",
		n, whole, bytes/(whole*1e-3)/1e9, pieces, per, split, bytes/(split*1e-3)/1e9, cpBytes/(cp*1e-3)/1e9)
}
