package nn

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/tensor"
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
		outBias  bool // JetMoE's bias on the block's output
	}{
		{"top2 renormalised", 2, true, 0, false, false},
		{"top2 raw weights", 2, false, 0, false, false},
		{"top3 renormalised with aux loss", 3, true, 0.5, false, false},
		{"top2 raw weights with aux loss", 2, false, 0.5, false, false},
		{"top1 with balancing bias", 1, false, 0.3, true, false},
		{"top2 renormalised with an output bias", 2, true, 0, false, true},
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
			if tc.outBias {
				m.OutBias, m.GOutBias = e.randn(0.3, C), e.zeros(C)
				l.param, l.grad = append(l.param, m.OutBias), append(l.grad, m.GOutBias)
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
			if err := m.route(nil, logits, 2); err != nil {
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
	if err := m.route(nil, logits, 2); err == nil {
		t.Error("top-5 of 4 experts accepted")
	}
	m = &MoE{Name: "moe", Experts: make([]Expert, 4), TopK: 2, Bias: []float32{1}}
	if err := m.route(nil, logits, 2); err == nil {
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

// FuzzRoute feeds arbitrary router logits (NaN, infinities, huge values) to the host router:
// it returns an error or a valid routing, never panics.
func FuzzRoute(f *testing.F) {
	f.Add([]byte{0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64}, uint8(2), uint8(2), false)
	f.Add([]byte{0, 0, 192, 127, 0, 0, 128, 127, 0, 0, 128, 255, 0, 0, 0, 0}, uint8(4), uint8(1), true)
	f.Fuzz(func(t *testing.T, raw []byte, experts, k uint8, norm bool) {
		e := int(experts%16) + 1
		n := len(raw) / 4 / e
		if n == 0 {
			return
		}
		logits := make([]float32, n*e)
		for i := range logits {
			logits[i] = math.Float32frombits(uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24)
		}
		m := &MoE{Name: "moe", Experts: make([]Expert, e), TopK: int(k % 18), NormTopK: norm}
		if err := m.route(nil, logits, n); err != nil {
			return
		}
		r := m.Routing()
		for t0 := 0; t0 < n; t0++ {
			seen := map[int32]bool{}
			for _, s := range r.Sel[t0*r.K : (t0+1)*r.K] {
				if s < 0 || int(s) >= e || seen[s] {
					t.Fatalf("token %d: selection %v of %d experts", t0, r.Sel[t0*r.K:(t0+1)*r.K], e)
				}
				seen[s] = true
			}
		}
		for i, w := range r.Weights {
			if math.IsNaN(float64(w)) || w < 0 {
				t.Fatalf("weight %d = %v", i, w)
			}
		}
	})
}

// BenchmarkMoEForwardBackward times one forward and backward of a mixture-of-experts block
// (N=512 tokens, C=256, 8 experts of I=256, top-2) and, for scale, of a dense SwiGLU MLP with
// the same active width (F = 2*256).
func BenchmarkMoEForwardBackward(b *testing.B) {
	const N, C, I, E, K = 512, 256, 256, 8, 2
	e := newEnv(b)
	p := &Pass{B: e.b, DType: tensor.F32, N: N}
	x := e.randn(1, N, C)
	dy := e.randn(1, N, C)
	run := func(b *testing.B, f FFN) {
		for i := 0; i < b.N; i++ {
			y, err := f.Forward(p, x, true)
			if err != nil {
				b.Fatal(err)
			}
			dx, err := f.Backward(p, dy)
			if err != nil {
				b.Fatal(err)
			}
			_ = e.b.Free(y)
			_ = e.b.Free(dx)
		}
		b.ReportMetric(float64(N*b.N)/b.Elapsed().Seconds(), "tok/s")
	}
	b.Run("moe", func(b *testing.B) { run(b, newMoE(e, C, I, E, K, true)) })
	b.Run("dense", func(b *testing.B) {
		run(b, &MLP{Name: "mlp",
			Gate: Linear{W: e.randn(0.1, K*I, C), GW: e.zeros(K*I, C)},
			Up:   Linear{W: e.randn(0.1, K*I, C), GW: e.zeros(K*I, C)},
			Down: Linear{W: e.randn(0.1, C, K*I), GW: e.zeros(C, K*I)}})
	})
}

// TestTopK checks the selection against sorting, ties going to the lower index.
func TestTopK(t *testing.T) {
	for _, tc := range []struct {
		score []float64
		k     int
		want  []int32
	}{
		{[]float64{1, 5, 3, 4}, 2, []int32{1, 3}},
		{[]float64{1, 5, 3, 4}, 4, []int32{1, 3, 2, 0}},
		{[]float64{2, 2, 2}, 2, []int32{0, 1}},
		{[]float64{0, 1, 1, 0}, 3, []int32{1, 2, 0}},
		{[]float64{-1, -3, -2}, 1, []int32{0}},
	} {
		sel := make([]int32, tc.k)
		topK(sel, tc.score)
		if !slices.Equal(sel, tc.want) {
			t.Errorf("topK(%v, %d) = %v, want %v", tc.score, tc.k, sel, tc.want)
		}
	}
}

// slotMajorRunner computes the experts through an ExpertGroup with the assignments listed slot
// by slot (all first choices, then all second choices), a different order from the block's own
// token-major one, and counts its calls.
type slotMajorRunner struct {
	g                      ExpertGroup
	perm                   []int // group assignment i is routing assignment perm[i]
	fwd, bwd, rel, dwShort int
}

func (r *slotMajorRunner) Forward(p *Pass, m *MoE, x T, keep bool) (T, error) {
	r.fwd++
	rt := m.Routing()
	var src, ex []int32
	var w []float32
	r.perm = r.perm[:0]
	for j := 0; j < rt.K; j++ {
		for t := 0; t < rt.N; t++ {
			a := t*rt.K + j
			src, ex, w = append(src, int32(t)), append(ex, rt.Sel[a]), append(w, rt.Weights[a])
			r.perm = append(r.perm, a)
		}
	}
	r.g = ExpertGroup{Name: m.Name, Experts: m.Experts}
	return r.g.Forward(p, x, src, ex, w, keep)
}

func (r *slotMajorRunner) Backward(p *Pass, m *MoE, dy T) (T, []float64, error) {
	r.bwd++
	dx, gdw, err := r.g.Backward(p, dy)
	if err != nil {
		return T{}, nil, err
	}
	dw := make([]float64, len(gdw)-r.dwShort)
	for i, a := range r.perm {
		if a < len(dw) {
			dw[a] = gdw[i]
		}
	}
	return dx, dw, nil
}

func (r *slotMajorRunner) Release(p *Pass) { r.rel++; r.g.Release(p) }

// An expert runner replaces the block's own expert compute: the block calls it for the
// experts and still computes the router gradient from the weight gradients it returns.
func TestExpertRunnerReplacesLocalCompute(t *testing.T) {
	const C, F, E, K = 8, 6, 4, 2
	e := newEnv(t)
	p := e.pass([]int{5, 4}, 4)
	m := newMoE(e, C, F, E, K, true)
	x := e.randn(1, p.N, C)
	dy := e.randn(1, p.N, C)
	params := []T{m.Router.GW}
	for _, ex := range m.Experts {
		params = append(params, ex.Gate.GW, ex.Up.GW, ex.Down.GW)
	}
	run := func() (y, dx []float32, grads [][]float32) {
		for _, g := range params {
			e.set(g, make([]float32, g.Numel()))
		}
		yt, err := m.Forward(p, x, true)
		if err != nil {
			t.Fatal(err)
		}
		defer e.b.Free(yt)
		dxt, err := m.Backward(p, dy)
		if err != nil {
			t.Fatal(err)
		}
		defer e.b.Free(dxt)
		for _, g := range params {
			grads = append(grads, e.get(g))
		}
		return e.get(yt), e.get(dxt), grads
	}
	y0, dx0, g0 := run()
	r := &slotMajorRunner{}
	m.Runner = r
	y1, dx1, g1 := run()
	if r.fwd != 1 || r.bwd != 1 {
		t.Fatalf("runner called %d forwards and %d backwards, want 1 and 1", r.fwd, r.bwd)
	}
	near := func(what string, got, want []float32) {
		for i := range want {
			if math.Abs(float64(got[i]-want[i])) > 1e-5*(1+math.Abs(float64(want[i]))) {
				t.Errorf("%s[%d] = %g through the runner, %g locally", what, i, got[i], want[i])
				return
			}
		}
	}
	near("y", y1, y0)
	near("dx", dx1, dx0)
	for i := range g0 {
		near("gradient", g1[i], g0[i])
	}
	// The router gradient comes from the runner's weight gradients: a runner that returns
	// too few is an error, not a silent wrong gradient.
	r.dwShort = 1
	yt, err := m.Forward(p, x, true)
	if err != nil {
		t.Fatal(err)
	}
	defer e.b.Free(yt)
	if _, err := m.Backward(p, dy); err == nil || !strings.Contains(err.Error(), "weight gradients") {
		t.Errorf("short weight gradients: got %v", err)
	}
	if r.rel == 0 {
		t.Error("the block never released the runner's caches")
	}
}

// A block holding a subset of the experts routes over all of them: without a runner it
// refuses to run, and an expert group maps global expert ids to its slots, refusing an
// assignment to an expert it does not hold.
func TestMoEHoldingSomeExperts(t *testing.T) {
	const C, F, E, K = 8, 6, 4, 2
	e := newEnv(t)
	p := e.pass([]int{5, 4}, 4)
	full := newMoE(e, C, F, E, K, true)
	x := e.randn(1, p.N, C)
	y0, err := full.Forward(p, x, false)
	if err != nil {
		t.Fatal(err)
	}
	defer e.b.Free(y0)
	sub := *full
	sub.Experts, sub.FirstExpert, sub.NumExperts = full.Experts[2:], 2, E
	if sub.Routed() != E {
		t.Fatalf("Routed() = %d, want %d", sub.Routed(), E)
	}
	if _, err := sub.Forward(p, x, false); err == nil || !strings.Contains(err.Error(), "holds experts [2,4) of 4") {
		t.Errorf("subset block without runner: got %v", err)
	}
	// Group over experts 2 and 3: the rows routed to them give the same result as the full
	// group restricted to those assignments.
	rt := full.Routing()
	var src, ex []int32
	var w []float32
	for a, s := range rt.Sel {
		if s >= 2 {
			src, ex, w = append(src, int32(a/K)), append(ex, s), append(w, rt.Weights[a])
		}
	}
	if len(src) == 0 {
		t.Fatal("no token chose experts 2 or 3")
	}
	g := ExpertGroup{Name: "sub", Experts: full.Experts[2:], First: 2}
	ys, err := g.Forward(p, x, src, ex, w, false)
	if err != nil {
		t.Fatal(err)
	}
	defer e.b.Free(ys)
	gf := ExpertGroup{Name: "full", Experts: full.Experts}
	yf, err := gf.Forward(p, x, src, ex, w, false)
	if err != nil {
		t.Fatal(err)
	}
	defer e.b.Free(yf)
	if got, want := e.get(ys), e.get(yf); !slices.Equal(got, want) {
		t.Errorf("group holding experts [2,4) computes %v, the full group %v", got[:4], want[:4])
	}
	if _, err := g.Forward(p, x, []int32{0}, []int32{1}, nil, false); err == nil || !strings.Contains(err.Error(), "names expert 1; this group holds experts [2,4)") {
		t.Errorf("assignment to an expert the group does not hold: got %v", err)
	}
}

// TestMoESigmoidGradients checks dx, the router's, an expert's and the shared expert's
// gradients of a DeepSeek-V3 block (sigmoid scores, a correction bias, 2 of 3 expert groups,
// weights scaled by 2.5, a shared expert) against central differences, with and without the
// renormalisation of the top-k weights, on both paths. The tokens' expert scores are
// well-spaced levels so that no perturbation changes the groups or the top-k.
func TestMoESigmoidGradients(t *testing.T) {
	const C, F, E = 12, 10, 6
	for _, norm := range []bool{true, false} {
		for _, composed := range []bool{true, false} {
			t.Run(fmt.Sprintf("norm=%v/composed=%v", norm, composed), func(t *testing.T) {
				e := newEnv(t)
				p := e.pass([]int{6, 5}, 4)
				m := newStackedMoE(e, C, F, E, 2, norm)
				m.Composed = composed
				deepseekRouter(e, m, C, F, 3)
				e.set(m.ScoreBias, []float32{0.01, -0.02, 0, 0.015, -0.01, 0.005})
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
						xv[n*C+j] = 0.4*float32(v) - 0.6 + float32(0.01*e.rng.NormFloat64())
					}
				}
				x := e.zeros(p.N, C)
				e.set(x, xv)
				l := layer{
					fwd:   func(p *Pass, x T, keep bool) (T, error) { return m.Forward(p, x, keep) },
					bwd:   func(p *Pass, _ T, dy T) (T, error) { return m.Backward(p, dy) },
					param: []T{m.Router.W, m.GateUp.W, m.Down.W, m.Shared.Up.W},
					grad:  []T{m.Router.GW, m.GateUp.GW, m.Down.GW, m.Shared.Up.GW},
				}
				checkGradients(t, e, p, x, l)
			})
		}
	}
}
