package nn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// env is a CPU backend with helpers to make random tensors.
type env struct {
	t   testing.TB
	b   backend.Backend
	rng *rand.Rand
}

func newEnv(t testing.TB) *env {
	return &env{t: t, b: cpu.New(cpu.Options{}), rng: rand.New(rand.NewPCG(1, 2))}
}

func (e *env) randn(scale float64, shape ...int) T {
	v := make([]float32, tensor.Shape(shape).Numel())
	for i := range v {
		v[i] = float32(scale * e.rng.NormFloat64())
	}
	t, err := backend.FromFloat32(e.b, v, tensor.F32, shape...)
	if err != nil {
		e.t.Fatal(err)
	}
	return t
}

func (e *env) ones(jitter float64, n int) T {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(1 + jitter*e.rng.NormFloat64())
	}
	t, err := backend.FromFloat32(e.b, v, tensor.F32, n)
	if err != nil {
		e.t.Fatal(err)
	}
	return t
}

func (e *env) zeros(shape ...int) T {
	t, err := e.b.Alloc(tensor.F32, shape...)
	if err != nil {
		e.t.Fatal(err)
	}
	return t
}

func (e *env) ints(v []int32) T {
	t, err := backend.FromInt32(e.b, v, len(v))
	if err != nil {
		e.t.Fatal(err)
	}
	return t
}

func (e *env) get(t T) []float32 {
	v, err := backend.ToFloat32(e.b, t)
	if err != nil {
		e.t.Fatal(err)
	}
	return v
}

func (e *env) set(t T, v []float32) {
	raw, _ := tensor.EncodeFloat32(tensor.F32, v)
	if err := e.b.Upload(t, raw); err != nil {
		e.t.Fatal(err)
	}
}

// pass builds the geometry of packed documents of the given lengths.
func (e *env) pass(lens []int, headDim int) *Pass {
	var pos, cu []int32
	cu = append(cu, 0)
	maxLen := 0
	for _, l := range lens {
		for i := 0; i < l; i++ {
			pos = append(pos, int32(i))
		}
		cu = append(cu, int32(len(pos)))
		maxLen = max(maxLen, l)
	}
	inv, scale, err := backend.RoPEConfig{Theta: 10000, HeadDim: headDim}.Compute(maxLen)
	if err != nil {
		e.t.Fatal(err)
	}
	invT, err := backend.FromFloat32(e.b, inv, tensor.F32, len(inv))
	if err != nil {
		e.t.Fatal(err)
	}
	return &Pass{B: e.b, DType: tensor.F32, N: len(pos), Positions: e.ints(pos), CuSeqlens: e.ints(cu),
		MaxSeqLen: maxLen, InvFreq: invT, AttentionScaling: scale}
}

// layer adapts one layer to the gradient check: fwd computes the output (caching when keep),
// bwd returns dx for dy after a keep forward.
type layer struct {
	fwd   func(p *Pass, x T, keep bool) (T, error)
	bwd   func(p *Pass, x, dy T) (T, error)
	param []T // parameters
	grad  []T // their gradients, in the same order
}

// checkGradients compares dx and every parameter gradient of L = sum(y * r) with central
// differences along random unit directions.
func checkGradients(t *testing.T, e *env, p *Pass, x T, l layer) {
	t.Helper()
	checkGradientsWith(t, e, p, x, l, nil)
}

