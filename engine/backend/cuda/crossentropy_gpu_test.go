package cuda

import (
	"fmt"
	"math"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestGPUCrossEntropyScratch runs the loss of a frozen bf16 head (the LoRA and QLoRA case:
// DHidden, no DWeight) at Qwen3's vocabulary over 4096 tokens, and checks that the op holds no
// more than backend.CrossEntropyScratch of its default chunks (768 rows: 0.65 GiB, against
// 4.6 GiB for the fp32 logits and their gradient unfused), and that its loss and dHidden equal
// those of one chunk of all 4096 rows (ChunkRows = N) within bf16 rounding.
func TestGPUCrossEntropyScratch(t *testing.T) {
	g := gpu(t)
	const N, C, V = 4096, 256, 151936
	h := randomTensor(t, g, 1, tensor.BF16, 1, N, C)
	w := randomTensor(t, g, 2, tensor.BF16, 0.05, V, C)
	ids := make([]int32, N)
	for i := range ids {
		ids[i] = int32((i*7919 + 13) % V)
		if i%11 == 5 {
			ids[i] = backend.IgnoreIndex
		}
	}
	tg, err := backend.FromInt32(g, ids, N)
	if err != nil {
		t.Fatal(err)
	}
	var loss, dh [2]tensor.Tensor
	for k := range loss {
		if loss[k], err = g.Alloc(tensor.F32, N); err != nil {
			t.Fatal(err)
		}
		if dh[k], err = g.Alloc(tensor.BF16, N, C); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for _, x := range []tensor.Tensor{h, w, tg, loss[0], loss[1], dh[0], dh[1]} {
			g.Free(x)
		}
	}()
	args := backend.CrossEntropyArgs{Hidden: h, Weight: w, Targets: tg, Loss: loss[0], DHidden: dh[0], GradScale: 1.0 / N}
	// The reference first: one chunk of all rows. It also makes the GEMM state (cuBLASLt's
	// workspace) before the measured call.
	one := args
	one.Loss, one.DHidden, one.ChunkRows = loss[1], dh[1], N
	if err := g.CrossEntropy(one); err != nil {
		t.Fatal(err)
	}
	if err := g.Sync(); err != nil {
		t.Fatal(err)
	}
	g.ResetPeak()
	base := g.MemStats().Allocated
	if err := g.CrossEntropy(args); err != nil {
		t.Fatal(err)
	}
	if err := g.Sync(); err != nil {
		t.Fatal(err)
	}
	scratch := g.MemStats().Peak - base
	rows := backend.CrossEntropyChunkRows(N, V, backend.CrossEntropyBudget(false, 0))
	want := backend.CrossEntropyScratch(rows, V, C, true, 2, false)
	unfused := int64(N) * V * 8
	t.Logf("frozen head, N=%d V=%d: %d-row chunks, scratch %.3f GiB (stated %.3f GiB; unfused fp32 logits and gradient %.2f GiB)",
		N, V, rows, float64(scratch)/(1<<30), float64(want)/(1<<30), float64(unfused)/(1<<30))
	report.addCheck("cross-entropy scratch of a frozen head is its chunk buffers", scratch <= want+8<<20,
		fmt.Sprintf("scratch %.3f GiB vs stated %.3f GiB", float64(scratch)/(1<<30), float64(want)/(1<<30)))
	if scratch > want+8<<20 {
		t.Errorf("the op held %d bytes of scratch; its %d-row chunks need %d", scratch, rows, want)
	}
	for _, c := range []struct {
		name string
		a, b tensor.Tensor
		tol  float64
	}{{"loss", loss[0], loss[1], 1e-4}, {"dHidden", dh[0], dh[1], 1e-2}} {
		x, err := backend.ToFloat32(g, c.a)
		if err != nil {
			t.Fatal(err)
		}
		y, err := backend.ToFloat32(g, c.b)
		if err != nil {
			t.Fatal(err)
		}
		var worst, scale float64
		for i := range x {
			worst = max(worst, math.Abs(float64(x[i]-y[i])))
			scale = max(scale, math.Abs(float64(y[i])))
		}
		if worst > c.tol*max(scale, 1e-6) {
			t.Errorf("%s: chunked and one-chunk differ by %g (largest |value| %g)", c.name, worst, scale)
		}
	}
}
