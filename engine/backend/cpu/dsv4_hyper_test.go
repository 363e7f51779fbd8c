package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// dsv4Tol is the tolerance of a value stored in dt: float32 rounding of float64 sums, or
// bf16's 8 bits.
func dsv4Tol(dt tensor.DType) (atol, rtol float64) {
	if dt == tensor.BF16 {
		return 1e-2, 1e-2
	}
	return 1e-6, 1e-5
}

// accumulated returns init as stored in dt plus the gradient g (what a += into a tensor of
// dt that held init must give).
func accumulated(init, g []float64, dt tensor.DType) []float64 {
	out := rounded(init, dt)
	for i := range out {
		out[i] += g[i]
	}
	return out
}

type hyperCase struct {
	n, N, iters int
	head        bool
	dt          tensor.DType
}

func (c hyperCase) String() string {
	mode := fmt.Sprintf("iters%d", c.iters)
	if c.head {
		mode = "head"
	}
	return fmt.Sprintf("n%d_N%d_%s_%v", c.n, c.N, mode, c.dt)
}

func (c hyperCase) m() int {
	if c.head {
		return c.n
	}
	return (2 + c.n) * c.n
}

func (c hyperCase) scales() int {
	if c.head {
		return 1
	}
	return 3
}

var hyperCases = []hyperCase{
	{n: 4, N: 5, iters: 3, dt: tensor.F32},
	{n: 4, N: 5, iters: 3, dt: tensor.BF16},
	{n: 1, N: 1, iters: 1, dt: tensor.F32},
	{n: 1, N: 3, iters: 2, dt: tensor.BF16},
	{n: 3, N: 7, iters: 20, dt: tensor.F32},
	{n: 3, N: 2, iters: 20, dt: tensor.BF16},
	{n: 8, N: 3, iters: 5, dt: tensor.F32},
	{n: 4, N: 6, head: true, dt: tensor.F32},
	{n: 3, N: 1, head: true, dt: tensor.BF16},
	{n: 1, N: 2, head: true, dt: tensor.F32},
}

// hyperTape is the reference: DSV4.hyper's chain of host tape ops (DSV4.Logits' final mix
// with head), returning pre, post and comb (post and comb nil with head).
func hyperTape(tp *nn.HostTape, z, scale, base *nn.HVar, n, iters int, eps float64, head bool) (pre, post, comb *nn.HVar) {
	zz := tp.ScaleShift(z, scale, base, func(j int) int { return hyperGroup(j, n, head) })
	if head {
		return tp.Sigmoid(zz, 1, eps), nil, nil
	}
	pre = tp.Sigmoid(tp.Cols(zz, 0, n), 1, eps)
	post = tp.Sigmoid(tp.Cols(zz, n, 2*n), 2, 0)
	comb = tp.AddConst(tp.Softmax(tp.Cols(zz, 2*n, 2*n+n*n), n), eps)
	comb = tp.Normalize(comb, n, true, eps)
	for it := 1; it < iters; it++ {
		comb = tp.Normalize(comb, n, false, eps)
		comb = tp.Normalize(comb, n, true, eps)
	}
	return pre, post, comb
}

// hyperData is one case's operands on the host.
type hyperData struct {
	z, scale, base     []float64
	dpre, dpost, dcomb []float64
	dz, gscale, gbase  []float64 // the gradients' initial values
}

func newHyperData(r *rand.Rand, c hyperCase) hyperData {
	m := c.m()
	d := hyperData{
		z:     randn(r, c.N*m, 1.5),
		scale: randn(r, c.scales(), 0.8),
		base:  randn(r, m, 0.5),
		dpre:  randn(r, c.N*c.n, 1),
		dz:    randn(r, c.N*m, 0.3), gscale: randn(r, c.scales(), 0.3), gbase: randn(r, m, 0.3),
	}
	if !c.head {
		d.dpost, d.dcomb = randn(r, c.N*c.n, 1), randn(r, c.N*c.n*c.n, 1)
	}
	d.z, d.scale, d.base = rounded(d.z, c.dt), rounded(d.scale, c.dt), rounded(d.base, c.dt)
	d.dpre, d.dpost, d.dcomb = rounded(d.dpre, tensor.F32), rounded(d.dpost, tensor.F32), rounded(d.dcomb, tensor.F32)
	return d
}

