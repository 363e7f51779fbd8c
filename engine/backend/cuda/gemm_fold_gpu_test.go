package cuda

import (
	"fmt"
	"math"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestGPUGemmSplitKMatchesOracle runs weight gradients whose output is a handful of tiles and
// whose K (tokens) is long, so gemmSplitK cuts them into slices, against the CPU: dW accumulates
// (+=) into bf16 and fp32 gradients, and with split-K turned off the same cases give the same
// answer to the same tolerance. A K that cannot be cut evenly stays whole.
func TestGPUGemmSplitKMatchesOracle(t *testing.T) {
	g := gpu(t)
	defer func(v bool) { g.noSplitK = v }(g.noSplitK)
	for _, s := range []struct{ M, O, I, wantSplit int }{
		{8192, 96, 136, 8},  // 1 x 2 tiles: cut into 8 slices of 1024 rows
		{4096, 200, 264, 4}, // 2 x 3 tiles, 4 slices of 1024
		{4100, 64, 64, 1},   // 4100/2 = 2050 rows is not a multiple of 8: whole
	} {
		if got := gemmSplitK(s.O, s.I, s.M, true, false, g.d.info.SMs); got != s.wantSplit {
			t.Fatalf("gemmSplitK(%d, %d, %d) on %d SMs = %d, want %d", s.O, s.I, s.M, g.d.info.SMs, got, s.wantSplit)
		}
		for _, dwType := range []tensor.DType{tensor.BF16, tensor.F32} {
			abs, rel := 1e-4, 1e-4
			if dwType == tensor.BF16 {
				abs, rel = 2e-3, 2*bf16Eps
			}
			for _, off := range []bool{false, true} {
				c := opCase{
					Name:   fmt.Sprintf("linear_dw/%s/M%d_O%d_I%d/splitk_off=%v", dwType, s.M, s.O, s.I, off),
					Inputs: fmt.Sprintf("linear_dw/%s/M%d_O%d_I%d", dwType, s.M, s.O, s.I),
					Tensors: []tspec{
						{Name: "x", DType: tensor.BF16, Shape: []int{s.M, s.I}, Gen: gen{Scale: 1}},
						{Name: "dy", DType: tensor.BF16, Shape: []int{s.M, s.O}, Gen: gen{Scale: 1}},
						{Name: "w", DType: tensor.BF16, Shape: []int{s.O, s.I}, Gen: gen{Scale: 0.05}},
						{Name: "dw", DType: dwType, Shape: []int{s.O, s.I}, Gen: gen{Scale: 30}, Out: true, AbsFrac: abs, Rel: rel},
					},
					Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
						return be.LinearBackward(backend.LinearBackwardArgs{DW: ts["dw"], DY: ts["dy"], X: ts["x"], W: ts["w"]})
					},
				}
				g.noSplitK = off
				t.Run(c.Name, func(t *testing.T) { runCase(t, g, c) })
			}
		}
	}
}

// nearestBF16 is the bf16 value nearest x, found in float64 (no double rounding through fp32).
func nearestBF16(x float64) float32 {
	bits := math.Float32bits(float32(x)) &^ 0xffff
	lo := math.Float32frombits(bits)
	hi := math.Float32frombits(bits + 0x10000)
	if math.Abs(float64(lo)-x) <= math.Abs(float64(hi)-x) {
		return lo
	}
	return hi
}

