package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// refClamped is gpt-oss's _apply_gate written out: gate = gu[..., ::2] clamped above, up =
// gu[..., 1::2] clamped both ways, (up + 1) * gate * sigmoid(alpha * gate).
func refClamped(gu []float64, alpha, limit float64) []float64 {
	out := make([]float64, len(gu)/2)
	for k := range out {
		g, u := math.Min(gu[2*k], limit), math.Max(-limit, math.Min(gu[2*k+1], limit))
		out[k] = (u + 1) * g / (1 + math.Exp(-alpha*g))
	}
	return out
}

// TestSwiGLUClamped: forward equals the definition; backward equals finite differences on
// inputs away from the clamp edges and is exactly zero where a clamp holds; in place works.
func TestSwiGLUClamped(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(91, 92))
	const rows, w = 5, 7
	const alpha, limit = 1.702, 2.0
	gu := randn(r, rows*2*w, 2.5)
	for k := range gu { // keep finite differences off the clamp edges
		if d := math.Abs(math.Abs(gu[k]) - limit); d < 1e-3 {
			gu[k] += 0.01
		}
	}
	GU := up(t, b, gu, tensor.F32, rows, 2*w)
	out := zeros(t, b, tensor.F32, rows, w)
	must(t, b.SwiGLUClamped(out, GU, alpha, limit))
	approx(t, "out", down(t, b, out), refClamped(gu, alpha, limit), 1e-6, 1e-5)
	d := randn(r, rows*w, 1)
	dGU := zeros(t, b, tensor.F32, rows, 2*w)
	must(t, b.SwiGLUClampedBackward(dGU, up(t, b, d, tensor.F32, rows, w), GU, alpha, limit))
	f := func(in [][]float64) []float64 { return refClamped(in[0], alpha, limit) }
	got := down(t, b, dGU)
	approx(t, "dGateUp", got, fdGrad(f, [][]float64{gu}, d, 0), 1e-5, 1e-4)
	clamped := 0
	for k := 0; k < rows*w; k++ {
		if gu[2*k] > limit {
			clamped++
			if got[2*k] != 0 {
				t.Errorf("gate %g above the limit got gradient %g", gu[2*k], got[2*k])
			}
		}
		if math.Abs(gu[2*k+1]) > limit {
			clamped++
			if got[2*k+1] != 0 {
				t.Errorf("up %g outside the limits got gradient %g", gu[2*k+1], got[2*k+1])
			}
		}
	}
	if clamped == 0 {
		t.Fatal("no input reached a clamp: the case does not exercise them")
	}
	must(t, b.SwiGLUClampedBackward(GU, up(t, b, d, tensor.F32, rows, w), GU, alpha, limit))
	approx(t, "in place", down(t, b, GU), got, 0, 0)
}