// args uploads the forward's operands.
func (d hyperData) args(t *testing.T, b *Backend, c hyperCase, eps float32) backend.HyperWeightsArgs {
	a := backend.HyperWeightsArgs{
		Z: up(t, b, d.z, c.dt, c.N, c.m()), Scale: up(t, b, d.scale, c.dt, c.scales()),
		Base: up(t, b, d.base, c.dt, c.m()), Streams: c.n, Iters: c.iters, Eps: eps, Head: c.head,
		Pre: zeros(t, b, tensor.F32, c.N, c.n),
	}
	if !c.head {
		a.Post, a.Comb = zeros(t, b, tensor.F32, c.N, c.n), zeros(t, b, tensor.F32, c.N, c.n*c.n)
	}
	return a
}

// TestHyperWeights: the fused forward and every gradient of the backward equal the host
// tape's chain of ops, for F32 and BF16 operands, 1 to 8 streams, the head's mix.
func TestHyperWeights(t *testing.T) {
	const eps = 1e-6
	for i, c := range hyperCases {
		t.Run(c.String(), func(t *testing.T) {
			b := newTestBackend(t)
			r := rand.New(rand.NewPCG(uint64(i), 7))
			d := newHyperData(r, c)
			a := d.args(t, b, c, eps)
			must(t, b.HyperWeights(a))

			var tp nn.HostTape
			z, scale, base := tp.Leaf(d.z, c.N, c.m()), tp.Leaf(d.scale, 1, c.scales()), tp.Leaf(d.base, 1, c.m())
			pre, post, comb := hyperTape(&tp, z, scale, base, c.n, c.iters, float64(float32(eps)), c.head)
			approx(t, "Pre", down(t, b, a.Pre), pre.V, 1e-6, 1e-5)
			if !c.head {
				approx(t, "Post", down(t, b, a.Post), post.V, 1e-6, 1e-5)
				approx(t, "Comb", down(t, b, a.Comb), comb.V, 1e-6, 1e-5)
			}

			copy(pre.G, d.dpre)
			ba := backend.HyperWeightsBackwardArgs{HyperWeightsArgs: a,
				DPre: up(t, b, d.dpre, tensor.F32, c.N, c.n),
				DZ:   up(t, b, d.dz, c.dt, c.N, c.m()), GScale: up(t, b, d.gscale, c.dt, c.scales()),
				GBase: up(t, b, d.gbase, c.dt, c.m())}
			ba.Pre, ba.Post, ba.Comb = T{}, T{}, T{} // the backward reads none of the outputs
			if !c.head {
				copy(post.G, d.dpost)
				copy(comb.G, d.dcomb)
				ba.DPost = up(t, b, d.dpost, tensor.F32, c.N, c.n)
				ba.DComb = up(t, b, d.dcomb, tensor.F32, c.N, c.n*c.n)
			}
			tp.Backward()
			must(t, b.HyperWeightsBackward(ba))
			atol, rtol := dsv4Tol(c.dt)
			approx(t, "DZ", down(t, b, ba.DZ), accumulated(d.dz, z.G, c.dt), atol, rtol)
			approx(t, "GScale", down(t, b, ba.GScale), accumulated(d.gscale, scale.G, c.dt), atol, rtol)
			approx(t, "GBase", down(t, b, ba.GBase), accumulated(d.gbase, base.G, c.dt), atol, rtol)
		})
	}
}

