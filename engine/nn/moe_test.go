package nn

import (
	"math"
	"slices"
	"sort"
	"testing"
)

func newMoE(e *env, c, f, experts, k int, norm bool) *MoE {
	m := &MoE{Name: "moe", Router: Linear{Name: "router", W: e.randn(1, experts, c), GW: e.zeros(experts, c)},
		TopK: k, NormTopK: norm}
	for x := 0; x < experts; x++ {
		m.Experts = append(m.Experts, Expert{
			Gate: Linear{W: e.randn(0.3, f, c), GW: e.zeros(f, c)},
			Up:   Linear{W: e.randn(0.3, f, c), GW: e.zeros(f, c)},
			Down: Linear{W: e.randn(0.3, c, f), GW: e.zeros(c, f)},
		})
	}
	return m
}

// minSelectionGap is the smallest difference, over tokens, between the score of the last chosen
// expert and the best unchosen one: finite differences are meaningful only when it is well
// above the perturbation.
func minSelectionGap(m *MoE) float64 {
	r := m.Routing()
	gap := math.Inf(1)
	for t := 0; t < r.N; t++ {
		s := make([]float64, r.E)
		for j := range s {
			s[j] = float64(r.Probs[t*r.E+j])
			if m.Bias != nil {
				s[j] += float64(m.Bias[j])
			}
		}
		sort.Sort(sort.Reverse(sort.Float64Slice(s)))
		gap = math.Min(gap, s[r.K-1]-s[r.K])
	}
	return gap
}

// TestMoEGradients checks dx and the router and expert gradients of a mixture-of-experts block
// against central differences of sum(y*r) + scale*aux, through the router's softmax, top-k
// renormalisation and the load-balancing loss, with inputs chosen away from top-k ties.
func TestMoEGradients(t *testing.T) {
	const C, F, E = 12, 10, 5
	cases := []struct {
		name     string
		k        int
		norm     bool
		auxScale float64
		bias     bool
	}{
		{"top2 renormalised", 2, true, 0, false},
		{"top2 raw weights", 2, false, 0, false},
		{"top3 renormalised with aux loss", 3, true, 0.5, false},
		{"top2 raw weights with aux loss", 2, false, 0.5, false},
		{"top1 with balancing bias", 1, false, 0.3, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			p := e.pass([]int{6, 5}, 4)
			m := newMoE(e, C, F, E, tc.k, tc.norm)
			// Router ~ 2*identity on the first E features, and each token's first E features a
			// permutation of well-spaced levels, so every token's expert scores are far apart.
			w := e.get(m.Router.W)
			for i := range w {
				w[i] *= 0.05
			}
			for x := 0; x < E; x++ {
				w[x*C+x] += 2
			}
			e.set(m.Router.W, w)
			xv := e.get(e.randn(1, p.N, C))
			for n := 0; n < p.N; n++ {
				for j, v := range e.rng.Perm(E) {
					xv[n*C+j] = 0.6*float32(v) + float32(0.02*e.rng.NormFloat64())
				}
			}
			x := e.zeros(p.N, C)
			e.set(x, xv)
			if tc.bias {
				m.Bias = []float32{0.2, -0.1, 0, 0.05, -0.3}
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
					_, c, err := LoadBalancingLoss([]*Routing{m.Routing()}, tc.auxScale)
					if err != nil {
						return T{}, err
					}
					m.AuxGrad = c
					return m.Backward(p, dy)
				},
				param: []T{m.Router.W, m.Experts[0].Gate.W, m.Experts[1].Up.W, m.Experts[2].Down.W},
				grad:  []T{m.Router.GW, m.Experts[0].Gate.GW, m.Experts[1].Up.GW, m.Experts[2].Down.GW},
			}
			y, err := m.Forward(p, x, false)
			if err != nil {
				t.Fatal(err)
			}
			_ = e.b.Free(y)
			if g := minSelectionGap(m); g < 0.02 {
				t.Fatalf("inputs too close to a top-k tie (gap %.3g); pick another seed", g)
			}
			checkGradientsExtra(t, e, p, x, l, func() float64 { return tc.auxScale * aux() })
		})
	}
}

// checkGradientsExtra is checkGradients with extra() (evaluated after each forward) added to the
// objective.
func checkGradientsExtra(t *testing.T, e *env, p *Pass, x T, l layer, extra func() float64) {
	t.Helper()
	fwd := l.fwd
	var last float64
	l.fwd = func(p *Pass, x T, keep bool) (T, error) {
		y, err := fwd(p, x, keep)
		if err == nil {
			last = extra()
		}
		return y, err
	}
	checkGradientsWith(t, e, p, x, l, func() float64 { return last })
}

