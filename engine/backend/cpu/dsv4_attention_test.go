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

// sinkCase is one sink attention: N queries of H heads of D, Comp compressed entries of Rate
// rows each, a Window (0: none) and a mask kind ("": none, "random": about half the entries
// with query row 1 seeing none and the last row every one).
type sinkCase struct {
	name                        string
	n, comp, h, d, window, rate int
	mask                        string
	noGSinks                    bool
}

var sinkCases = []sinkCase{
	{name: "one query", n: 1, h: 1, d: 3},
	{name: "one query, heads", n: 1, h: 3, d: 4, window: 2},
	{name: "own keys, no window", n: 7, h: 2, d: 5},
	{name: "own keys, window", n: 9, h: 3, d: 4, window: 3},
	{name: "window 1", n: 5, h: 2, d: 2, window: 1},
	{name: "compressed, no mask", n: 9, comp: 4, h: 3, d: 4, window: 4, rate: 2},
	{name: "compressed, mask", n: 10, comp: 3, h: 2, d: 7, rate: 3, mask: "random"},
	{name: "compressed, mask, window", n: 12, comp: 6, h: 4, d: 5, window: 3, rate: 2, mask: "random"},
	{name: "compressed, nobody sees yet", n: 3, comp: 1, h: 2, d: 3, window: 2, rate: 4},
	{name: "compressed, no GSinks", n: 8, comp: 2, h: 1, d: 9, window: 5, rate: 4, noGSinks: true},
	{name: "wider", n: 40, comp: 10, h: 4, d: 33, window: 16, rate: 4, mask: "random"},
}

// sinkData is one case's operands in float64 (as stored in their dtype).
type sinkData struct {
	q, kv, sinks, dout, dq0, dkv0, gs0 []float64
	mask                               []int32
}

func newSinkData(r *rand.Rand, c sinkCase, dt tensor.DType) sinkData {
	s := c.n + c.comp
	x := sinkData{
		q: rounded(randn(r, c.n*c.h*c.d, 1), dt), kv: rounded(randn(r, s*c.d, 1), dt),
		sinks: rounded(randn(r, c.h, 1), dt), dout: rounded(randn(r, c.n*c.h*c.d, 1), dt),
		dq0: rounded(randn(r, c.n*c.h*c.d, 1), dt), dkv0: rounded(randn(r, s*c.d, 1), dt),
		gs0: rounded(randn(r, c.h, 1), dt),
	}
	x.sinks[0] = 2 // a sink holding a good part of the weight
	if c.mask == "random" {
		x.mask = make([]int32, c.n*c.comp)
		for i := range x.mask {
			t := i / c.comp
			switch {
			case t == 1:
			case t == c.n-1:
				x.mask[i] = 1
			default:
				x.mask[i] = int32(r.IntN(2) * (1 + r.IntN(3)))
			}
		}
	}
	return x
}

// sinkAllow is the visibility rule of backend.SinkAttentionArgs, written as DSV4.attention
// builds it for the host tape.
func sinkAllow(c sinkCase, mask []int32) func(t, s int) bool {
	return func(t, s int) bool {
		if s < c.n {
			return s <= t && (c.window == 0 || t-s < c.window)
		}
		w := s - c.n
		return w < (t+1)/c.rate && (mask == nil || mask[t*c.comp+w] != 0)
	}
}

// sinkRef returns the host tape's output and gradients (DOut seeded) and the log-sum-exp.
func sinkRef(c sinkCase, x sinkData) (out, lse, dq, dkv, gs []float64) {
	tp := &nn.HostTape{}
	s := c.n + c.comp
	cp := func(v []float64) []float64 { return append([]float64(nil), v...) }
	q := tp.Leaf(cp(x.q), c.n, c.h*c.d)
	kv := tp.Leaf(cp(x.kv), s, c.d)
	sk := tp.Leaf(cp(x.sinks), 1, c.h)
	allow := sinkAllow(c, x.mask)
	scale := float64(float32(1 / math.Sqrt(float64(c.d))))
	y := tp.SinkAttention(q, kv, sk, allow, scale)
	copy(y.G, x.dout)
	tp.Backward()
	lse = make([]float64, c.n*c.h)
	for t := 0; t < c.n; t++ {
		for h := 0; h < c.h; h++ {
			z := math.Exp(x.sinks[h])
			for j := 0; j < s; j++ {
				if allow(t, j) {
					d := 0.0
					for e := 0; e < c.d; e++ {
						d += x.q[(t*c.h+h)*c.d+e] * x.kv[j*c.d+e]
					}
					z += math.Exp(d * scale)
				}
			}
			lse[t*c.h+h] = math.Log(z)
		}
	}
	return y.V, lse, q.G, kv.G, sk.G
}