// TestHyperWeightsFiniteDifferences: the backward's gradients of Z, Scale and Base equal
// central differences of the backend's own forward (L = Σ dPre·Pre + dPost·Post +
// dComb·Comb).
func TestHyperWeightsFiniteDifferences(t *testing.T) {
	const eps, h = 1e-3, 1e-3
	for i, c := range []hyperCase{
		{n: 4, N: 3, iters: 4, dt: tensor.F32},
		{n: 3, N: 2, iters: 20, dt: tensor.F32},
		{n: 2, N: 2, head: true, dt: tensor.F32},
	} {
		t.Run(c.String(), func(t *testing.T) {
			b := newTestBackend(t)
			r := rand.New(rand.NewPCG(uint64(i), 99))
			d := newHyperData(r, c)
			for _, v := range [][]float64{d.dz, d.gscale, d.gbase} {
				clear(v)
			}
			loss := func() float64 {
				a := d.args(t, b, c, eps)
				must(t, b.HyperWeights(a))
				s := 0.0
				for _, o := range []struct {
					t T
					g []float64
				}{{a.Pre, d.dpre}, {a.Post, d.dpost}, {a.Comb, d.dcomb}} {
					if o.t.IsNil() {
						continue
					}
					for k, v := range down(t, b, o.t) {
						s += v * o.g[k]
					}
				}
				return s
			}
			fd := func(x []float64) []float64 {
				g := make([]float64, len(x))
				for k := range x {
					old := x[k]
					x[k] = old + h
					lp := loss()
					x[k] = old - h
					lm := loss()
					x[k] = old
					g[k] = (lp - lm) / (2 * h)
				}
				return g
			}
			a := d.args(t, b, c, eps)
			ba := backend.HyperWeightsBackwardArgs{HyperWeightsArgs: a,
				DPre: up(t, b, d.dpre, tensor.F32, c.N, c.n),
				DZ:   zeros(t, b, tensor.F32, c.N, c.m()), GScale: zeros(t, b, tensor.F32, c.scales()),
				GBase: zeros(t, b, tensor.F32, c.m())}
			if !c.head {
				ba.DPost = up(t, b, d.dpost, tensor.F32, c.N, c.n)
				ba.DComb = up(t, b, d.dcomb, tensor.F32, c.N, c.n*c.n)
			}
			must(t, b.HyperWeightsBackward(ba))
			for _, g := range []struct {
				name string
				got  T
				x    []float64
			}{{"DZ", ba.DZ, d.z}, {"GScale", ba.GScale, d.scale}, {"GBase", ba.GBase, d.base}} {
				got, want := down(t, b, g.got), fd(g.x)
				if e := relErr(got, want); e > 2e-3 {
					t.Errorf("%s: relative error %.3g against finite differences\n got %.5g\nwant %.5g", g.name, e, got, want)
				}
			}
		})
	}
}

// TestHyperWeightsDeterministic: the parameter sums do not depend on how rows are shared out.
func TestHyperWeightsDeterministic(t *testing.T) {
	c := hyperCase{n: 4, N: 300, iters: 6, dt: tensor.F32}
	d := newHyperData(rand.New(rand.NewPCG(5, 5)), c)
	var first []float64
	for _, workers := range []int{1, 3, 8} {
		b := New(Options{Workers: workers})
		a := d.args(t, b, c, 1e-6)
		ba := backend.HyperWeightsBackwardArgs{HyperWeightsArgs: a,
			DPre: up(t, b, d.dpre, tensor.F32, c.N, c.n), DPost: up(t, b, d.dpost, tensor.F32, c.N, c.n),
			DComb: up(t, b, d.dcomb, tensor.F32, c.N, c.n*c.n),
			DZ:    zeros(t, b, tensor.F32, c.N, c.m()), GScale: zeros(t, b, tensor.F32, 3),
			GBase: zeros(t, b, tensor.F32, c.m())}
		must(t, b.HyperWeightsBackward(ba))
		got := append(down(t, b, ba.GScale), down(t, b, ba.GBase)...)
		b.Close()
		if first == nil {
			first = got
			continue
		}
		approx(t, fmt.Sprintf("%d workers", workers), got, first, 0, 0)
	}
}

type streamCase struct {
	N, n, C int
	dt      tensor.DType
}

var streamCases = []streamCase{
	{1, 1, 1, tensor.F32},
	{5, 4, 7, tensor.F32},
	{5, 4, 7, tensor.BF16},
	{3, 3, 33, tensor.F32},
	{2, 3, 33, tensor.BF16},
	{4, 1, 16, tensor.BF16},
}