// checkGradientsWith is checkGradients with extra() (optional) added to the objective after
// each forward.
func checkGradientsWith(t *testing.T, e *env, p *Pass, x T, l layer, extra func() float64) {
	t.Helper()
	y, err := l.fwd(p, x, true)
	if err != nil {
		t.Fatal(err)
	}
	r := e.randn(1, y.Shape()...)
	rv := e.get(r)
	dy := e.zeros(y.Shape()...)
	if err := e.b.Copy(dy, r); err != nil {
		t.Fatal(err)
	}
	dx, err := l.bwd(p, x, dy)
	if err != nil {
		t.Fatal(err)
	}
	objective := func() float64 {
		y, err := l.fwd(p, x, false)
		if err != nil {
			t.Fatal(err)
		}
		defer e.b.Free(y)
		s := 0.0
		for i, v := range e.get(y) {
			s += float64(v) * float64(rv[i])
		}
		if extra != nil {
			s += extra()
		}
		return s
	}
	check := func(what string, target, grad T) {
		v0 := e.get(target)
		g := e.get(grad)
		dir := make([]float32, len(v0))
		norm := 0.0
		for i := range dir {
			dir[i] = float32(e.rng.NormFloat64())
			norm += float64(dir[i] * dir[i])
		}
		analytic := 0.0
		for i := range dir {
			dir[i] /= float32(math.Sqrt(norm))
			analytic += float64(dir[i]) * float64(g[i])
		}
		const eps = 1e-2
		eval := func(s float32) float64 {
			v := make([]float32, len(v0))
			for i := range v {
				v[i] = v0[i] + s*dir[i]
			}
			e.set(target, v)
			return objective()
		}
		numeric := (eval(eps) - eval(-eps)) / (2 * eps)
		e.set(target, v0)
		if math.Abs(numeric-analytic) > 1e-3+1e-2*math.Abs(numeric) {
			t.Errorf("%s: directional derivative %.6g, gradient gives %.6g", what, numeric, analytic)
		}
	}
	if !dx.IsNil() {
		check("input", x, dx)
	}
	for i := range l.param {
		check(fmt.Sprintf("parameter %d", i), l.param[i], l.grad[i])
	}
}

func TestLayerGradients(t *testing.T) {
	const C, F, NH, NKV, HD = 12, 20, 4, 2, 6
	lens := []int{5, 1, 7}
	cases := []struct {
		name  string
		build func(e *env) layer
	}{
		{"linear with bias", func(e *env) layer {
			l := &Linear{Name: "lin", W: e.randn(0.3, F, C), B: e.randn(0.1, F), GW: e.zeros(F, C), GB: e.zeros(F)}
			return layer{
				fwd: func(p *Pass, x T, _ bool) (T, error) { return l.Forward(p, x) },
				bwd: func(p *Pass, x, dy T) (T, error) {
					dx := e.zeros(x.Shape()...)
					return dx, l.Backward(p, dx, dy, x, false)
				},
				param: []T{l.W, l.B}, grad: []T{l.GW, l.GB},
			}
		}},
		{"rmsnorm", func(e *env) layer {
			n := &RMSNorm{Name: "norm", W: e.ones(0.2, C), GW: e.zeros(C), Eps: 1e-6}
			var rstd T
			return layer{
				fwd: func(p *Pass, x T, keep bool) (T, error) {
					out, rs, err := n.Forward(p, x)
					if keep {
						rstd = rs
					}
					return out, err
				},
				bwd: func(p *Pass, x, dy T) (T, error) {
					dx := e.zeros(x.Shape()...)
					return dx, n.Backward(p, dx, dy, x, rstd, false)
				},
				param: []T{n.W}, grad: []T{n.GW},
			}
		}},
		{"swiglu mlp", func(e *env) layer {
			m := &MLP{Name: "mlp",
				Gate: Linear{W: e.randn(0.3, F, C), GW: e.zeros(F, C)},
				Up:   Linear{W: e.randn(0.3, F, C), GW: e.zeros(F, C)},
				Down: Linear{W: e.randn(0.3, C, F), GW: e.zeros(C, F)}}
			return layer{
				fwd:   func(p *Pass, x T, keep bool) (T, error) { return m.Forward(p, x, keep) },
				bwd:   func(p *Pass, _ T, dy T) (T, error) { return m.Backward(p, dy) },
				param: []T{m.Gate.W, m.Up.W, m.Down.W}, grad: []T{m.Gate.GW, m.Up.GW, m.Down.GW},
			}
		}},
		{"attention gqa window qk-norm bias", func(e *env) layer {
			a := newAttention(e, C, NH, NKV, HD, 3, true)
			return attnLayer(a)
		}},
		{"attention plain", func(e *env) layer {
			return attnLayer(newAttention(e, C, NH, NKV, HD, 0, false))
		}},
		{"block", func(e *env) layer { return blockLayer(e, C, F, NH, NKV, HD, false) }},
		{"block recompute", func(e *env) layer { return blockLayer(e, C, F, NH, NKV, HD, true) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			p := e.pass(lens, HD)
			x := e.randn(1, p.N, C)
			checkGradients(t, e, p, x, tc.build(e))
		})
	}
}

