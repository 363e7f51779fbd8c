package nn

import (
	"math"
	"testing"
)

// gatedAttention is newAttention with q_proj widened to each head's queries then its gate.
func gatedAttention(e *env, c, nh, nkv, hd int) *Attention {
	a := newAttention(e, c, nh, nkv, hd, 0, true)
	a.OutGate, a.RotaryDim = true, hd/2
	a.Q = Linear{Name: "q", W: e.randn(0.3, 2*nh*hd, c), GW: e.zeros(2*nh*hd, c), B: e.randn(0.1, 2*nh*hd), GB: e.zeros(2 * nh * hd)}
	return a
}

// TestAttentionOutputGateGradients checks dx and every gradient of gated attention (per-head
// q/k norms, partial rotary, biases) against central differences.
func TestAttentionOutputGateGradients(t *testing.T) {
	e := newEnv(t)
	a := gatedAttention(e, 12, 4, 2, 8)
	p := e.pass([]int{5, 1, 7}, a.RotaryDim)
	checkGradients(t, e, p, e.randn(1, p.N, 12), attnLayer(a))
}

// TestAttentionOutputGateScalesHeads: with o_proj the identity, gated attention's output is
// the ungated attention of the query rows times σ of the gate rows, head by head
// (transformers' view(..., NH, 2·HD).chunk(2) of q_proj).
func TestAttentionOutputGateScalesHeads(t *testing.T) {
	const C, NH, NKV, HD = 8, 2, 1, 4
	e := newEnv(t)
	g := gatedAttention(e, C, NH, NKV, HD)
	eye := make([]float32, C*NH*HD)
	for i := range C {
		eye[i*NH*HD+i] = 1
	}
	g.O = Linear{Name: "o", W: e.randn(0, C, NH*HD), GW: e.zeros(C, NH*HD)}
	e.set(g.O.W, eye)
	// The same attention without the gate: q_proj's query rows only.
	w, bias := e.get(g.Q.W), e.get(g.Q.B)
	var qw, qb, gw, gb []float32
	for h := range NH {
		qw = append(qw, w[2*h*HD*C:(2*h+1)*HD*C]...)
		gw = append(gw, w[(2*h+1)*HD*C:(2*h+2)*HD*C]...)
		qb = append(qb, bias[2*h*HD:(2*h+1)*HD]...)
		gb = append(gb, bias[(2*h+1)*HD:(2*h+2)*HD]...)
	}
	plain := *g
	plain.OutGate = false
	plain.c = attnCache{}
	plain.Q = Linear{Name: "q", W: e.randn(0, NH*HD, C), B: e.randn(0, NH*HD)}
	e.set(plain.Q.W, qw)
	e.set(plain.Q.B, qb)
	p := e.pass([]int{6}, g.RotaryDim)
	x := e.randn(1, p.N, C)
	yg, err := g.Forward(p, x, false)
	if err != nil {
		t.Fatal(err)
	}
	yp, err := plain.Forward(p, x, false)
	if err != nil {
		t.Fatal(err)
	}
	xs, got, base := e.get(x), e.get(yg), e.get(yp)
	for n := range p.N {
		for j := range NH * HD {
			z := float64(gb[j])
			for i := range C {
				z += float64(gw[j*C+i]) * float64(xs[n*C+i])
			}
			want := float64(base[n*C+j]) / (1 + math.Exp(-z))
			if d := math.Abs(float64(got[n*C+j]) - want); d > 1e-5 {
				t.Fatalf("token %d column %d: %.6g, want %.6g", n, j, got[n*C+j], want)
			}
		}
	}
}