// TestStreamCollapse: forward and both gradients equal the host tape's StreamCollapse.
func TestStreamCollapse(t *testing.T) {
	for i, c := range streamCases {
		t.Run(fmt.Sprintf("N%d_n%d_C%d_%v", c.N, c.n, c.C, c.dt), func(t *testing.T) {
			b := newTestBackend(t)
			r := rand.New(rand.NewPCG(uint64(i), 11))
			w := rounded(randn(r, c.N*c.n, 1), tensor.F32)
			x := rounded(randn(r, c.N*c.n*c.C, 1), c.dt)
			dout := rounded(randn(r, c.N*c.C, 1), c.dt)
			dw0, dx0 := randn(r, c.N*c.n, 0.5), randn(r, c.N*c.n*c.C, 0.5)

			W, X := up(t, b, w, tensor.F32, c.N, c.n), up(t, b, x, c.dt, c.N, c.n*c.C)
			out := zeros(t, b, c.dt, c.N, c.C)
			must(t, b.StreamCollapse(out, W, X))
			var tp nn.HostTape
			tw, tx := tp.Leaf(w, c.N, c.n), tp.Leaf(x, c.N, c.n*c.C)
			y := tp.StreamCollapse(tw, tx)
			atol, rtol := dsv4Tol(c.dt)
			approx(t, "Out", down(t, b, out), y.V, atol, rtol)

			copy(y.G, dout)
			tp.Backward()
			dW, dX := up(t, b, dw0, tensor.F32, c.N, c.n), up(t, b, dx0, c.dt, c.N, c.n*c.C)
			must(t, b.StreamCollapseBackward(dW, dX, up(t, b, dout, c.dt, c.N, c.C), W, X))
			approx(t, "dW", down(t, b, dW), accumulated(dw0, tw.G, tensor.F32), 1e-6, 1e-5)
			approx(t, "dX", down(t, b, dX), accumulated(dx0, tx.G, c.dt), atol, rtol)

			// Either gradient may be left out.
			dW2 := zeros(t, b, tensor.F32, c.N, c.n)
			must(t, b.StreamCollapseBackward(dW2, T{}, up(t, b, dout, c.dt, c.N, c.C), W, X))
			approx(t, "dW alone", down(t, b, dW2), tw.G, 1e-6, 1e-5)
		})
	}
}

// TestStreamExpand: forward (also in place over X) and all four gradients equal the host
// tape's StreamExpand.
func TestStreamExpand(t *testing.T) {
	for i, c := range streamCases {
		t.Run(fmt.Sprintf("N%d_n%d_C%d_%v", c.N, c.n, c.C, c.dt), func(t *testing.T) {
			b := newTestBackend(t)
			r := rand.New(rand.NewPCG(uint64(i), 13))
			N, n, C := c.N, c.n, c.C
			post := rounded(randn(r, N*n, 1), tensor.F32)
			comb := rounded(randn(r, N*n*n, 1), tensor.F32)
			f := rounded(randn(r, N*C, 1), c.dt)
			x := rounded(randn(r, N*n*C, 1), c.dt)
			dout := rounded(randn(r, N*n*C, 1), c.dt)
			init := [][]float64{randn(r, N*n, 0.5), randn(r, N*n*n, 0.5), randn(r, N*C, 0.5), randn(r, N*n*C, 0.5)}

			a := backend.StreamExpandArgs{Out: zeros(t, b, c.dt, N, n*C), Post: up(t, b, post, tensor.F32, N, n),
				F: up(t, b, f, c.dt, N, C), Comb: up(t, b, comb, tensor.F32, N, n*n), X: up(t, b, x, c.dt, N, n*C)}
			must(t, b.StreamExpand(a))
			var tp nn.HostTape
			tpost, tf, tcomb, tx := tp.Leaf(post, N, n), tp.Leaf(f, N, C), tp.Leaf(comb, N, n*n), tp.Leaf(x, N, n*C)
			y := tp.StreamExpand(tpost, tf, tcomb, tx)
			atol, rtol := dsv4Tol(c.dt)
			approx(t, "Out", down(t, b, a.Out), y.V, atol, rtol)

			copy(y.G, dout)
			tp.Backward()
			ba := backend.StreamExpandBackwardArgs{StreamExpandArgs: a, DOut: up(t, b, dout, c.dt, N, n*C),
				DPost: up(t, b, init[0], tensor.F32, N, n), DComb: up(t, b, init[1], tensor.F32, N, n*n),
				DF: up(t, b, init[2], c.dt, N, C), DX: up(t, b, init[3], c.dt, N, n*C)}
			must(t, b.StreamExpandBackward(ba))
			approx(t, "DPost", down(t, b, ba.DPost), accumulated(init[0], tpost.G, tensor.F32), 1e-6, 1e-5)
			approx(t, "DComb", down(t, b, ba.DComb), accumulated(init[1], tcomb.G, tensor.F32), 1e-6, 1e-5)
			approx(t, "DF", down(t, b, ba.DF), accumulated(init[2], tf.G, c.dt), atol, rtol)
			approx(t, "DX", down(t, b, ba.DX), accumulated(init[3], tx.G, c.dt), atol, rtol)

			// Any gradient may be left out.
			ba.DPost, ba.DComb, ba.DX = T{}, T{}, T{}
			ba.DF = zeros(t, b, c.dt, N, C)
			must(t, b.StreamExpandBackward(ba))
			approx(t, "DF alone", down(t, b, ba.DF), tf.G, atol, rtol)

			// In place: Out is X.
			a.Out = a.X
			must(t, b.StreamExpand(a))
			approx(t, "Out in place", down(t, b, a.X), y.V, atol, rtol)
		})
	}
}

