package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// gdInputs are the float inputs of a gated delta rule: q, k [N,KH,KD], v [N,VH,VD], beta and
// g [N,VH] (write strengths in (0, 1), log decays in (-1.5, 0)).
type gdInputs struct{ q, k, v, beta, g []float64 }

func newGDInputs(r *rand.Rand, n, kh, vh, kd, vd int) gdInputs {
	in := gdInputs{q: randn(r, n*kh*kd, 0.5), k: randn(r, n*kh*kd, 0.5), v: randn(r, n*vh*vd, 1)}
	for range n * vh {
		in.beta = append(in.beta, 0.05+0.9*r.Float64())
		in.g = append(in.g, -1.5*r.Float64())
	}
	return in
}

// runGD runs the forward and, with dout, the backward of the CPU op and returns out and the
// five gradients (nil without dout).
func runGD(t *testing.T, b *Backend, in gdInputs, cu []int32, kh, vh, kd, vd, chunk int, dout []float64) (out []float64, grads [5][]float64) {
	t.Helper()
	n := len(in.q) / (kh * kd)
	q, k, v := up(t, b, in.q, tensor.F32, n, kh, kd), up(t, b, in.k, tensor.F32, n, kh, kd), up(t, b, in.v, tensor.F32, n, vh, vd)
	beta, g := up(t, b, in.beta, tensor.F32, n, vh), up(t, b, in.g, tensor.F32, n, vh)
	cuT := upInts(t, b, cu, len(cu))
	o := zeros(t, b, tensor.F32, n, vh, vd)
	rows := (n + chunk - 1) / chunk
	states := zeros(t, b, tensor.F32, rows, vh, kd, vd)
	must(t, b.GatedDelta(backend.GatedDeltaArgs{Q: q, K: k, V: v, Beta: beta, G: g, CuSeqlens: cuT, Out: o, States: states,
		Chunk: chunk, KH: kh, VH: vh, KD: kd, VD: vd}))
	out = down(t, b, o)
	if dout == nil {
		return out, grads
	}
	dq, dk, dv := zeros(t, b, tensor.F32, n, kh, kd), zeros(t, b, tensor.F32, n, kh, kd), zeros(t, b, tensor.F32, n, vh, vd)
	db, dg := zeros(t, b, tensor.F32, n, vh), zeros(t, b, tensor.F32, n, vh)
	must(t, b.GatedDeltaBackward(backend.GatedDeltaBackwardArgs{Q: q, K: k, V: v, Beta: beta, G: g, CuSeqlens: cuT,
		States: states, DOut: up(t, b, dout, tensor.F32, n, vh, vd), DQ: dq, DK: dk, DV: dv, DBeta: db, DG: dg,
		Chunk: chunk, KH: kh, VH: vh, KD: kd, VD: vd}))
	for i, x := range []T{dq, dk, dv, db, dg} {
		grads[i] = down(t, b, x)
	}
	return out, grads
}

// TestGatedDeltaGradients checks the CPU GatedDeltaBackward against central differences of
// L = Σ Out·W through GatedDelta, for every input, over three documents (one of a single token)
// with value heads sharing key heads, restarting from kept states every 3 tokens; and that the
// backward does not depend on the stretch length (3 or one stretch per document); and the
// forward against the formula.
func TestGatedDeltaGradients(t *testing.T) {
	const kh, vh, kd, vd = 2, 4, 3, 5
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(3, 4))
	cu := []int32{0, 7, 8, 13}
	n := 13
	in := newGDInputs(r, n, kh, vh, kd, vd)
	w := randn(r, n*vh*vd, 1)
	_, grads := runGD(t, b, in, cu, kh, vh, kd, vd, 3, w)
	loss := func(in gdInputs) float64 {
		out, _ := runGD(t, b, in, cu, kh, vh, kd, vd, 3, nil)
		s := 0.0
		for i := range out {
			s += out[i] * w[i]
		}
		return s
	}
	const eps = 1e-2
	for gi, name := range []string{"dq", "dk", "dv", "dbeta", "dg"} {
		fd := make([]float64, len(grads[gi]))
		for i := range fd {
			fields := []*[]float64{&in.q, &in.k, &in.v, &in.beta, &in.g}
			x := *fields[gi]
			orig := x[i]
			x[i] = orig + eps
			lp := loss(in)
			x[i] = orig - eps
			lm := loss(in)
			x[i] = orig
			fd[i] = (lp - lm) / (2 * eps)
		}
		approx(t, name, grads[gi], fd, 2e-3, 1e-2)
	}
	_, whole := runGD(t, b, in, cu, kh, vh, kd, vd, 64, w)
	for gi, name := range []string{"dq", "dk", "dv", "dbeta", "dg"} {
		approx(t, name+" (one stretch)", whole[gi], grads[gi], 1e-5, 1e-5)
	}
	// The forward against the formula written out here with explicit matrices, per document
	// and value head: Ŝ = e^g·S, S = Ŝ + k·(β(v - Ŝᵀk))ᵀ, out = Sᵀq.
	out, _ := runGD(t, b, in, cu, kh, vh, kd, vd, 3, nil)
	f := func(x []float64, i int) float64 { return float64(float32(x[i])) }
	for d := 0; d+1 < len(cu); d++ {
		for h := range vh {
			g := h / (vh / kh)
			var S [kd][vd]float64
			for t0 := int(cu[d]); t0 < int(cu[d+1]); t0++ {
				decay, beta := math.Exp(f(in.g, t0*vh+h)), f(in.beta, t0*vh+h)
				var mem [vd]float64
				for i := range kd {
					for j := range vd {
						S[i][j] *= decay
						mem[j] += S[i][j] * f(in.k, (t0*kh+g)*kd+i)
					}
				}
				for i := range kd {
					for j := range vd {
						S[i][j] += f(in.k, (t0*kh+g)*kd+i) * beta * (f(in.v, (t0*vh+h)*vd+j) - mem[j])
					}
				}
				for j := range vd {
					want := 0.0
					for i := range kd {
						want += S[i][j] * f(in.q, (t0*kh+g)*kd+i)
					}
					if got := out[(t0*vh+h)*vd+j]; math.Abs(got-want) > 1e-5*(1+math.Abs(want)) {
						t.Errorf("token %d head %d column %d: out %g, want %g", t0, h, j, got, want)
					}
				}
			}
		}
	}
}
