package nn

import (
	"math"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
)

func newShortConv(e *env, c, l int, bias bool) *ShortConv {
	lin := func(out, in int) Linear {
		li := Linear{W: e.randn(0.3, out, in), GW: e.zeros(out, in)}
		if bias {
			li.B, li.GB = e.randn(0.1, out), e.zeros(out)
		}
		return li
	}
	s := &ShortConv{Name: "conv", InProj: lin(3*c, c), OutProj: lin(c, c), W: e.randn(0.5, c, 1, l), GW: e.zeros(c, 1, l), C: c, L: l}
	if bias {
		s.Bias, s.GBias = e.randn(0.2, c), e.zeros(c)
	}
	return s
}

func convLayer(s *ShortConv) layer {
	l := layer{
		fwd: func(p *Pass, x T, keep bool) (T, error) { return s.Forward(p, x, keep) },
		bwd: func(p *Pass, _ T, dy T) (T, error) { return s.Backward(p, dy) },
	}
	for _, lin := range []*Linear{&s.InProj, &s.OutProj} {
		l.param, l.grad = append(l.param, lin.W), append(l.grad, lin.GW)
		if !lin.B.IsNil() {
			l.param, l.grad = append(l.param, lin.B), append(l.grad, lin.GB)
		}
	}
	l.param, l.grad = append(l.param, s.W), append(l.grad, s.GW)
	if !s.Bias.IsNil() {
		l.param, l.grad = append(l.param, s.Bias), append(l.grad, s.GBias)
	}
	return l
}

// TestShortConvGradients checks dx and every parameter gradient of the gated short
// convolution against central differences, over packed documents shorter and longer than the
// filter, with and without biases, through a block as the layer's mixer too.
func TestShortConvGradients(t *testing.T) {
	const C = 6
	for _, tc := range []struct {
		name string
		l    int
		bias bool
		lens []int
	}{{"three taps with biases", 3, true, []int{5, 1, 7}}, {"four taps", 4, false, []int{2, 9}}, {"one tap", 1, true, []int{4}}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			p := e.pass(tc.lens, 4)
			x := e.randn(1, p.N, C)
			checkGradients(t, e, p, x, convLayer(newShortConv(e, C, tc.l, tc.bias)))
		})
	}
	t.Run("block", func(t *testing.T) {
		e := newEnv(t)
		p := e.pass([]int{5, 6}, 4)
		x := e.randn(1, p.N, C)
		s := newShortConv(e, C, 3, true)
		m := &MLP{Gate: Linear{W: e.randn(0.3, 8, C), GW: e.zeros(8, C)},
			Up:   Linear{W: e.randn(0.3, 8, C), GW: e.zeros(8, C)},
			Down: Linear{W: e.randn(0.3, C, 8), GW: e.zeros(C, 8)}}
		b := &Block{Name: "block", Attn: &Attention{Name: "conv", Conv: s}, FFN: m, Recompute: true,
			Norm1: RMSNorm{W: e.ones(0.2, C), GW: e.zeros(C), Eps: 1e-6},
			Norm2: RMSNorm{W: e.ones(0.2, C), GW: e.zeros(C), Eps: 1e-6}}
		l := convLayer(s)
		l.fwd = func(p *Pass, x T, keep bool) (T, error) { return b.Forward(p, x, keep) }
		l.bwd = func(p *Pass, _ T, dy T) (T, error) { return b.Backward(p, dy) }
		l.param = append(l.param, b.Norm1.W, m.Gate.W)
		l.grad = append(l.grad, b.Norm1.GW, m.Gate.GW)
		checkGradients(t, e, p, x, l)
	})
}

// TestShortConvForward checks the convolution against the formula computed here from the
// projections' outputs: y = out_proj(C * (bias + sum_k W[:, k] * (B*x)[t-(L-1)+k])), each
// document on its own (the second document's first token sees no token of the first).
func TestShortConvForward(t *testing.T) {
	const C, L = 3, 3
	e := newEnv(t)
	p := e.pass([]int{4, 3}, 4)
	x := e.randn(1, p.N, C)
	s := newShortConv(e, C, L, true)
	// Identity projections make B, C and x visible: in_proj = [I; 2I; I], out_proj = I.
	in := make([]float32, 3*C*C)
	out := make([]float32, C*C)
	for j := 0; j < C; j++ {
		in[j*C+j], in[(C+j)*C+j], in[(2*C+j)*C+j] = 1, 2, 1
		out[j*C+j] = 1
	}
	e.set(s.InProj.W, in)
	e.set(s.OutProj.W, out)
	e.set(s.InProj.B, make([]float32, 3*C))
	e.set(s.OutProj.B, make([]float32, C))
	y, err := s.Forward(p, x, false)
	if err != nil {
		t.Fatal(err)
	}
	xv, w, bias, got := e.get(x), e.get(s.W), e.get(s.Bias), e.get(y)
	starts := []int{0, 0, 0, 0, 4, 4, 4}
	for r := 0; r < p.N; r++ {
		for j := 0; j < C; j++ {
			acc := float64(bias[j])
			for k := 0; k < L; k++ {
				src := r - (L - 1) + k
				if src < starts[r] {
					continue
				}
				v := float64(xv[src*C+j])
				acc += float64(w[j*L+k]) * v * v // B = x and x = x: bx = x^2
			}
			want := 2 * float64(xv[r*C+j]) * acc // C = 2x
			if math.Abs(float64(got[r*C+j])-want) > 1e-5*(1+math.Abs(want)) {
				t.Errorf("y[%d,%d] = %g, want %g", r, j, got[r*C+j], want)
			}
		}
	}
}