// TestSqrtSoftplus: forward and backward equal the host tape's SqrtSoftplus, past torch's
// threshold of 20 too.
func TestSqrtSoftplus(t *testing.T) {
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			b := newTestBackend(t)
			r := rand.New(rand.NewPCG(3, uint64(dt)))
			x := randn(r, 3*37, 6)
			x = append(x, 19.5, 20, 20.5, 25, -30, -90)
			x = rounded(x, dt)
			cnt := len(x)
			X := up(t, b, x, dt, cnt)
			out := zeros(t, b, dt, cnt)
			must(t, b.SqrtSoftplus(out, X))
			var tp nn.HostTape
			tx := tp.Leaf(x, 1, cnt)
			y := tp.SqrtSoftplus(tx)
			atol, rtol := dsv4Tol(dt)
			approx(t, "out", down(t, b, out), y.V, atol, rtol)

			// The backward reads out as stored: the reference's derivative uses it too.
			stored := down(t, b, out)
			dout := rounded(randn(r, cnt, 1), dt)
			d0 := randn(r, cnt, 0.5)
			want := rounded(d0, dt)
			for i := range want {
				if stored[i] != 0 {
					want[i] += dout[i] * (1 / (1 + math.Exp(-x[i]))) / (2 * stored[i])
				}
			}
			dX := up(t, b, d0, dt, cnt)
			must(t, b.SqrtSoftplusBackward(dX, up(t, b, dout, dt, cnt), X, out))
			approx(t, "dX", down(t, b, dX), want, atol, rtol)
			if dt == tensor.F32 { // out as the tape holds it: the tape's own gradient
				copy(y.G, dout)
				tp.Backward()
				dX := up(t, b, d0, dt, cnt)
				must(t, b.SqrtSoftplusBackward(dX, up(t, b, dout, dt, cnt), X, out))
				approx(t, "dX vs tape", down(t, b, dX), accumulated(d0, tx.G, dt), atol, rtol)
			}
		})
	}
}

