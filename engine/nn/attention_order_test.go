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
