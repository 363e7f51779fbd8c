package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// refGeGLU is gelu_tanh(g) * u in float64, written from the formula.
func refGeGLU(g, u []float64) []float64 {
	out := make([]float64, len(g))
	for i, x := range g {
		out[i] = 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x))) * u[i]
	}
	return out
}

// TestGeGLUForwardBackward: the forward equals the formula and the backward equals its finite
// differences, over gates wide enough to reach both tails of the tanh.
func TestGeGLUForwardBackward(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(71, 72))
	for _, n := range []int{1, 7, 100} {
		g, u := randn(r, n, 3), randn(r, n, 1)
		G, U := up(t, b, g, tensor.F32, n), up(t, b, u, tensor.F32, n)
		out := zeros(t, b, tensor.F32, n)
		must(t, b.GeGLU(out, G, U))
		approx(t, "out", down(t, b, out), refGeGLU(g, u), 1e-6, 1e-5)
		d := randn(r, n, 1)
		dG, dU := zeros(t, b, tensor.F32, n), zeros(t, b, tensor.F32, n)
		must(t, b.GeGLUBackward(dG, dU, up(t, b, d, tensor.F32, n), G, U))
		f := func(in [][]float64) []float64 { return refGeGLU(in[0], in[1]) }
		approx(t, "dGate", down(t, b, dG), fdGrad(f, [][]float64{g, u}, d, 0), 1e-5, 1e-4)
		approx(t, "dUp", down(t, b, dU), fdGrad(f, [][]float64{g, u}, d, 1), 1e-5, 1e-4)
		// in place, as the MLP calls it: dGate over gate and dUp over up
		must(t, b.GeGLUBackward(G, U, up(t, b, d, tensor.F32, n), G, U))
		approx(t, "dGate in place", down(t, b, G), down(t, b, dG), 0, 0)
		approx(t, "dUp in place", down(t, b, U), down(t, b, dU), 0, 0)
	}
}

// TestGeGLUKnownValues pins gelu_tanh at hand-computed points: gelu_tanh(0) = 0, gelu_tanh(1) =
// 0.5 * (1 + tanh(0.7978845608 * 1.044715)) = 0.841191990, gelu_tanh(-3) = -0.00363739.
func TestGeGLUKnownValues(t *testing.T) {
	b := newTestBackend(t)
	g := []float64{0, 1, -3}
	out := zeros(t, b, tensor.F32, 3)
	must(t, b.GeGLU(out, up(t, b, g, tensor.F32, 3), up(t, b, []float64{5, 1, 1}, tensor.F32, 3)))
	approx(t, "gelu_tanh", down(t, b, out), []float64{0, 0.841191990, -0.0036373921}, 1e-7, 1e-6)
}

// refCECapped is refCE with the logits capped: cap * tanh(logit / cap).
func refCECapped(h, w []float64, tg []int32, n, c, v int, capv float64) []float64 {
	loss := make([]float64, n)
	for i := 0; i < n; i++ {
		if tg[i] == backend.IgnoreIndex {
			continue
		}
		lg := make([]float64, v)
		m := math.Inf(-1)
		for j := 0; j < v; j++ {
			for p := 0; p < c; p++ {
				lg[j] += h[i*c+p] * w[j*c+p]
			}
			lg[j] = capv * math.Tanh(lg[j]/capv)
			m = math.Max(m, lg[j])
		}
		var s float64
		for _, x := range lg {
			s += math.Exp(x - m)
		}
		loss[i] = -(lg[tg[i]] - m - math.Log(s))
	}
	return loss
}

// TestCrossEntropySoftcap: with Softcap the loss is that of the capped logits and both
// gradients equal finite differences of it; caps small enough to bend the logits are used.
func TestCrossEntropySoftcap(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(73, 74))
	for _, tc := range []struct {
		n, c, v, chunk int
		capv           float32
		tg             []int32
	}{
		{3, 4, 9, 0, 2, []int32{0, 8, 3}},
		{6, 5, 17, 4, 1.5, []int32{16, -100, 2, 3, 0, 5}},
		{4, 3, 7, 1, 30, []int32{1, 2, -100, 6}},
	} {
		t.Run(fmt.Sprintf("n%d_v%d_cap%g", tc.n, tc.v, tc.capv), func(t *testing.T) {
			h, w := randn(r, tc.n*tc.c, 1.5), randn(r, tc.v*tc.c, 1.5)
			H, W := up(t, b, h, tensor.F32, tc.n, tc.c), up(t, b, w, tensor.F32, tc.v, tc.c)
			loss := zeros(t, b, tensor.F32, tc.n)
			dH, dW := zeros(t, b, tensor.F32, tc.n, tc.c), zeros(t, b, tensor.F32, tc.v, tc.c)
			must(t, b.CrossEntropy(backend.CrossEntropyArgs{Hidden: H, Weight: W, Targets: upInts(t, b, tc.tg, tc.n),
				Loss: loss, DHidden: dH, DWeight: dW, GradScale: 0.5, ChunkRows: tc.chunk, Softcap: tc.capv}))
			f := func(in [][]float64) []float64 {
				return refCECapped(in[0], in[1], tc.tg, tc.n, tc.c, tc.v, float64(tc.capv))
			}
			approx(t, "loss", down(t, b, loss), f([][]float64{h, w}), 1e-5, 1e-5)
			g := make([]float64, tc.n)
			for i := range g {
				g[i] = 0.5
			}
			approx(t, "dHidden", down(t, b, dH), fdGrad(f, [][]float64{h, w}, g, 0), 1e-5, 1e-4)
			approx(t, "dWeight", down(t, b, dW), fdGrad(f, [][]float64{h, w}, g, 1), 1e-5, 1e-4)
			uncapped := zeros(t, b, tensor.F32, tc.n)
			must(t, b.CrossEntropy(backend.CrossEntropyArgs{Hidden: H, Weight: W, Targets: upInts(t, b, tc.tg, tc.n), Loss: uncapped}))
			if tc.capv < 3 && maxAbsDiff(down(t, b, uncapped), down(t, b, loss)) < 1e-3 {
				t.Fatal("a cap of 2 left the loss as it was without a cap")
			}
		})
	}
	H, W := zeros(t, b, tensor.F32, 1, 2), zeros(t, b, tensor.F32, 3, 2)
	err := b.CrossEntropy(backend.CrossEntropyArgs{Hidden: H, Weight: W, Targets: upInts(t, b, []int32{1}, 1), Softcap: -1})
	if err == nil || !strings.Contains(err.Error(), "Softcap") {
		t.Fatalf("Softcap -1: error = %v, want one naming Softcap", err)
	}
}

func maxAbsDiff(a, b []float64) float64 {
	m := 0.0
	for i := range a {
		m = math.Max(m, math.Abs(a[i]-b[i]))
	}
	return m
}
