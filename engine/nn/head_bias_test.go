package nn

import (
	"math"
	"testing"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// newBiasedHead is a head with an LM-head bias over V words of width C.
func newBiasedHead(e *env, c, v int) *Head {
	return &Head{Name: "lm_head", Norm: RMSNorm{Name: "norm", W: e.ones(0.2, c), GW: e.zeros(c), Eps: 1e-6},
		W: e.randn(0.5, v, c), GW: e.zeros(v, c), B: e.randn(1, v), GB: e.zeros(v)}
}

// TestHeadBiasLoss checks the biased head's per-token loss against -log softmax of the logits
// Logits returns (norm, x W^T + b), computed on the host, and that the bias moves it.
func TestHeadBiasLoss(t *testing.T) {
	const N, C, V = 6, 8, 11
	e := newEnv(t)
	p := e.pass([]int{N}, 4)
	h := newBiasedHead(e, C, V)
	x := e.randn(1, N, C)
	tg := []int32{3, 0, 10, 7, 7, 1}
	targets := e.ints(tg)
	loss := e.zeros(N)
	if _, err := h.Loss(p, x, targets, loss, T{}, false, 0); err != nil {
		t.Fatal(err)
	}
	lg, err := h.Logits(p, x)
	if err != nil {
		t.Fatal(err)
	}
	lv, got := e.get(lg), e.get(loss)
	unbiased := *h
	unbiased.B = T{}
	ul, err := unbiased.Logits(p, x)
	if err != nil {
		t.Fatal(err)
	}
	uv, bv := e.get(ul), e.get(h.B)
	for n := 0; n < N; n++ {
		row := lv[n*V : (n+1)*V]
		m := math.Inf(-1)
		for j, l := range row {
			if d := float64(l) - float64(uv[n*V+j]) - float64(bv[j]); math.Abs(d) > 1e-5 {
				t.Fatalf("logit %d,%d is not the unbiased logit plus the bias (off by %g)", n, j, d)
			}
			m = math.Max(m, float64(l))
		}
		z := 0.0
		for _, l := range row {
			z += math.Exp(float64(l) - m)
		}
		want := m + math.Log(z) - float64(row[tg[n]])
		if math.Abs(float64(got[n])-want) > 1e-5 {
			t.Errorf("token %d: loss %.6f, -log softmax of the biased logits %.6f", n, got[n], want)
		}
	}
}

// TestHeadBiasGradients checks dx and the gradients of the head's weight, bias and norm weight
// against central differences of sum_n r_n * loss_n (r as the per-token gradient scale).
func TestHeadBiasGradients(t *testing.T) {
	const N, C, V = 6, 8, 11
	e := newEnv(t)
	p := e.pass([]int{N}, 4)
	h := newBiasedHead(e, C, V)
	x := e.randn(1, N, C)
	targets := e.ints([]int32{3, 0, 10, 7, 7, 1})
	l := layer{
		fwd: func(p *Pass, x T, keep bool) (T, error) {
			loss, err := p.B.Alloc(tensor.F32, N)
			if err != nil {
				return T{}, err
			}
			_, err = h.Loss(p, x, targets, loss, T{}, false, 0)
			return loss, err
		},
		bwd: func(p *Pass, x, dy T) (T, error) {
			return h.LossScaled(p, x, targets, dy, T{}, T{}, true, 1)
		},
		param: []T{h.W, h.B, h.Norm.W},
		grad:  []T{h.GW, h.GB, h.Norm.GW},
	}
	checkGradients(t, e, p, x, l)
}