// sinkRun runs the forward and the backward of c on b and returns Out, LSE, DQ, DKV and
// GSinks (nil without).
func sinkRun(t *testing.T, b *Backend, c sinkCase, x sinkData, dt tensor.DType) (out, lse, dq, dkv, gs []float64) {
	t.Helper()
	s := c.n + c.comp
	a := backend.SinkAttentionArgs{
		Q: up(t, b, x.q, dt, c.n, c.h*c.d), KV: up(t, b, x.kv, dt, s, c.d), Sinks: up(t, b, x.sinks, dt, c.h),
		Heads: c.h, Window: c.window, Rate: c.rate, Scale: float32(1 / math.Sqrt(float64(c.d))),
		Out: zeros(t, b, dt, c.n, c.h*c.d), LSE: zeros(t, b, tensor.F32, c.n, c.h),
	}
	if x.mask != nil {
		a.Mask = upInts(t, b, x.mask, c.n, c.comp)
	}
	must(t, b.SinkAttention(a))
	ba := backend.SinkAttentionBackwardArgs{
		SinkAttentionArgs: a, DOut: up(t, b, x.dout, dt, c.n, c.h*c.d),
		DQ: up(t, b, x.dq0, dt, c.n, c.h*c.d), DKV: up(t, b, x.dkv0, dt, s, c.d),
	}
	if !c.noGSinks {
		ba.GSinks = up(t, b, x.gs0, dt, c.h)
	}
	must(t, b.SinkAttentionBackward(ba))
	if !c.noGSinks {
		gs = down(t, b, ba.GSinks)
	}
	return down(t, b, a.Out), down(t, b, a.LSE), down(t, b, ba.DQ), down(t, b, ba.DKV), gs
}

func plus(a, b []float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		out[i] = a[i] + b[i]
	}
	return out
}

// TestSinkAttention: forward, LSE and every gradient (accumulated onto nonzero tensors) equal
// the float64 host tape's SinkAttention under DeepSeek-V4's visibility rule, in F32 to about
// 1e-5 and with BF16 operands to BF16's precision.
func TestSinkAttention(t *testing.T) {
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		tol := 1e-5
		if dt == tensor.BF16 {
			tol = 2e-2
		}
		for i, c := range sinkCases {
			t.Run(dt.String()+"/"+c.name, func(t *testing.T) {
				b := newTestBackend(t)
				x := newSinkData(rand.New(rand.NewPCG(uint64(i), 7)), c, dt)
				out, lse, dq, dkv, gs := sinkRun(t, b, c, x, dt)
				wOut, wLSE, wDQ, wDKV, wGS := sinkRef(c, x)
				approx(t, "Out", out, wOut, tol, tol)
				approx(t, "LSE", lse, wLSE, 1e-5, 1e-5)
				approx(t, "DQ (+=)", dq, plus(x.dq0, wDQ), tol, tol)
				approx(t, "DKV (+=)", dkv, plus(x.dkv0, wDKV), tol, tol)
				if !c.noGSinks {
					approx(t, "GSinks (+=)", gs, plus(x.gs0, wGS), tol, tol)
				}
			})
		}
	}
}

// TestSinkAttentionSinkOnly: a sink far above every score takes the whole softmax (Out 0,
// LSE the sink, no gradient but the sink's own) without NaNs.
func TestSinkAttentionSinkOnly(t *testing.T) {
	b := newTestBackend(t)
	c := sinkCase{n: 4, comp: 1, h: 2, d: 3, window: 2, rate: 2}
	x := newSinkData(rand.New(rand.NewPCG(3, 4)), c, tensor.F32)
	x.sinks[0], x.sinks[1] = 200, 150
	out, lse, dq, dkv, gs := sinkRun(t, b, c, x, tensor.F32)
	wOut, wLSE, wDQ, wDKV, wGS := sinkRef(c, x)
	approx(t, "Out", out, wOut, 1e-30, 0)
	approx(t, "LSE", lse, wLSE, 0, 1e-7)
	approx(t, "DQ", dq, plus(x.dq0, wDQ), 1e-6, 0)
	approx(t, "DKV", dkv, plus(x.dkv0, wDKV), 1e-6, 0)
	approx(t, "GSinks", gs, plus(x.gs0, wGS), 1e-6, 1e-6)
}