func TestRouting(t *testing.T) {
	// logits chosen so that softmax probabilities are easy to reason about.
	logits := []float32{
		0, 1, 2, 3, // token 0: experts 3, 2 win
		3, 0, 0, 2.5, // token 1: experts 0, 3
	}
	cases := []struct {
		name    string
		norm    bool
		bias    []float32
		sel     []int32
		weights func(p []float32) []float32
	}{
		{"raw", false, nil, []int32{3, 2, 0, 3}, func(p []float32) []float32 { return []float32{p[3], p[2], p[4], p[7]} }},
		{"renormalised", true, nil, []int32{3, 2, 0, 3}, func(p []float32) []float32 {
			return []float32{p[3] / (p[3] + p[2]), p[2] / (p[3] + p[2]), p[4] / (p[4] + p[7]), p[7] / (p[4] + p[7])}
		}},
		{"bias moves selection only", false, []float32{0, 0.9, 0, 0}, []int32{1, 3, 1, 0},
			func(p []float32) []float32 { return []float32{p[1], p[3], p[5], p[4]} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := &MoE{Name: "moe", Experts: make([]Expert, 4), TopK: 2, NormTopK: tc.norm, Bias: tc.bias}
			if err := m.route(logits, 2); err != nil {
				t.Fatal(err)
			}
			r := m.Routing()
			if !slices.Equal(r.Sel, tc.sel) {
				t.Errorf("selection %v, want %v", r.Sel, tc.sel)
			}
			for i, w := range tc.weights(r.Probs) {
				if math.Abs(float64(r.Weights[i]-w)) > 1e-7 {
					t.Errorf("weight %d = %v, want %v", i, r.Weights[i], w)
				}
			}
			var s float64
			for _, v := range r.Probs[:4] {
				s += float64(v)
			}
			if math.Abs(s-1) > 1e-6 {
				t.Errorf("probabilities of token 0 sum to %v", s)
			}
		})
	}
	m := &MoE{Name: "moe", Experts: make([]Expert, 4), TopK: 5}
	if err := m.route(logits, 2); err == nil {
		t.Error("top-5 of 4 experts accepted")
	}
	m = &MoE{Name: "moe", Experts: make([]Expert, 4), TopK: 2, Bias: []float32{1}}
	if err := m.route(logits, 2); err == nil {
		t.Error("bias of the wrong length accepted")
	}
}

// TestLoadBalancingLoss checks transformers' formula on a hand-computed case over two layers.
func TestLoadBalancingLoss(t *testing.T) {
	// Two layers of one token each, E=2, K=1.
	rs := []*Routing{
		{N: 1, E: 2, K: 1, Probs: []float32{0.75, 0.25}, Sel: []int32{0}, Weights: []float32{0.75}},
		{N: 1, E: 2, K: 1, Probs: []float32{0.25, 0.75}, Sel: []int32{1}, Weights: []float32{0.75}},
	}
	// F = (0.5, 0.5), P = (0.5, 0.5): aux = 2 * (0.25 + 0.25) = 1.
	aux, c, err := LoadBalancingLoss(rs, 3)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(aux-1) > 1e-12 {
		t.Errorf("aux = %v, want 1", aux)
	}
	// c[e] = scale * E * F_e / T = 3 * 2 * 0.5 / 2.
	for e, v := range c {
		if math.Abs(v-1.5) > 1e-12 {
			t.Errorf("c[%d] = %v, want 1.5", e, v)
		}
	}
	// All tokens on expert 0: F = (1, 0), P = (0.9, 0.1): aux = 2 * 0.9.
	skew := []*Routing{{N: 2, E: 2, K: 1, Probs: []float32{0.9, 0.1, 0.9, 0.1}, Sel: []int32{0, 0}, Weights: []float32{0.9, 0.9}}}
	if aux, _, _ := LoadBalancingLoss(skew, 1); math.Abs(aux-1.8) > 1e-6 {
		t.Errorf("skewed aux = %v, want 1.8", aux)
	}
	bad := []*Routing{rs[0], {N: 1, E: 3, K: 1, Probs: []float32{1, 0, 0}, Sel: []int32{0}, Weights: []float32{1}}}
	if _, _, err := LoadBalancingLoss(bad, 1); err == nil {
		t.Error("layers with different expert counts accepted")
	}
}