func newAttention(e *env, c, nh, nkv, hd, window int, extras bool) *Attention {
	lin := func(out, in int, bias bool) Linear {
		l := Linear{W: e.randn(0.3, out, in), GW: e.zeros(out, in)}
		if bias {
			l.B, l.GB = e.randn(0.1, out), e.zeros(out)
		}
		return l
	}
	a := &Attention{Name: "attn", Q: lin(nh*hd, c, extras), K: lin(nkv*hd, c, extras), V: lin(nkv*hd, c, extras),
		O: lin(c, nh*hd, extras), NH: nh, NKV: nkv, HD: hd, Window: window}
	if extras {
		a.QNorm = &RMSNorm{W: e.ones(0.2, hd), GW: e.zeros(hd), Eps: 1e-6}
		a.KNorm = &RMSNorm{W: e.ones(0.2, hd), GW: e.zeros(hd), Eps: 1e-6}
	}
	return a
}

func attnLayer(a *Attention) layer {
	l := layer{
		fwd: func(p *Pass, x T, keep bool) (T, error) { return a.Forward(p, x, keep) },
		bwd: func(p *Pass, _ T, dy T) (T, error) { return a.Backward(p, dy) },
	}
	for _, lin := range []*Linear{&a.Q, &a.K, &a.V, &a.O} {
		l.param, l.grad = append(l.param, lin.W), append(l.grad, lin.GW)
		if !lin.B.IsNil() {
			l.param, l.grad = append(l.param, lin.B), append(l.grad, lin.GB)
		}
	}
	if a.QNorm != nil {
		l.param = append(l.param, a.QNorm.W, a.KNorm.W)
		l.grad = append(l.grad, a.QNorm.GW, a.KNorm.GW)
	}
	return l
}

func blockLayer(e *env, c, f, nh, nkv, hd int, recompute bool) layer {
	a := newAttention(e, c, nh, nkv, hd, 0, true)
	m := &MLP{Gate: Linear{W: e.randn(0.3, f, c), GW: e.zeros(f, c)},
		Up:   Linear{W: e.randn(0.3, f, c), GW: e.zeros(f, c)},
		Down: Linear{W: e.randn(0.3, c, f), GW: e.zeros(c, f)}}
	b := &Block{Name: "block", Attn: a, FFN: m, Recompute: recompute,
		Norm1: RMSNorm{W: e.ones(0.2, c), GW: e.zeros(c), Eps: 1e-6},
		Norm2: RMSNorm{W: e.ones(0.2, c), GW: e.zeros(c), Eps: 1e-6}}
	l := attnLayer(a)
	l.fwd = func(p *Pass, x T, keep bool) (T, error) { return b.Forward(p, x, keep) }
	l.bwd = func(p *Pass, _ T, dy T) (T, error) { return b.Backward(p, dy) }
	l.param = append(l.param, b.Norm1.W, b.Norm2.W, m.Gate.W, m.Up.W, m.Down.W)
	l.grad = append(l.grad, b.Norm1.GW, b.Norm2.GW, m.Gate.GW, m.Up.GW, m.Down.GW)
	return l
}

