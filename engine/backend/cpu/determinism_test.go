package cpu

import (
	"math/rand/v2"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestReductionsAreIdenticalForAnyWorkerCount runs the ops whose outputs are sums over many
// rows (parameter gradients, attention key gradients, loss) with 1, 2 and 5 workers and
// requires bit-identical results, so a resumed run matches an uninterrupted one on any machine
// size with the same kernels.
func TestReductionsAreIdenticalForAnyWorkerCount(t *testing.T) {
	r := rand.New(rand.NewPCG(80, 81))
	n, c, v, nh, nkv, hd := 150, 24, 37, 4, 2, 6
	x, w, g := randn(r, n*c, 1), randn(r, c, 1), randn(r, n*c, 1)
	q, k, vv := randn(r, n*nh*hd, 1), randn(r, n*nkv*hd, 1), randn(r, n*nkv*hd, 1)
	lm := randn(r, v*c, 1)
	tg := make([]int32, n)
	for i := range tg {
		tg[i] = int32(r.IntN(v))
	}
	cu := []int32{0, 70, 150}
	run := func(workers int) [][]float64 {
		b := New(Options{Workers: workers})
		defer b.Close()
		X, W := up(t, b, x, tensor.F32, n, c), up(t, b, w, tensor.F32, c)
		out, rstd := zeros(t, b, tensor.F32, n, c), zeros(t, b, tensor.F32, n)
		must(t, b.RMSNorm(out, rstd, X, W, 1e-6))
		dX, dW := zeros(t, b, tensor.F32, n, c), zeros(t, b, tensor.F32, c)
		must(t, b.RMSNormBackward(backend.RMSNormBackwardArgs{DX: dX, DW: dW, DY: up(t, b, g, tensor.F32, n, c), X: X, W: W, RStd: rstd}))
		sh := backend.AttentionShape{CuSeqlens: upInts(t, b, cu, 3), NH: nh, NKV: nkv, HD: hd}
		Q, K, V := up(t, b, q, tensor.F32, n, nh*hd), up(t, b, k, tensor.F32, n, nkv*hd), up(t, b, vv, tensor.F32, n, nkv*hd)
		O, L := zeros(t, b, tensor.F32, n, nh*hd), zeros(t, b, tensor.F32, n, nh)
		must(t, b.Attention(backend.AttentionArgs{AttentionShape: sh, Out: O, LSE: L, Q: Q, K: K, V: V}))
		dQ, dK, dV := zeros(t, b, tensor.F32, n, nh*hd), zeros(t, b, tensor.F32, n, nkv*hd), zeros(t, b, tensor.F32, n, nkv*hd)
		must(t, b.AttentionBackward(backend.AttentionBackwardArgs{AttentionShape: sh, DQ: dQ, DK: dK, DV: dV, DOut: Q, Q: Q, K: K, V: V, Out: O, LSE: L}))
		loss, dH, dLM := zeros(t, b, tensor.F32, n), zeros(t, b, tensor.F32, n, c), zeros(t, b, tensor.F32, v, c)
		must(t, b.CrossEntropy(backend.CrossEntropyArgs{Hidden: X, Weight: up(t, b, lm, tensor.F32, v, c), Targets: upInts(t, b, tg, n),
			Loss: loss, DHidden: dH, DWeight: dLM, GradScale: 1 / float32(n), ChunkRows: 64}))
		ss, err := b.SumSquares([]tensor.Tensor{dLM, dK})
		must(t, err)
		return [][]float64{down(t, b, dW), down(t, b, dX), down(t, b, O), down(t, b, dK), down(t, b, dV), down(t, b, loss), down(t, b, dLM), ss}
	}
	names := []string{"rmsnorm dW", "rmsnorm dX", "attention out", "attention dK", "attention dV", "loss", "lm head dW", "sum of squares"}
	ref := run(1)
	for _, w := range []int{2, 5} {
		got := run(w)
		for i := range ref {
			for j := range ref[i] {
				if got[i][j] != ref[i][j] {
					t.Fatalf("%d workers: %s[%d] = %v, with 1 worker %v", w, names[i], j, got[i][j], ref[i][j])
				}
			}
		}
	}
}