// TestShortConvDecodingMatchesFullPass decodes two documents through the cache (a packed
// prefill of 3 and 2 tokens, then one token each, regathered so each document's rows are
// contiguous) and compares every output with a full pass over each whole document.
func TestShortConvDecodingMatchesFullPass(t *testing.T) {
	const C, L = 4, 3
	e := newEnv(t)
	s := newShortConv(e, C, L, true)
	docs := [][]int{{0, 1, 2, 5}, {3, 4, 6}} // rows of xs: prefill rows 0..4, step rows 5, 6
	xs := e.get(e.randn(1, 7, C))
	rowsOf := func(idx []int) T {
		var v []float32
		for _, r := range idx {
			v = append(v, xs[r*C:(r+1)*C]...)
		}
		x := e.zeros(len(idx), C)
		e.set(x, v)
		return x
	}
	want := map[int][]float32{}
	for _, d := range docs {
		p := e.pass([]int{len(d)}, 4)
		y, err := s.Forward(p, rowsOf(d), false)
		if err != nil {
			t.Fatal(err)
		}
		v := e.get(y)
		for k, r := range d {
			want[r] = v[k*C : (k+1)*C]
		}
	}
	kv := &KVCache{K: e.zeros(8, C), K2: e.zeros(8, C)}
	check := func(rows []int, y T) {
		v := e.get(y)
		for k, r := range rows {
			for j := 0; j < C; j++ {
				if g, w := v[k*C+j], want[r][j]; math.Abs(float64(g-w)) > 1e-5*(1+math.Abs(float64(w))) {
					t.Errorf("row %d col %d: cached %g, full pass %g", r, j, g, w)
				}
			}
		}
	}
	p := e.pass([]int{3, 2}, 4)
	p.Cache = []*KVCache{kv}
	y, err := s.Forward(p, rowsOf([]int{0, 1, 2, 3, 4}), false)
	if err != nil {
		t.Fatal(err)
	}
	check([]int{0, 1, 2, 3, 4}, y)
	// One new token per document: positions 3 and 2, appended at rows 5 and 6, then
	// regathered as [doc 0's 4 rows | doc 1's 3 rows].
	step := &Pass{B: e.b, DType: p.DType, N: 2, Positions: e.ints([]int32{3, 2}), CuSeqlens: e.ints([]int32{0, 1, 2}),
		CuSeqlensK: e.ints([]int32{0, 4, 7}), CacheGather: e.ints([]int32{0, 1, 2, 5, 3, 4, 6}), MaxSeqLen: 4,
		Cache: []*KVCache{kv}, CacheLen: 5}
	if y, err = s.Forward(step, rowsOf([]int{5, 6}), false); err != nil {
		t.Fatal(err)
	}
	check([]int{5, 6}, y)
	if _, err := s.Forward(step, rowsOf([]int{5, 6}), true); err == nil || !strings.Contains(err.Error(), "does not train") {
		t.Errorf("a training decoding pass: got %v, want a refusal", err)
	}
}

// TestSharedKeyValueAttentionGradients checks Gemma 4's attention: values from the key
// projection (KEqV) or their own, each normalised per head without weights (VNorm), unscaled
// scores, against central differences.
func TestSharedKeyValueAttentionGradients(t *testing.T) {
	const C, NH, NKV, HD = 12, 4, 1, 8
	for _, keqv := range []bool{true, false} {
		t.Run(map[bool]string{true: "k_eq_v", false: "own values"}[keqv], func(t *testing.T) {
			e := newEnv(t)
			p := e.pass([]int{5, 1, 7}, HD)
			x := e.randn(1, p.N, C)
			a := newAttention(e, C, NH, NKV, HD, 4, true)
			a.Scale, a.KEqV = 1, keqv
			a.VNorm = &RMSNorm{Name: "v_norm", W: e.ones(0, HD), Eps: 1e-6}
			l := attnLayer(a)
			if keqv {
				a.V = Linear{}
				// attnLayer lists K, then V: drop V's weight (the third entry, after Q and K).
				l.param = append(l.param[:2], l.param[3:]...)
				l.grad = append(l.grad[:2], l.grad[3:]...)
			}
			checkGradients(t, e, p, x, l)
		})
	}
}