// TestHeadLossGradient checks the final norm + LM head + cross-entropy: dx and the weight
// gradients of gradScale * sum(loss) against central differences, ignored targets excluded.
func TestHeadLossGradient(t *testing.T) {
	const C, V = 10, 23
	e := newEnv(t)
	p := e.pass([]int{4, 5}, 4)
	h := &Head{Name: "head", Norm: RMSNorm{W: e.ones(0.2, C), GW: e.zeros(C), Eps: 1e-6},
		W: e.randn(0.5, V, C), GW: e.zeros(V, C)}
	targets := e.ints([]int32{3, 7, -100, 22, 0, 5, 5, -100, 1})
	x := e.randn(1, p.N, C)
	const scale = 0.25
	loss := e.zeros(p.N)
	l := layer{
		fwd: func(p *Pass, x T, _ bool) (T, error) {
			// The "output" is the per-token loss; the objective multiplies it by r.
			_, err := h.Loss(p, x, targets, loss, T{}, false, 0)
			out := e.zeros(p.N)
			_ = e.b.Copy(out, loss)
			return out, err
		},
		param: []T{h.W, h.Norm.W}, grad: []T{h.GW, h.Norm.GW},
	}
	// With r = scale everywhere the objective is scale * sum(loss), whose gradient Loss(train)
	// computes.
	rv := make([]float32, p.N)
	for i := range rv {
		rv[i] = scale
	}
	l.bwd = func(p *Pass, x, _ T) (T, error) { return h.Loss(p, x, targets, loss, T{}, true, scale) }
	checkWithFixedR(t, e, p, x, l, rv)
	lv := e.get(loss)
	if lv[2] != 0 || lv[7] != 0 {
		t.Errorf("ignored targets have loss %v, %v; want 0", lv[2], lv[7])
	}
}

// checkWithFixedR is checkGradients with a given r (the backward knows it implicitly).
func checkWithFixedR(t *testing.T, e *env, p *Pass, x T, l layer, rv []float32) {
	t.Helper()
	if _, err := l.fwd(p, x, true); err != nil {
		t.Fatal(err)
	}
	dx, err := l.bwd(p, x, T{})
	if err != nil {
		t.Fatal(err)
	}
	objective := func() float64 {
		y, err := l.fwd(p, x, false)
		if err != nil {
			t.Fatal(err)
		}
		s := 0.0
		for i, v := range e.get(y) {
			s += float64(v) * float64(rv[i])
		}
		return s
	}
	targets := append([]T{x}, l.param...)
	grads := append([]T{dx}, l.grad...)
	for k := range targets {
		v0, g := e.get(targets[k]), e.get(grads[k])
		dir := make([]float32, len(v0))
		analytic, norm := 0.0, 0.0
		for i := range dir {
			dir[i] = float32(e.rng.NormFloat64())
			norm += float64(dir[i] * dir[i])
		}
		for i := range dir {
			dir[i] /= float32(math.Sqrt(norm))
			analytic += float64(dir[i]) * float64(g[i])
		}
		eval := func(s float32) float64 {
			v := make([]float32, len(v0))
			for i := range v {
				v[i] = v0[i] + s*dir[i]
			}
			e.set(targets[k], v)
			return objective()
		}
		numeric := (eval(1e-2) - eval(-1e-2)) / 2e-2
		e.set(targets[k], v0)
		if math.Abs(numeric-analytic) > 1e-3+1e-2*math.Abs(numeric) {
			t.Errorf("tensor %d: directional derivative %.6g, gradient gives %.6g", k, numeric, analytic)
		}
	}
}

// TestForwardTwiceIsRefused checks the cache discipline: a second training forward without a
// backward is an error, and Release makes the layer usable again.
func TestForwardTwiceIsRefused(t *testing.T) {
	e := newEnv(t)
	p := e.pass([]int{4}, 6)
	a := newAttention(e, 12, 4, 2, 6, 0, false)
	x := e.randn(1, p.N, 12)
	if _, err := a.Forward(p, x, true); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Forward(p, x, true); err == nil {
		t.Fatal("second Forward without Backward succeeded")
	}
	a.Release(p)
	if _, err := a.Forward(p, x, true); err != nil {
		t.Fatalf("Forward after Release: %v", err)
	}
	if _, err := (&MLP{Name: "m"}).Backward(p, x); err == nil {
		t.Fatal("Backward without Forward succeeded")
	}
}