// TestSwiGLUClampedSplit: forward and both gradients equal the host tape's ClampSwiGLU, with
// inputs on both sides of the clamps and on their edges.
func TestSwiGLUClampedSplit(t *testing.T) {
	const limit = 3
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			b := newTestBackend(t)
			r := rand.New(rand.NewPCG(4, uint64(dt)))
			rows, cols := 5, 13
			g, u := randn(r, rows*cols, 3), randn(r, rows*cols, 3)
			g[0], u[0], g[1], u[1], u[2] = limit, limit, -limit, -limit, -limit-1
			g, u = rounded(g, dt), rounded(u, dt)
			G, U := up(t, b, g, dt, rows, cols), up(t, b, u, dt, rows, cols)
			out := zeros(t, b, dt, rows, cols)
			must(t, b.SwiGLUClampedSplit(out, G, U, limit))
			var tp nn.HostTape
			tg, tu := tp.Leaf(g, rows, cols), tp.Leaf(u, rows, cols)
			y := tp.ClampSwiGLU(tg, tu, limit)
			atol, rtol := dsv4Tol(dt)
			approx(t, "out", down(t, b, out), y.V, atol, rtol)

			dout := rounded(randn(r, rows*cols, 1), dt)
			copy(y.G, dout)
			tp.Backward()
			g0, u0 := randn(r, rows*cols, 0.5), randn(r, rows*cols, 0.5)
			DOut := up(t, b, dout, dt, rows, cols)
			dG, dU := up(t, b, g0, dt, rows, cols), up(t, b, u0, dt, rows, cols)
			must(t, b.SwiGLUClampedSplitBackward(dG, dU, DOut, G, U, limit))
			approx(t, "dGate", down(t, b, dG), accumulated(g0, tg.G, dt), atol, rtol)
			approx(t, "dUp", down(t, b, dU), accumulated(u0, tu.G, dt), atol, rtol)
			clamped := 0
			for i := range g {
				if g[i] > limit || math.Abs(u[i]) > limit {
					clamped++
				}
			}
			if clamped == 0 {
				t.Fatal("no input reached a clamp")
			}

			// Either gradient may be nil.
			dU = zeros(t, b, dt, rows, cols)
			must(t, b.SwiGLUClampedSplitBackward(T{}, dU, DOut, G, U, limit))
			approx(t, "dUp alone", down(t, b, dU), rounded(tu.G, dt), atol, rtol)
			dG = zeros(t, b, dt, rows, cols)
			must(t, b.SwiGLUClampedSplitBackward(dG, T{}, DOut, G, U, limit))
			approx(t, "dGate alone", down(t, b, dG), rounded(tg.G, dt), atol, rtol)
		})
	}
}

