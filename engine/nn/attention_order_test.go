package nn

import (
	"math"
	"testing"
)

// TestAttentionNormAfterRoPE: with NormAfterRoPE the q/k norms apply to the rotated heads. A
// rotation keeps each head's RMS, so with unit norm weights both orders give the same output;
// with other weights they differ (the order is applied); and the gradients of the rotated-then-
// normalised attention match central differences.
func TestAttentionNormAfterRoPE(t *testing.T) {
	const C, NH, NKV, HD = 12, 4, 2, 6
	lens := []int{5, 1, 7}
	run := func(after bool, unit bool) []float32 {
		e := newEnv(t)
		p := e.pass(lens, HD)
		x := e.randn(1, p.N, C)
		a := newAttention(e, C, NH, NKV, HD, 0, true)
		if unit {
			ones := make([]float32, HD)
			for i := range ones {
				ones[i] = 1
			}
			e.set(a.QNorm.W, ones)
			e.set(a.KNorm.W, ones)
		}
		a.NormAfterRoPE = after
		y, err := a.Forward(p, x, false)
		if err != nil {
			t.Fatal(err)
		}
		return e.get(y)
	}
	maxDiff := func(a, b []float32) float64 {
		d := 0.0
		for i := range a {
			d = math.Max(d, math.Abs(float64(a[i]-b[i])))
		}
		return d
	}
	if d := maxDiff(run(true, true), run(false, true)); d > 1e-5 {
		t.Errorf("unit norm weights: the two orders differ by %g; a rotation keeps the RMS", d)
	}
	if d := maxDiff(run(true, false), run(false, false)); d < 1e-4 {
		t.Errorf("jittered norm weights: the two orders agree within %g; NormAfterRoPE is not applied", d)
	}
	e := newEnv(t)
	p := e.pass(lens, HD)
	x := e.randn(1, p.N, C)
	a := newAttention(e, C, NH, NKV, HD, 3, true)
	a.NormAfterRoPE = true
	checkGradients(t, e, p, x, attnLayer(a))
}

// TestAttentionHeadGate: with HeadGate each head's output is scaled by softplus of its gate
// logit before O — zero gate weights scale every head by softplus(0) = ln 2, which O's
// linearity turns into the ungated output times ln 2 (its bias aside: the case has none) — and
// the gradients, the gate's included, match central differences.
func TestAttentionHeadGate(t *testing.T) {
	const C, NH, NKV, HD = 12, 4, 2, 6
	lens := []int{5, 1, 7}
	e := newEnv(t)
	p := e.pass(lens, HD)
	x := e.randn(1, p.N, C)
	a := newAttention(e, C, NH, NKV, HD, 0, false)
	plain, err := a.Forward(p, x, false)
	if err != nil {
		t.Fatal(err)
	}
	a.HeadGate = &Linear{Name: "g", W: e.zeros(NH, C), GW: e.zeros(NH, C)}
	gated, err := a.Forward(p, x, false)
	if err != nil {
		t.Fatal(err)
	}
	pv, gv := e.get(plain), e.get(gated)
	for i := range pv {
		if d := math.Abs(float64(gv[i]) - math.Ln2*float64(pv[i])); d > 1e-5 {
			t.Fatalf("output %d: %g with zero gate weights, want ln 2 × %g", i, gv[i], pv[i])
		}
	}
	e.set(a.HeadGate.W, e.get(e.randn(0.5, NH, C)))
	l := attnLayer(a)
	l.param, l.grad = append(l.param, a.HeadGate.W), append(l.grad, a.HeadGate.GW)
	checkGradients(t, e, p, x, l)
}