// TestSinkAttentionDeterministic: the results do not depend on the number of workers, bit
// for bit.
func TestSinkAttentionDeterministic(t *testing.T) {
	c := sinkCases[len(sinkCases)-1]
	x := newSinkData(rand.New(rand.NewPCG(5, 6)), c, tensor.F32)
	var first [][]float64
	for _, workers := range []int{1, 3, 8} {
		b := New(Options{Workers: workers})
		out, lse, dq, dkv, gs := sinkRun(t, b, c, x, tensor.F32)
		b.Close()
		got := [][]float64{out, lse, dq, dkv, gs}
		if first == nil {
			first = got
			continue
		}
		for k := range got {
			approx(t, fmt.Sprintf("%d workers", workers), got[k], first[k], 0, 0)
		}
	}
}

// TestSinkAttentionRejectsBadShapes: each malformed operand is refused with an error naming
// it.
func TestSinkAttentionRejectsBadShapes(t *testing.T) {
	b := newTestBackend(t)
	const n, comp, h, d = 4, 2, 2, 3
	f := func(dt tensor.DType, shape ...int) T { return zeros(t, b, dt, shape...) }
	good := func() backend.SinkAttentionBackwardArgs {
		return backend.SinkAttentionBackwardArgs{
			SinkAttentionArgs: backend.SinkAttentionArgs{
				Q: f(tensor.F32, n, h*d), KV: f(tensor.BF16, n+comp, d), Sinks: f(tensor.F32, h),
				Mask: upInts(t, b, make([]int32, n*comp), n, comp), Heads: h, Rate: 2, Scale: 1,
				Out: f(tensor.F32, n, h*d), LSE: f(tensor.F32, n, h),
			},
			DOut: f(tensor.F32, n, h*d), DQ: f(tensor.F32, n, h*d), DKV: f(tensor.F32, n+comp, d),
			GSinks: f(tensor.F32, h),
		}
	}
	must(t, b.SinkAttentionBackward(good()))
	cases := []struct {
		name, want string
		edit       func(a *backend.SinkAttentionBackwardArgs)
	}{
		{"Q columns", "Q", func(a *backend.SinkAttentionBackwardArgs) { a.Q = f(tensor.F32, n, h*d+1) }},
		{"KV rank", "KV", func(a *backend.SinkAttentionBackwardArgs) { a.KV = f(tensor.F32, (n+comp)*d) }},
		{"KV too short", "KV", func(a *backend.SinkAttentionBackwardArgs) { a.KV = f(tensor.F32, n-1, d) }},
		{"no heads", "heads", func(a *backend.SinkAttentionBackwardArgs) { a.Heads = 0 }},
		{"Sinks", "Sinks", func(a *backend.SinkAttentionBackwardArgs) { a.Sinks = f(tensor.F32, h+1) }},
		{"Mask shape", "Mask", func(a *backend.SinkAttentionBackwardArgs) { a.Mask = upInts(t, b, make([]int32, n*3), n, 3) }},
		{"Mask dtype", "Mask", func(a *backend.SinkAttentionBackwardArgs) { a.Mask = f(tensor.F32, n, comp) }},
		{"Rate", "Rate", func(a *backend.SinkAttentionBackwardArgs) { a.Rate = 0 }},
		{"Window", "window", func(a *backend.SinkAttentionBackwardArgs) { a.Window = -1 }},
		{"Out", "Out", func(a *backend.SinkAttentionBackwardArgs) { a.Out = f(tensor.F32, n+1, h*d) }},
		{"LSE dtype", "LSE", func(a *backend.SinkAttentionBackwardArgs) { a.LSE = f(tensor.BF16, n, h) }},
		{"DOut", "DOut", func(a *backend.SinkAttentionBackwardArgs) { a.DOut = f(tensor.F32, n, d) }},
		{"DQ", "DQ", func(a *backend.SinkAttentionBackwardArgs) { a.DQ = T{} }},
		{"DKV", "DKV", func(a *backend.SinkAttentionBackwardArgs) { a.DKV = f(tensor.F32, n, d) }},
		{"GSinks", "GSinks", func(a *backend.SinkAttentionBackwardArgs) { a.GSinks = f(tensor.F32, h, 2) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := good()
			c.edit(&a)
			errs := []error{b.SinkAttentionBackward(a)}
			if !strings.HasPrefix(c.want, "D") && c.want != "GSinks" { // the forward has no gradients
				errs = append(errs, b.SinkAttention(a.SinkAttentionArgs))
			}
			for _, err := range errs {
				if err == nil || !strings.HasPrefix(err.Error(), "cpu: ") || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("got %v, want an error naming %s", err, c.want)
				}
			}
		})
	}
}