// TestGPUGemmBetaRoundsOnce checks the contract of an accumulating GEMM into bf16: C = C + A·B
// is rounded to bf16 once. The exact answer is computed on the host in float64 and rounded
// once; with one rounding on the GPU nearly every element equals it (the GPU's fp32 sums differ
// from float64 by ~1e-7 relative, which moves a result across a bf16 rounding boundary about
// once in 10^4), while rounding the product to bf16 before adding C changes about one element in
// four. The folded form (fp32 product, then ew_fold_parts; HALO_CUDA_GEMM_BETA=fold) must meet
// it; the direct form (cuBLASLt adds Beta·C itself, the default) is measured and reported: on
// the H200 with CUDA 13 it matched 69% of elements (gpu-run15), the rounding of a product to
// bf16 before the sum, which the backend contract allows for accumulating outputs. It must stay
// within one bf16 rounding of the exact sum.
func TestGPUGemmBetaRoundsOnce(t *testing.T) {
	g := gpu(t)
	defer func(v bool) { g.gemmFoldBeta = v }(g.gemmFoldBeta)
	const M, I, O = 256, 512, 1024 // dX[M, I] += dY[M, O] · W[O, I]
	dy := randomTensor(t, g, 11, tensor.BF16, 1, M, O)
	w := randomTensor(t, g, 12, tensor.BF16, 0.05, O, I)
	dx0 := randomTensor(t, g, 13, tensor.BF16, 1, M, I)
	hdy, _ := backend.ToFloat32(g, dy)
	hw, _ := backend.ToFloat32(g, w)
	hdx0, _ := backend.ToFloat32(g, dx0)
	want := make([]float32, M*I)
	exact, prod := make([]float64, M*I), make([]float64, M*I)
	for m := range M {
		for i := range I {
			p := 0.0
			for o := range O {
				p += float64(hdy[m*O+o]) * float64(hw[o*I+i])
			}
			k := m*I + i
			prod[k], exact[k] = p, float64(hdx0[k])+p
			want[k] = nearestBF16(exact[k])
		}
	}
	fractions, worst := map[bool]float64{}, map[bool]float64{}
	for _, direct := range []bool{false, true} {
		g.gemmFoldBeta = !direct
		dx, err := g.Alloc(tensor.BF16, M, I)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Copy(dx, dx0); err != nil {
			t.Fatal(err)
		}
		if err := g.LinearBackward(backend.LinearBackwardArgs{DX: dx, DY: dy, W: w, AccumulateDX: true}); err != nil {
			t.Fatal(err)
		}
		got, err := backend.ToFloat32(g, dx)
		if err != nil {
			t.Fatal(err)
		}
		g.Free(dx)
		same := 0
		for k := range got {
			if got[k] == want[k] {
				same++
			}
			// One rounding of the product and one of the sum: half a bf16 step of each, taken
			// as a full step (the sum of the rounded product may sit in the next binade), and a
			// margin for the GPU's fp32 sums.
			bound := bf16Step(prod[k]) + bf16Step(exact[k]) + 1e-5*math.Abs(prod[k])
			worst[direct] = max(worst[direct], math.Abs(float64(got[k])-exact[k])/bound)
		}
		fractions[direct] = float64(same) / float64(len(got))
		t.Logf("direct=%v: %d of %d elements (%.4f) equal the once-rounded exact sum; worst error %.2f of the bound for two roundings", direct, same, len(got), fractions[direct], worst[direct])
	}
	report.addBench(benchmark{Name: "gemm_beta_bf16_rounding", Values: map[string]float64{
		"folded_exact_fraction": fractions[false], "direct_exact_fraction": fractions[true]},
		Note: fmt.Sprintf("dX[%d,%d] += dY·W (K=%d), bf16: fraction of elements equal to the float64 sum rounded once to bf16", M, I, O)})
	if fractions[false] < 0.97 {
		t.Fatalf("folded accumulate: only %.4f of elements equal the once-rounded sum (want >= 0.97)", fractions[false])
	}
	if worst[true] > 1 {
		t.Fatalf("direct accumulate: an error is %.2f times the bound for rounding the product and then the sum to bf16", worst[true])
	}
}

// bf16Step is the spacing of bf16 values at |x| (8 significant bits).
func bf16Step(x float64) float64 {
	if x == 0 {
		return math.SmallestNonzeroFloat32
	}
	_, e := math.Frexp(math.Abs(x)) // |x| = f * 2^e, f in [0.5, 1)
	return math.Ldexp(1, e-8)
}
