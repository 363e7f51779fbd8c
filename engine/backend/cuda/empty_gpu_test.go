package cuda

import (
	"math"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestGPUEmptyUnclearedMatchesAlloc runs forward+backward of a small qwen3 with Empty zero-filled
// (HALO_CUDA_EMPTY=cleared) and uncleared (the default): the loss and every gradient agree
// bit for bit, so no kernel leaves part of an output it writes with "=" unwritten. Between the
// two runs the activations' blocks are filled with NaN and freed, so that an uncleared Empty
// hands back NaN wherever a kernel skips elements.
func TestGPUEmptyUnclearedMatchesAlloc(t *testing.T) {
	g := gpu(t)
	defer func(v bool) { g.emptyUncleared = v }(g.emptyUncleared)
	m := qwen3Model(t, g, qwen3JSON(256, 768, 4, 4, 2, 64, 4000), 5)
	defer m.Close()
	const B, T = 2, 300
	batch := packedBatch(B, T, 4000)
	run := func(uncleared bool) (float64, []float32) {
		g.emptyUncleared = uncleared
		if err := m.ZeroGrads(); err != nil {
			t.Fatal(err)
		}
		sum, cnt, err := m.ForwardBackward(batch, 1.0/float32(B*T))
		if err != nil {
			t.Fatal(err)
		}
		grads, err := backend.ToFloat32(g, m.Grads.Flat)
		if err != nil {
			t.Fatal(err)
		}
		return sum / float64(cnt), grads
	}
	lossA, gradsA := run(false)
	// Poison the cached blocks the activations will reuse.
	var junk []tensor.Tensor
	for _, n := range []int{B * T * 768, B * T * 256, B * T * 4 * 64, B * T * 2 * 64, B * T * 4} {
		for range 16 {
			x, err := g.Alloc(tensor.BF16, n)
			if err != nil {
				t.Fatal(err)
			}
			if err := g.Fill(x, float32(math.NaN())); err != nil {
				t.Fatal(err)
			}
			junk = append(junk, x)
		}
	}
	for _, x := range junk {
		g.Free(x)
	}
	lossB, gradsB := run(true)
	if lossA != lossB {
		t.Fatalf("loss %v with zero-filled Empty, %v uncleared", lossA, lossB)
	}
	for i := range gradsA {
		if gradsA[i] != gradsB[i] {
			t.Fatalf("gradient element %d: %v zero-filled, %v uncleared", i, gradsA[i], gradsB[i])
		}
	}
}
