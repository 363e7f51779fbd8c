package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// refAttentionBackward is the analytic float64 gradient of refAttention for upstream gO.
func refAttentionBackward(q, k, v, gO []float64, cu []int32, nh, nkv, hd, window int, scale float64) (dq, dk, dv []float64) {
	dq, dk, dv = make([]float64, len(q)), make([]float64, len(k)), make([]float64, len(v))
	g := nh / nkv
	for d := 0; d+1 < len(cu); d++ {
		for i := int(cu[d]); i < int(cu[d+1]); i++ {
			for h := 0; h < nh; h++ {
				kv := h / g
				var js []int
				var ps []float64
				m := math.Inf(-1)
				for j := int(cu[d]); j <= i; j++ {
					if window > 0 && i-j >= window {
						continue
					}
					var s float64
					for e := 0; e < hd; e++ {
						s += q[i*nh*hd+h*hd+e] * k[j*nkv*hd+kv*hd+e]
					}
					js, ps = append(js, j), append(ps, s*scale)
					m = math.Max(m, s*scale)
				}
				var l float64
				for x := range ps {
					ps[x] = math.Exp(ps[x] - m)
					l += ps[x]
				}
				dps := make([]float64, len(js))
				var dsum float64
				for x, j := range js {
					ps[x] /= l
					for e := 0; e < hd; e++ {
						dps[x] += gO[i*nh*hd+h*hd+e] * v[j*nkv*hd+kv*hd+e]
						dv[j*nkv*hd+kv*hd+e] += ps[x] * gO[i*nh*hd+h*hd+e]
					}
					dsum += ps[x] * dps[x]
				}
				for x, j := range js {
					ds := ps[x] * (dps[x] - dsum) * scale
					for e := 0; e < hd; e++ {
						dq[i*nh*hd+h*hd+e] += ds * k[j*nkv*hd+kv*hd+e]
						dk[j*nkv*hd+kv*hd+e] += ds * q[i*nh*hd+h*hd+e]
					}
				}
			}
		}
	}
	return dq, dk, dv
}

func TestAttentionMatchesReferenceOnLongDocuments(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(50, 51))
	for _, tc := range []struct {
		cu          []int32
		nh, nkv, hd int
		window      int
	}{
		{[]int32{0, 150, 211}, 4, 2, 16, 0},   // documents spanning several 64-row blocks
		{[]int32{0, 200}, 3, 1, 8, 37},        // sliding window across block boundaries
		{[]int32{0, 65, 66, 130}, 2, 2, 5, 0}, // odd head dim, one-token document
	} {
		t.Run(fmt.Sprintf("cu%v_w%d", tc.cu, tc.window), func(t *testing.T) {
			n := int(tc.cu[len(tc.cu)-1])
			q, k, v := randn(r, n*tc.nh*tc.hd, 1), randn(r, n*tc.nkv*tc.hd, 1), randn(r, n*tc.nkv*tc.hd, 1)
			gO := randn(r, len(q), 1)
			scale := float64(float32(1 / math.Sqrt(float64(tc.hd))))
			sh := backend.AttentionShape{CuSeqlens: upInts(t, b, tc.cu, len(tc.cu)), NH: tc.nh, NKV: tc.nkv, HD: tc.hd, Window: tc.window}
			Q, K, V := up(t, b, q, tensor.F32, n, tc.nh*tc.hd), up(t, b, k, tensor.F32, n, tc.nkv*tc.hd), up(t, b, v, tensor.F32, n, tc.nkv*tc.hd)
			out, lse := zeros(t, b, tensor.F32, n, tc.nh*tc.hd), zeros(t, b, tensor.F32, n, tc.nh)
			must(t, b.Attention(backend.AttentionArgs{AttentionShape: sh, Out: out, LSE: lse, Q: Q, K: K, V: V}))
			wantO, wantL := refAttention(q, k, v, tc.cu, tc.nh, tc.nkv, tc.hd, tc.window, scale)
			approx(t, "out", down(t, b, out), wantO, 1e-5, 1e-4)
			approx(t, "lse", down(t, b, lse), wantL, 1e-5, 1e-5)
			dQ, dK, dV := zeros(t, b, tensor.F32, n, tc.nh*tc.hd), zeros(t, b, tensor.F32, n, tc.nkv*tc.hd), zeros(t, b, tensor.F32, n, tc.nkv*tc.hd)
			must(t, b.AttentionBackward(backend.AttentionBackwardArgs{AttentionShape: sh, DQ: dQ, DK: dK, DV: dV,
				DOut: up(t, b, gO, tensor.F32, n, tc.nh*tc.hd), Q: Q, K: K, V: V, Out: out, LSE: lse}))
			wq, wk, wv := refAttentionBackward(q, k, v, gO, tc.cu, tc.nh, tc.nkv, tc.hd, tc.window, scale)
			approx(t, "dQ", down(t, b, dQ), wq, 1e-4, 1e-3)
			approx(t, "dK", down(t, b, dK), wk, 1e-4, 1e-3)
			approx(t, "dV", down(t, b, dV), wv, 1e-4, 1e-3)
		})
	}
}

func TestAttentionDecodeOverLongPrefix(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(52, 53))
	cu := []int32{0, 130, 201}
	nh, nkv, hd, n := 4, 2, 8, 201
	q, k, v := randn(r, n*nh*hd, 1), randn(r, n*nkv*hd, 1), randn(r, n*nkv*hd, 1)
	full, _ := refAttention(q, k, v, cu, nh, nkv, hd, 0, float64(float32(1/math.Sqrt(8))))
	rows := []int{127, 128, 129, 200}
	var qd, want []float64
	for _, i := range rows {
		qd = append(qd, q[i*nh*hd:(i+1)*nh*hd]...)
		want = append(want, full[i*nh*hd:(i+1)*nh*hd]...)
	}
	out := zeros(t, b, tensor.F32, len(rows), nh*hd)
	must(t, b.Attention(backend.AttentionArgs{
		AttentionShape: backend.AttentionShape{CuSeqlens: upInts(t, b, []int32{0, 3, 4}, 3), CuSeqlensK: upInts(t, b, cu, 3), NH: nh, NKV: nkv, HD: hd},
		Out:            out, Q: up(t, b, qd, tensor.F32, len(rows), nh*hd), K: up(t, b, k, tensor.F32, n, nkv*hd), V: up(t, b, v, tensor.F32, n, nkv*hd)}))
	approx(t, "decode out", down(t, b, out), want, 1e-5, 1e-4)
}
