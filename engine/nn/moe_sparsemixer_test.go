package nn

import (
	"math"
	"testing"
)

// TestSparseMixerRoute checks the two experts and weights of the deterministic sparsemixer
// against values worked out by hand from transformers' definition: the stage's kept set is the
// experts within 2*eps of its best logit, relative to max(|z_j|, best).
func TestSparseMixerRoute(t *testing.T) {
	sig := func(d float64) float64 { return 1 / (1 + math.Exp(-d)) }
	cases := []struct {
		name string
		z    []float32
		eps  float64
		sel  [2]int32
		w    [2]float64
	}{
		// Stage 1 keeps {0,1} (gap 0.01 <= 0.02), stage 2 keeps {1} alone.
		{"positive logits", []float32{1, 0.99, 0.5, -0.2}, 0.01, [2]int32{0, 1}, [2]float64{sig(0.01), 1}},
		// Negative best: the factor is |z_j|; stage 1 keeps {0,1}, stage 2 {1}.
		{"negative logits", []float32{-0.5, -0.505, -2, -0.6}, 0.01, [2]int32{0, 1}, [2]float64{sig(0.005), 1}},
		// A wider threshold keeps expert 3 in both stages (gaps 0.167 and 0.158 <= 0.2).
		{"wide threshold", []float32{-0.5, -0.505, -2, -0.6}, 0.1, [2]int32{0, 1},
			[2]float64{1 / (1 + math.Exp(-0.005) + math.Exp(-0.1)), sig(0.095)}},
		// Stage 1 keeps the best alone (gap 0.85 > 0.8); stage 2 keeps the three tied logits and
		// picks the first.
		{"ties", []float32{0.3, 0.3, 2, 0.3}, 0.4, [2]int32{2, 0}, [2]float64{1, 1.0 / 3}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := &SparseMixer{Eps: tc.eps}
			sel, w := make([]int32, 2), make([]float32, 2)
			s.route(sel, w, tc.z)
			if sel[0] != tc.sel[0] || sel[1] != tc.sel[1] {
				t.Fatalf("experts %v, want %v", sel, tc.sel)
			}
			for k := range w {
				if math.Abs(float64(w[k])-tc.w[k]) > 1e-6 {
					t.Errorf("weight %d = %.7f, want %.7f", k, w[k], tc.w[k])
				}
			}
		})
	}
}

// TestSparseMixerRefusals checks that the sparsemixer refuses what it cannot route, naming it.
func TestSparseMixerRefusals(t *testing.T) {
	e := newEnv(t)
	p := e.pass([]int{3}, 4)
	cases := []struct {
		name string
		edit func(m *MoE)
	}{
		{"top3", func(m *MoE) { m.TopK = 3 }},
		{"renormalised", func(m *MoE) { m.NormTopK = true }},
		{"negative threshold", func(m *MoE) { m.SparseMixer.Eps = -1 }},
		{"balancing bias", func(m *MoE) { m.Bias = make([]float32, 4) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := newMoE(e, 6, 5, 4, 2, false)
			m.SparseMixer = &SparseMixer{Eps: 0.01}
			tc.edit(m)
			if _, err := m.Forward(p, e.randn(1, p.N, 6), false); err == nil {
				t.Fatal("forward accepted a block the sparsemixer cannot route")
			}
		})
	}
}

// sparseMixerMargin is the smallest distance, over tokens and stages, of a kept-set test from
// its threshold and of the chosen expert from the runner-up: finite differences are meaningful
// only when it is well above the perturbation.
func sparseMixerMargin(logits []float32, e int, eps float64) float64 {
	margin := math.Inf(1)
	for t := 0; t*e < len(logits); t++ {
		z := logits[t*e : (t+1)*e]
		skip := -1
		for k := 0; k < 2; k++ {
			best, second := -1, -1
			for j := range z {
				if j == skip {
					continue
				}
				if best < 0 || z[j] > z[best] {
					best, second = j, best
				} else if second < 0 || z[j] > z[second] {
					second = j
				}
			}
			margin = math.Min(margin, float64(z[best]-z[second]))
			for j, v := range z {
				if j == skip || j == best {
					continue
				}
				r := float64(z[best]-v) / math.Max(math.Abs(float64(v)), float64(z[best]))
				margin = math.Min(margin, math.Abs(r-2*eps))
			}
			skip = best
		}
	}
	return margin
}

// TestSparseMixerGradients checks dx and the router and expert gradients of a block routed by
// the sparsemixer against central differences of sum(y*r) (+ the aux loss), with logits whose
// kept sets hold several experts in both stages and sit away from every threshold.
func TestSparseMixerGradients(t *testing.T) {
	const C, F, E = 12, 10, 5
	for _, auxScale := range []float64{0, 0.5} {
		t.Run("aux "+map[bool]string{false: "off", true: "on"}[auxScale > 0], func(t *testing.T) {
			e := newEnv(t)
			p := e.pass([]int{6, 5}, 4)
			m := newMoE(e, C, F, E, 2, false)
			m.SparseMixer = &SparseMixer{Eps: 0.15}
			// Logits ~ 1.2*level + 6 with levels a permutation of 0..4: stage 1 keeps the best
			// three (relative gaps 0.11, 0.22 against 0.3), stage 2 the next three.
			w := e.get(m.Router.W)
			for i := range w {
				w[i] *= 0.005
			}
			for x := 0; x < E; x++ {
				w[x*C+x] += 2
			}
			e.set(m.Router.W, w)
			xv := e.get(e.randn(1, p.N, C))
			for n := 0; n < p.N; n++ {
				for j, v := range e.rng.Perm(E) {
					xv[n*C+j] = 0.6*float32(v) + 3 + float32(0.02*e.rng.NormFloat64())
				}
			}
			x := e.zeros(p.N, C)
			e.set(x, xv)
			y, err := m.Forward(p, x, false)
			if err != nil {
				t.Fatal(err)
			}
			_ = e.b.Free(y)
			if g := sparseMixerMargin(m.smLogits, E, m.SparseMixer.Eps); g < 0.02 {
				t.Fatalf("inputs too close to a routing boundary (margin %.3g); pick another seed", g)
			}
			for tok := 0; tok < p.N; tok++ {
				if w := m.Routing().Weights[tok*2:]; w[0] > 0.99 || w[1] > 0.99 {
					t.Fatalf("token %d: a stage kept one expert alone (weights %v); the check would not reach the router", tok, w[:2])
				}
			}
			aux := func() float64 {
				a, _, err := LoadBalancingLoss([]*Routing{m.Routing()}, 1)
				if err != nil {
					t.Fatal(err)
				}
				return a
			}
			l := layer{
				fwd: func(p *Pass, x T, keep bool) (T, error) { return m.Forward(p, x, keep) },
				bwd: func(p *Pass, _ T, dy T) (T, error) {
					_, c, err := LoadBalancingLoss([]*Routing{m.Routing()}, auxScale)
					if err != nil {
						return T{}, err
					}
					m.AuxGrad = c
					return m.Backward(p, dy)
				},
				param: []T{m.Router.W, m.Experts[0].Gate.W, m.Experts[1].Up.W, m.Experts[2].Down.W},
				grad:  []T{m.Router.GW, m.Experts[0].Gate.GW, m.Experts[1].Up.GW, m.Experts[2].Down.GW},
			}
			checkGradientsExtra(t, e, p, x, l, func() float64 { return auxScale * aux() })
		})
	}
}