// TestDSV4HyperRefusesBadShapes: each op names the operand whose shape or dtype is wrong.
func TestDSV4HyperRefusesBadShapes(t *testing.T) {
	b := newTestBackend(t)
	f32 := func(shape ...int) T { return zeros(t, b, tensor.F32, shape...) }
	bf16 := func(shape ...int) T { return zeros(t, b, tensor.BF16, shape...) }
	const N, n, C = 3, 4, 5
	m := (2 + n) * n
	hw := func() backend.HyperWeightsArgs {
		return backend.HyperWeightsArgs{Z: f32(N, m), Scale: f32(3), Base: f32(m), Streams: n, Iters: 2, Eps: 1e-6,
			Pre: f32(N, n), Post: f32(N, n), Comb: f32(N, n*n)}
	}
	hb := func() backend.HyperWeightsBackwardArgs {
		a := hw()
		return backend.HyperWeightsBackwardArgs{HyperWeightsArgs: a, DPre: a.Pre, DPost: a.Post, DComb: a.Comb,
			DZ: f32(N, m), GScale: f32(3), GBase: f32(m)}
	}
	se := func() backend.StreamExpandArgs {
		return backend.StreamExpandArgs{Out: f32(N, n*C), Post: f32(N, n), F: f32(N, C), Comb: f32(N, n*n), X: f32(N, n*C)}
	}
	seb := func() backend.StreamExpandBackwardArgs {
		a := se()
		return backend.StreamExpandBackwardArgs{StreamExpandArgs: a, DOut: f32(N, n*C), DPost: f32(N, n),
			DComb: f32(N, n*n), DF: f32(N, C), DX: f32(N, n*C)}
	}
	for _, tc := range []struct {
		name, want string
		run        func() error
	}{
		{"hyper Z columns", "Z", func() error { a := hw(); a.Z = f32(N, m+1); return b.HyperWeights(a) }},
		{"hyper Scale", "Scale", func() error { a := hw(); a.Scale = f32(1); return b.HyperWeights(a) }},
		{"hyper Base", "Base", func() error { a := hw(); a.Base = f32(m - 1); return b.HyperWeights(a) }},
		{"hyper Pre bf16", "Pre", func() error { a := hw(); a.Pre = bf16(N, n); return b.HyperWeights(a) }},
		{"hyper Comb", "Comb", func() error { a := hw(); a.Comb = f32(N, n); return b.HyperWeights(a) }},
		{"hyper iterations", "iterations", func() error { a := hw(); a.Iters = 0; return b.HyperWeights(a) }},
		{"hyper streams", "streams", func() error { a := hw(); a.Streams = 0; return b.HyperWeights(a) }},
		{"head with Post", "Post", func() error {
			a := hw()
			a.Head, a.Z, a.Scale, a.Base, a.Comb = true, f32(N, n), f32(1), f32(n), T{}
			return b.HyperWeights(a)
		}},
		{"backward DZ", "DZ", func() error { a := hb(); a.DZ = f32(N+1, m); return b.HyperWeightsBackward(a) }},
		{"backward GBase", "GBase", func() error { a := hb(); a.GBase = f32(3); return b.HyperWeightsBackward(a) }},
		{"backward GScale", "GScale", func() error { a := hb(); a.GScale = T{}; return b.HyperWeightsBackward(a) }},
		{"backward DComb", "Comb", func() error { a := hb(); a.DComb = f32(N, n); return b.HyperWeightsBackward(a) }},
		{"collapse X", "X", func() error { return b.StreamCollapse(f32(N, C), f32(N, n), f32(N, n*C+1)) }},
		{"collapse W bf16", "weights", func() error { return b.StreamCollapse(f32(N, C), bf16(N, n), f32(N, n*C)) }},
		{"collapse out rows", "Y", func() error { return b.StreamCollapse(f32(N+1, C), f32(N, n), f32(N, n*C)) }},
		{"collapse backward dW", "dW", func() error {
			return b.StreamCollapseBackward(f32(N, n+1), T{}, f32(N, C), f32(N, n), f32(N, n*C))
		}},
		{"collapse backward dX", "dX", func() error {
			return b.StreamCollapseBackward(T{}, f32(N, C), f32(N, C), f32(N, n), f32(N, n*C))
		}},
		{"expand Comb", "Comb", func() error { a := se(); a.Comb = f32(N, n); return b.StreamExpand(a) }},
		{"expand Out", "Out", func() error { a := se(); a.Out = f32(N, C); return b.StreamExpand(a) }},
		{"expand F", "Y", func() error { a := se(); a.F = f32(N+1, C); return b.StreamExpand(a) }},
		{"expand backward DX", "DX", func() error { a := seb(); a.DX = f32(N, C); return b.StreamExpandBackward(a) }},
		{"expand backward DPost", "DPost", func() error { a := seb(); a.DPost = f32(N, 1); return b.StreamExpandBackward(a) }},
		{"expand backward DOut", "Out", func() error { a := seb(); a.DOut = f32(N, 1); return b.StreamExpandBackward(a) }},
		{"sqrt-softplus out", "out", func() error { return b.SqrtSoftplus(f32(3), f32(4)) }},
		{"sqrt-softplus backward dX", "dX", func() error { return b.SqrtSoftplusBackward(f32(3), f32(4), f32(4), f32(4)) }},
		{"sqrt-softplus backward x i32", "x", func() error {
			x := zeros(t, b, tensor.I32, 4)
			return b.SqrtSoftplusBackward(f32(4), f32(4), x, f32(4))
		}},
		{"swiglu up", "up", func() error { return b.SwiGLUClampedSplit(f32(4), f32(4), f32(5), 1) }},
		{"swiglu backward dUp", "dUp", func() error {
			return b.SwiGLUClampedSplitBackward(T{}, f32(5), f32(4), f32(4), f32(4), 1)
		}},
		{"swiglu backward dOut", "dOut", func() error {
			return b.SwiGLUClampedSplitBackward(f32(4), f32(4), f32(3), f32(4), f32(4), 1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.HasPrefix(err.Error(), "cpu: ") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q: want a cpu: error naming %s", err, tc.want)
			}
		})
	}
}

// TestDSV4HyperFills: the file's members are registered.
func TestDSV4HyperFills(t *testing.T) {
	b := newTestBackend(t)
	o := &backend.DSV4Ops{}
	for _, f := range dsv4Fills {
		f(b, o)
	}
	if o.HyperWeights == nil || o.HyperWeightsBackward == nil || o.StreamCollapse == nil ||
		o.StreamCollapseBackward == nil || o.StreamExpand == nil || o.StreamExpandBackward == nil ||
		o.SqrtSoftplus == nil || o.SqrtSoftplusBackward == nil || o.SwiGLUClampedSplit == nil ||
		o.SwiGLUClampedSplitBackward == nil {
		t.Fatal("a member of this file is not registered")
	}
}
