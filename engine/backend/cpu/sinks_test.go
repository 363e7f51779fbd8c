package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// refSinkAttention is gpt-oss's attention written out: causal (windowed) GQA over packed
// documents whose softmax also spans one sink logit per head that carries no value.
func refSinkAttention(q, k, v, sinks []float64, cu []int32, nh, nkv, hd, window int, scale float64) (out, lse []float64) {
	n := int(cu[len(cu)-1])
	out, lse = make([]float64, n*nh*hd), make([]float64, n*nh)
	for d := 0; d+1 < len(cu); d++ {
		for i := int(cu[d]); i < int(cu[d+1]); i++ {
			for h := 0; h < nh; h++ {
				kh := h / (nh / nkv)
				lo := int(cu[d])
				if window > 0 {
					lo = max(lo, i-window+1)
				}
				var sc []float64
				m := sinks[h]
				for j := lo; j <= i; j++ {
					s := 0.0
					for x := 0; x < hd; x++ {
						s += q[(i*nh+h)*hd+x] * k[(j*nkv+kh)*hd+x]
					}
					sc = append(sc, s*scale)
					m = math.Max(m, s*scale)
				}
				z := math.Exp(sinks[h] - m)
				for _, s := range sc {
					z += math.Exp(s - m)
				}
				lse[i*nh+h] = m + math.Log(z)
				for jj, s := range sc {
					p := math.Exp(s-m) / z
					for x := 0; x < hd; x++ {
						out[(i*nh+h)*hd+x] += p * v[((lo+jj)*nkv+kh)*hd+x]
					}
				}
			}
		}
	}
	return out, lse
}

// TestAttentionSinks: Attention followed by AttentionSinks equals the reference softmax with
// sinks (outputs and log-sum-exp), and AttentionBackward on the folded Out and LSE plus
// AttentionSinksBackward give finite-difference gradients for q, k, v and the sinks, over two
// documents with a window.
func TestAttentionSinks(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(81, 82))
	const nh, nkv, hd, window = 4, 2, 3, 4
	cu := []int32{0, 3, 9}
	n := int(cu[len(cu)-1])
	scale := float64(float32(1 / math.Sqrt(hd)))
	q, k, v := randn(r, n*nh*hd, 1), randn(r, n*nkv*hd, 1), randn(r, n*nkv*hd, 1)
	sinks := randn(r, nh, 1.5)
	sinks[0] = 4 // one sink that dominates the softmax
	shape := backend.AttentionShape{CuSeqlens: upInts(t, b, cu, len(cu)), NH: nh, NKV: nkv, HD: hd, Window: window}
	Q, K, V := up(t, b, q, tensor.F32, n, nh*hd), up(t, b, k, tensor.F32, n, nkv*hd), up(t, b, v, tensor.F32, n, nkv*hd)
	S := up(t, b, sinks, tensor.F32, nh)
	out, lse := zeros(t, b, tensor.F32, n, nh*hd), zeros(t, b, tensor.F32, n, nh)
	must(t, b.Attention(backend.AttentionArgs{AttentionShape: shape, Out: out, LSE: lse, Q: Q, K: K, V: V}))
	must(t, b.AttentionSinks(out, lse, S))
	wantOut, wantLSE := refSinkAttention(q, k, v, sinks, cu, nh, nkv, hd, window, scale)
	approx(t, "out", down(t, b, out), wantOut, 1e-6, 1e-5)
	approx(t, "lse", down(t, b, lse), wantLSE, 1e-6, 1e-5)

	dy := randn(r, n*nh*hd, 1)
	dY := up(t, b, dy, tensor.F32, n, nh*hd)
	dQ, dK, dV := zeros(t, b, tensor.F32, n, nh*hd), zeros(t, b, tensor.F32, n, nkv*hd), zeros(t, b, tensor.F32, n, nkv*hd)
	must(t, b.AttentionBackward(backend.AttentionBackwardArgs{AttentionShape: shape, DQ: dQ, DK: dK, DV: dV, DOut: dY,
		Q: Q, K: K, V: V, Out: out, LSE: lse}))
	ds0 := randn(r, nh, 1)
	dS := up(t, b, ds0, tensor.F32, nh)
	must(t, b.AttentionSinksBackward(dS, dY, out, lse, S))
	f := func(in [][]float64) []float64 {
		o, _ := refSinkAttention(in[0], in[1], in[2], in[3], cu, nh, nkv, hd, window, scale)
		return o
	}
	in := [][]float64{q, k, v, sinks}
	approx(t, "dQ", down(t, b, dQ), fdGrad(f, in, dy, 0), 1e-5, 1e-4)
	approx(t, "dK", down(t, b, dK), fdGrad(f, in, dy, 1), 1e-5, 1e-4)
	approx(t, "dV", down(t, b, dV), fdGrad(f, in, dy, 2), 1e-5, 1e-4)
	want := fdGrad(f, in, dy, 3)
	for h := range want {
		want[h] += ds0[h] // +=
	}
	approx(t, "dSinks (+=)", down(t, b, dS), want, 1e-5, 1e-4)
}

// TestAttentionSinksRejectsBadShapes: an LSE that is not [N, NH] for the sinks is refused.
func TestAttentionSinksRejectsBadShapes(t *testing.T) {
	b := newTestBackend(t)
	out, lse := zeros(t, b, tensor.F32, 3, 8), zeros(t, b, tensor.F32, 7)
	if err := b.AttentionSinks(out, lse, zeros(t, b, tensor.F32, 2)); err == nil {
		t.Fatal("LSE of 7 entries for 2 sinks was accepted")
	}
}