// TestBlockOutScale checks that OutScale multiplies the block's output and, through the
// gradient check, its gradient, with and without recompute.
func TestBlockOutScale(t *testing.T) {
	const C, F, NH, NKV, HD = 12, 20, 4, 2, 6
	for _, rec := range []bool{false, true} {
		e := newEnv(t)
		p := e.pass([]int{4, 3}, HD)
		x := e.randn(1, p.N, C)
		a := newAttention(e, C, NH, NKV, HD, 0, true)
		m := &MLP{Gate: Linear{W: e.randn(0.3, F, C), GW: e.zeros(F, C)},
			Up:   Linear{W: e.randn(0.3, F, C), GW: e.zeros(F, C)},
			Down: Linear{W: e.randn(0.3, C, F), GW: e.zeros(C, F)}}
		b := &Block{Name: "block", Attn: a, FFN: m, Recompute: rec,
			Norm1: RMSNorm{W: e.ones(0.2, C), GW: e.zeros(C), Eps: 1e-6},
			Norm2: RMSNorm{W: e.ones(0.2, C), GW: e.zeros(C), Eps: 1e-6}}
		ref, err := b.Forward(p, x, false)
		if err != nil {
			t.Fatal(err)
		}
		want := e.get(ref)
		b.OutScale = e.ones(0, 1)
		e.set(b.OutScale, []float32{0.7})
		y, err := b.Forward(p, x, false)
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range e.get(y) {
			if math.Abs(float64(v)-0.7*float64(want[i])) > 1e-5 {
				t.Fatalf("recompute %v: y[%d] = %g, want 0.7 * %g", rec, i, v, want[i])
			}
		}
		l := attnLayer(a)
		l.fwd = func(p *Pass, x T, keep bool) (T, error) { return b.Forward(p, x, keep) }
		l.bwd = func(p *Pass, _ T, dy T) (T, error) { return b.Backward(p, dy) }
		l.param, l.grad = append(l.param, b.Norm1.W, m.Down.W), append(l.grad, b.Norm1.GW, m.Down.GW)
		checkGradients(t, e, p, x, l)
	}
}

// noShortConv is a backend without the short-convolution op, to exercise the host path.
type noShortConv struct{ backend.Backend }

func (u noShortConv) Optional() backend.Optional {
	o := u.Backend.Optional()
	o.ShortConv, o.ShortConvBackward = nil, nil
	return o
}

// TestShortConvBackendOpMatchesHost runs the layer forward and backward through the backend's
// ShortConv op and through the host path (the same backend without it) and compares y, dx and
// every gradient, over packed documents shorter and longer than the filter, with and without
// biases, with a frozen filter.
func TestShortConvBackendOpMatchesHost(t *testing.T) {
	const C = 5
	for _, tc := range []struct {
		name         string
		l            int
		bias, frozen bool
		lens         []int
	}{
		{"three taps with biases", 3, true, false, []int{5, 1, 7}},
		{"four taps", 4, false, false, []int{2, 9, 3}},
		{"frozen filter", 3, true, true, []int{6, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			s := newShortConv(e, C, tc.l, tc.bias)
			if tc.frozen {
				s.GW = T{}
			}
			x, dy := e.randn(1, 15, C), e.randn(1, 15, C)
			run := func(b backend.Backend) map[string][]float32 {
				p := e.pass(tc.lens, 4)
				p.B = b
				xs, err := x.Rows(0, p.N)
				if err != nil {
					t.Fatal(err)
				}
				dys, err := dy.Rows(0, p.N)
				if err != nil {
					t.Fatal(err)
				}
				grads := map[string]T{"in_proj.GW": s.InProj.GW, "out_proj.GW": s.OutProj.GW, "GW": s.GW, "GBias": s.GBias}
				for _, g := range grads {
					if !g.IsNil() {
						e.set(g, make([]float32, g.Numel()))
					}
				}
				y, err := s.Forward(p, xs, true)
				if err != nil {
					t.Fatal(err)
				}
				dx, err := s.Backward(p, dys)
				if err != nil {
					t.Fatal(err)
				}
				out := map[string][]float32{"y": e.get(y), "dx": e.get(dx)}
				for name, g := range grads {
					if !g.IsNil() {
						out[name] = e.get(g)
					}
				}
				return out
			}
			dev, host := run(e.b), run(noShortConv{e.b})
			if len(dev) != len(host) {
				t.Fatalf("the op path gave %d outputs, the host path %d", len(dev), len(host))
			}
			for name, want := range host {
				got := dev[name]
				for i := range want {
					if math.Abs(float64(got[i]-want[i])) > 1e-5*(1+math.Abs(float64(want[i]))) {
						t.Errorf("%s[%d]: op %g, host %g", name, i, got[i], want[i])
						break
					}
				}
			}
		})
	}
}
