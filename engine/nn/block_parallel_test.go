package nn

import (
	"math"
	"strings"
	"testing"
)

// parallelBlock is a Cohere layer: one LayerNorm without bias (Center) feeding attention with
// biases and a SwiGLU MLP, both added to the residual.
func parallelBlock(e *env, c, f, nh, nkv, hd int, recompute bool, scale float32) (*Block, layer) {
	a := newAttention(e, c, nh, nkv, hd, 3, true)
	m := &MLP{Gate: Linear{W: e.randn(0.3, f, c), GW: e.zeros(f, c)},
		Up:   Linear{W: e.randn(0.3, f, c), GW: e.zeros(f, c)},
		Down: Linear{W: e.randn(0.3, c, f), GW: e.zeros(c, f)}}
	b := &Block{Name: "block", Attn: a, FFN: m, Recompute: recompute, Parallel: true, ResidualScale: scale,
		Norm1: RMSNorm{W: e.ones(0.2, c), GW: e.zeros(c), Eps: 1e-5, Center: true}}
	l := attnLayer(a)
	l.fwd = func(p *Pass, x T, keep bool) (T, error) { return b.Forward(p, x, keep) }
	l.bwd = func(p *Pass, _ T, dy T) (T, error) { return b.Backward(p, dy) }
	l.param = append(l.param, b.Norm1.W, m.Gate.W, m.Up.W, m.Down.W)
	l.grad = append(l.grad, b.Norm1.GW, m.Gate.GW, m.Up.GW, m.Down.GW)
	return b, l
}

// TestParallelBlockGradients checks the parallel layer's input and parameter gradients (the
// centred norm's, both branches') against central differences, with stored activations, with
// recomputation and with scaled branches.
func TestParallelBlockGradients(t *testing.T) {
	const C, F, NH, NKV, HD = 12, 20, 4, 2, 6
	for _, tc := range []struct {
		name      string
		recompute bool
		scale     float32
	}{{"stored", false, 0}, {"recompute", true, 0}, {"scaled", false, 0.7}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			p := e.pass([]int{5, 1, 7}, HD)
			x := e.randn(1, p.N, C)
			_, l := parallelBlock(e, C, F, NH, NKV, HD, tc.recompute, tc.scale)
			checkGradients(t, e, p, x, l)
		})
	}
}

// TestParallelBlockIsTheSumOfItsBranches: the layer's output is x + Attn(n) + FFN(n) for the
// one norm's output n, computed module by module; the sequential layer over the same modules
// (Norm2 = Norm1) differs, so the test tells the two apart.
func TestParallelBlockIsTheSumOfItsBranches(t *testing.T) {
	const C, F, NH, NKV, HD = 12, 20, 4, 2, 6
	e := newEnv(t)
	p := e.pass([]int{6, 4}, HD)
	x := e.randn(1, p.N, C)
	b, _ := parallelBlock(e, C, F, NH, NKV, HD, false, 0)
	y, err := b.Forward(p, x, false)
	if err != nil {
		t.Fatal(err)
	}
	got := e.get(y)
	n, _, err := b.Norm1.Forward(p, x)
	if err != nil {
		t.Fatal(err)
	}
	a, err := b.Attn.Forward(p, n, false)
	if err != nil {
		t.Fatal(err)
	}
	f, err := b.FFN.Forward(p, n, false)
	if err != nil {
		t.Fatal(err)
	}
	xv, av, fv := e.get(x), e.get(a), e.get(f)
	worst := 0.0
	for i := range got {
		worst = math.Max(worst, math.Abs(float64(got[i])-float64(xv[i]+av[i]+fv[i])))
	}
	if worst > 1e-5 {
		t.Errorf("parallel layer differs from x + Attn(n) + FFN(n) by %g", worst)
	}
	seq := &Block{Name: "seq", Attn: b.Attn, FFN: b.FFN, Norm1: b.Norm1, Norm2: b.Norm1}
	ys, err := seq.Forward(p, x, false)
	if err != nil {
		t.Fatal(err)
	}
	diff := 0.0
	for i, v := range e.get(ys) {
		diff = math.Max(diff, math.Abs(float64(v-got[i])))
	}
	if diff < 1e-3 {
		t.Errorf("the sequential layer over the same modules agrees with the parallel one (max %g): the test cannot tell them apart", diff)
	}
}

// TestParallelBlockRefusesSequentialVariants: branch-output norms and a layer without its
// pre-norm are the sequential layer's variants; a parallel layer with them is an error.
func TestParallelBlockRefusesSequentialVariants(t *testing.T) {
	const C, F, NH, NKV, HD = 12, 20, 4, 2, 6
	e := newEnv(t)
	p := e.pass([]int{4}, HD)
	x := e.randn(1, p.N, C)
	for name, edit := range map[string]func(*Block){
		"post norms":   func(b *Block) { n := b.Norm1; b.PostAttnNorm, b.PostFFNNorm = &n, &n },
		"no pre-norms": func(b *Block) { b.NoPreNorms = true },
	} {
		b, _ := parallelBlock(e, C, F, NH, NKV, HD, false, 0)
		edit(b)
		if _, err := b.Forward(p, x, true); err == nil || !strings.Contains(err.Error(), "parallel layer") {
			t.Errorf("%s: Forward error %v, want the parallel layer refused", name, err)
		}
	}
}

// TestMoESharedScaleAverages: RoutedScaling 0.5 with SharedScale 0.5 gives half the plain
// block's output (the average of the routed and the shared output), and its gradients match
// central differences.
func TestMoESharedScaleAverages(t *testing.T) {
	const C, F, E = 12, 10, 5
	e := newEnv(t)
	p := e.pass([]int{6, 5}, 4)
	m := newMoE(e, C, F, E, 2, true)
	m.Shared = &MLP{Name: "shared", Gate: Linear{W: e.randn(0.3, 14, C), GW: e.zeros(14, C)},
		Up:   Linear{W: e.randn(0.3, 14, C), GW: e.zeros(14, C)},
		Down: Linear{W: e.randn(0.3, C, 14), GW: e.zeros(C, 14)}}
	// Router ~ 2*identity on the first E features, each token's first E features well-spaced
	// levels: the expert scores are far from ties.
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
	plain, err := m.Forward(p, x, false)
	if err != nil {
		t.Fatal(err)
	}
	pv := e.get(plain)
	m.RoutedScaling, m.SharedScale = 0.5, 0.5
	avg, err := m.Forward(p, x, false)
	if err != nil {
		t.Fatal(err)
	}
	worst := 0.0
	for i, v := range e.get(avg) {
		worst = math.Max(worst, math.Abs(float64(v)-0.5*float64(pv[i])))
	}
	if worst > 1e-6 {
		t.Errorf("averaged block differs from half the summed one by %g", worst)
	}
	if g := minSelectionGap(m); g < 0.02 {
		t.Fatalf("inputs too close to a top-k tie (gap %.3g)", g)
	}
	l := layer{
		fwd:   func(p *Pass, x T, keep bool) (T, error) { return m.Forward(p, x, keep) },
		bwd:   func(p *Pass, _ T, dy T) (T, error) { return m.Backward(p, dy) },
		param: []T{m.Router.W, m.Experts[0].Gate.W, m.Shared.Gate.W, m.Shared.Down.W},
		grad:  []T{m.Router.GW, m.Experts[0].Gate.GW, m.Shared.Gate.GW, m.Shared.Down.GW},
	}
	checkGradients(t, e, p, x, l)
}
