package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// softmaxCases are sink attention's cases and one whose mask hides every compressed entry of
// every query (mask "zero").
var softmaxCases = append(append([]sinkCase{}, sinkCases...),
	sinkCase{name: "compressed, mask hides all", n: 11, comp: 4, h: 3, d: 4, window: 2, rate: 2, mask: "zero"},
	sinkCase{name: "compressed, mask hides all, no window", n: 9, comp: 3, h: 2, d: 3, rate: 3, mask: "zero"})

// softmaxData is a sink attention case's operands plus its mask "zero".
func softmaxData(i int, c sinkCase, dt tensor.DType) sinkData {
	x := newSinkData(rand.New(rand.NewPCG(uint64(i), 11)), c, dt)
	if c.mask == "zero" {
		x.mask = make([]int32, c.n*c.comp)
	}
	return x
}

func (c sinkCase) scale() float64 { return float64(float32(1 / math.Sqrt(float64(c.d)))) }

// softmaxScores is X = Scale·Q·KVᵀ [N·H, S] with row t·H+h, rounded to F32.
func softmaxScores(c sinkCase, x sinkData) []float64 {
	s := c.n + c.comp
	out := make([]float64, c.n*c.h*s)
	for r := 0; r < c.n*c.h; r++ {
		for j := 0; j < s; j++ {
			out[r*s+j] = c.scale() * dot64f(x.q[r*c.d:(r+1)*c.d], x.kv[j*c.d:(j+1)*c.d])
		}
	}
	return rounded(out, tensor.F32)
}

func dot64f(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// softmaxRef is the contract's forward in float64: LSE (or lseIn, when given) and P.
func softmaxRef(c sinkCase, mask []int32, xs, sinks, lseIn []float64) (p, lse []float64) {
	s, allow := c.n+c.comp, sinkAllow(c, mask)
	p, lse = make([]float64, len(xs)), make([]float64, c.n*c.h)
	for r := range lse {
		t, h := r/c.h, r%c.h
		if lseIn != nil {
			lse[r] = lseIn[r]
		} else {
			z := math.Exp(sinks[h])
			for j := 0; j < s; j++ {
				if allow(t, j) {
					z += math.Exp(xs[r*s+j])
				}
			}
			lse[r] = math.Log(z)
		}
		for j := 0; j < s; j++ {
			if allow(t, j) {
				p[r*s+j] = math.Exp(xs[r*s+j] - lse[r])
			}
		}
	}
	return p, lse
}

// softmaxBackRef is the contract's backward in float64: DS and the GSinks increment.
func softmaxBackRef(c sinkCase, p, dp, sinks, lse []float64) (ds, gs []float64) {
	s := c.n + c.comp
	ds, gs = make([]float64, len(p)), make([]float64, c.h)
	for r := 0; r < c.n*c.h; r++ {
		dl := dot64f(p[r*s:(r+1)*s], dp[r*s:(r+1)*s])
		for j := 0; j < s; j++ {
			ds[r*s+j] = p[r*s+j] * (dp[r*s+j] - dl)
		}
		gs[r%c.h] -= math.Exp(sinks[r%c.h]-lse[r]) * dl
	}
	return ds, gs
}

// softmaxArgs uploads a case's forward operands; P starts at 7, so that an element left
// unwritten shows.
func softmaxArgs(t *testing.T, b *Backend, c sinkCase, x sinkData, xs []float64, dt tensor.DType) backend.SinkSoftmaxArgs {
	s := c.n + c.comp
	sevens := make([]float64, len(xs))
	for i := range sevens {
		sevens[i] = 7
	}
	a := backend.SinkSoftmaxArgs{
		X: up(t, b, xs, tensor.F32, c.n*c.h, s), Sinks: up(t, b, x.sinks, dt, c.h), Heads: c.h,
		Window: c.window, Rate: c.rate, P: up(t, b, sevens, dt, c.n*c.h, s), LSE: zeros(t, b, tensor.F32, c.n, c.h),
	}
	if x.mask != nil {
		a.Mask = upInts(t, b, x.mask, c.n, c.comp)
	}
	return a
}

// TestSinkSoftmax: P and LSE equal the contract's float64 forward, with LSE written and read;
// DS and GSinks (+=) its backward from the P and LSE as stored, with DS a tensor of its own and
// DS = P. F32 and BF16 P, DS, Sinks and GSinks; windows 0, 1 and more; masks that hide some,
// every or no compressed entry of a row; compressed entries nobody sees yet.
func TestSinkSoftmax(t *testing.T) {
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		atol, rtol := dsv4Tol(dt)
		for i, c := range softmaxCases {
			t.Run(dt.String()+"/"+c.name, func(t *testing.T) {
				b := newTestBackend(t)
				x := softmaxData(i, c, dt)
				xs := softmaxScores(c, x)
				s, R := c.n+c.comp, c.n*c.h
				a := softmaxArgs(t, b, c, x, xs, dt)
				must(t, b.SinkSoftmax(a))
				wantP, wantLSE := softmaxRef(c, x.mask, xs, x.sinks, nil)
				gotP, gotLSE := down(t, b, a.P), down(t, b, a.LSE)
				approx(t, "LSE", gotLSE, wantLSE, 1e-6, 1e-6)
				approx(t, "P", gotP, wantP, atol/10, rtol)
				allow := sinkAllow(c, x.mask)
				for r := 0; r < R; r++ {
					for j := 0; j < s; j++ {
						if !allow(r/c.h, j) && gotP[r*s+j] != 0 {
							t.Fatalf("P[%d,%d] = %g where hidden, want exactly 0", r, j, gotP[r*s+j])
						}
					}
				}

				// UseLSE: LSE is read (and left alone), P follows it.
				lseIn := make([]float64, R)
				for r := range lseIn {
					lseIn[r] = gotLSE[r] + 0.25*float64(r%3)
				}
				lseIn = rounded(lseIn, tensor.F32)
				au := softmaxArgs(t, b, c, x, xs, dt)
				au.UseLSE, au.LSE = true, up(t, b, lseIn, tensor.F32, c.n, c.h)
				must(t, b.SinkSoftmax(au))
				wantPU, _ := softmaxRef(c, x.mask, xs, x.sinks, lseIn)
				approx(t, "P (UseLSE)", down(t, b, au.P), wantPU, atol/10, rtol)
				approx(t, "LSE (UseLSE, read)", down(t, b, au.LSE), lseIn, 0, 0)

				// Backward from P and LSE as stored.
				dp := rounded(randn(rand.New(rand.NewPCG(uint64(i), 12)), R*s, 1), tensor.F32)
				ba := backend.SinkSoftmaxBackwardArgs{
					P: a.P, DP: up(t, b, dp, tensor.F32, R, s), Sinks: a.Sinks, LSE: a.LSE, Heads: c.h,
					DS: zeros(t, b, dt, R, s),
				}
				if !c.noGSinks {
					ba.GSinks = up(t, b, x.gs0, dt, c.h)
				}
				must(t, b.SinkSoftmaxBackward(ba))
				wantDS, wantGS := softmaxBackRef(c, gotP, dp, x.sinks, gotLSE)
				gotDS := down(t, b, ba.DS)
				approx(t, "DS", gotDS, wantDS, atol/10, rtol)
				if !c.noGSinks {
					approx(t, "GSinks (+=)", down(t, b, ba.GSinks), accumulated(x.gs0, wantGS, dt), atol, rtol)
				}

				// DS = P: the same values, in P's place.
				alias := up(t, b, gotP, dt, R, s)
				ba.P, ba.DS, ba.GSinks = alias, alias, T{}
				must(t, b.SinkSoftmaxBackward(ba))
				approx(t, "DS (in P's place)", down(t, b, alias), gotDS, 0, 0)
			})
		}
	}
}

// TestSinkSoftmaxComposesSinkAttention: the sink softmax of X = Scale·Q·KVᵀ, with the matrix
// products around it, gives the CPU backend's SinkAttention and SinkAttentionBackward: Out =
// P·KV and LSE; with DP = DOut·KVᵀ, DQ = Scale·DS·KV, DKV = Scale·DSᵀ·Q + Pᵀ·DOut and GSinks.
func TestSinkSoftmaxComposesSinkAttention(t *testing.T) {
	for i, c := range softmaxCases {
		t.Run(c.name, func(t *testing.T) {
			b := newTestBackend(t)
			x := softmaxData(i, c, tensor.F32)
			s, R, D := c.n+c.comp, c.n*c.h, c.d
			x.dq0, x.dkv0, x.gs0 = make([]float64, len(x.dq0)), make([]float64, len(x.dkv0)), make([]float64, c.h)
			out, lse, dq, dkv, gs := sinkRun(t, b, c, x, tensor.F32)

			a := softmaxArgs(t, b, c, x, softmaxScores(c, x), tensor.F32)
			must(t, b.SinkSoftmax(a))
			p := down(t, b, a.P)
			approx(t, "LSE", down(t, b, a.LSE), lse, 1e-6, 1e-6)
			pkv := make([]float64, R*D)
			dp := make([]float64, R*s)
			for r := 0; r < R; r++ {
				for j := 0; j < s; j++ {
					for e := 0; e < D; e++ {
						pkv[r*D+e] += p[r*s+j] * x.kv[j*D+e]
						dp[r*s+j] += x.dout[r*D+e] * x.kv[j*D+e]
					}
				}
			}
			approx(t, "Out = P·KV", pkv, out, 1e-5, 1e-5)

			ba := backend.SinkSoftmaxBackwardArgs{
				P: a.P, DP: up(t, b, dp, tensor.F32, R, s), Sinks: a.Sinks, LSE: a.LSE, Heads: c.h,
				DS: a.P, GSinks: zeros(t, b, tensor.F32, c.h),
			}
			if c.noGSinks {
				ba.GSinks = T{}
			}
			must(t, b.SinkSoftmaxBackward(ba))
			ds := down(t, b, ba.DS)
			gq, gkv := make([]float64, R*D), make([]float64, s*D)
			for r := 0; r < R; r++ {
				for j := 0; j < s; j++ {
					for e := 0; e < D; e++ {
						gq[r*D+e] += c.scale() * ds[r*s+j] * x.kv[j*D+e]
						gkv[j*D+e] += c.scale()*ds[r*s+j]*x.q[r*D+e] + p[r*s+j]*x.dout[r*D+e]
					}
				}
			}
			approx(t, "DQ = Scale·DS·KV", gq, dq, 1e-5, 1e-5)
			approx(t, "DKV = Scale·DSᵀ·Q + Pᵀ·DOut", gkv, dkv, 1e-5, 1e-5)
			if !c.noGSinks {
				approx(t, "GSinks", down(t, b, ba.GSinks), gs, 1e-5, 1e-5)
			}
		})
	}
}

// TestSinkSoftmaxSinkOnly: a sink far above every score takes the whole softmax (P 0, LSE the
// sink, DS 0, GSinks -Δ = 0) without NaNs.
func TestSinkSoftmaxSinkOnly(t *testing.T) {
	b := newTestBackend(t)
	c := sinkCase{n: 4, comp: 2, h: 2, d: 3, window: 2, rate: 2}
	x := softmaxData(1, c, tensor.F32)
	x.sinks[0], x.sinks[1] = 200, 150
	xs := softmaxScores(c, x)
	a := softmaxArgs(t, b, c, x, xs, tensor.F32)
	must(t, b.SinkSoftmax(a))
	wantP, wantLSE := softmaxRef(c, x.mask, xs, x.sinks, nil)
	approx(t, "P", down(t, b, a.P), wantP, 1e-30, 0)
	approx(t, "LSE", down(t, b, a.LSE), wantLSE, 0, 1e-7)
	s, R := c.n+c.comp, c.n*c.h
	ba := backend.SinkSoftmaxBackwardArgs{P: a.P, DP: up(t, b, randn(rand.New(rand.NewPCG(2, 3)), R*s, 1), tensor.F32, R, s),
		Sinks: a.Sinks, LSE: a.LSE, Heads: c.h, DS: a.P, GSinks: zeros(t, b, tensor.F32, c.h)}
	must(t, b.SinkSoftmaxBackward(ba))
	approx(t, "DS", down(t, b, ba.DS), make([]float64, R*s), 1e-30, 0)
	approx(t, "GSinks", down(t, b, ba.GSinks), make([]float64, c.h), 1e-30, 0)
}

// TestSinkSoftmaxDeterministic: the results do not depend on the number of workers, bit for
// bit.
func TestSinkSoftmaxDeterministic(t *testing.T) {
	c := sinkCases[len(sinkCases)-1]
	x := softmaxData(5, c, tensor.F32)
	xs := softmaxScores(c, x)
	s, R := c.n+c.comp, c.n*c.h
	dp := randn(rand.New(rand.NewPCG(5, 7)), R*s, 1)
	var first [][]float64
	for _, workers := range []int{1, 3, 8} {
		b := New(Options{Workers: workers})
		a := softmaxArgs(t, b, c, x, xs, tensor.F32)
		must(t, b.SinkSoftmax(a))
		p, lse := down(t, b, a.P), down(t, b, a.LSE)
		ba := backend.SinkSoftmaxBackwardArgs{P: a.P, DP: up(t, b, dp, tensor.F32, R, s), Sinks: a.Sinks, LSE: a.LSE,
			Heads: c.h, DS: zeros(t, b, tensor.F32, R, s), GSinks: up(t, b, x.gs0, tensor.F32, c.h)}
		must(t, b.SinkSoftmaxBackward(ba))
		got := [][]float64{p, lse, down(t, b, ba.DS), down(t, b, ba.GSinks)}
		b.Close()
		if first == nil {
			first = got
			continue
		}
		for k := range got {
			approx(t, fmt.Sprintf("%d workers", workers), got[k], first[k], 0, 0)
		}
	}
}

// TestSinkSoftmaxRejectsBadShapes: each malformed operand is refused with an error naming it.
func TestSinkSoftmaxRejectsBadShapes(t *testing.T) {
	b := newTestBackend(t)
	const n, comp, h = 4, 2, 2
	const s, R = n + comp, n * h
	f := func(dt tensor.DType, shape ...int) T { return zeros(t, b, dt, shape...) }
	fwd := func() backend.SinkSoftmaxArgs {
		return backend.SinkSoftmaxArgs{
			X: f(tensor.F32, R, s), Sinks: f(tensor.BF16, h), Mask: upInts(t, b, make([]int32, n*comp), n, comp),
			Heads: h, Window: 2, Rate: 2, P: f(tensor.BF16, R, s), LSE: f(tensor.F32, n, h),
		}
	}
	bwd := func() backend.SinkSoftmaxBackwardArgs {
		return backend.SinkSoftmaxBackwardArgs{
			P: f(tensor.BF16, R, s), DP: f(tensor.F32, R, s), Sinks: f(tensor.F32, h), LSE: f(tensor.F32, n, h),
			Heads: h, DS: f(tensor.F32, R, s), GSinks: f(tensor.BF16, h),
		}
	}
	must(t, b.SinkSoftmax(fwd()))
	must(t, b.SinkSoftmaxBackward(bwd()))
	check := func(t *testing.T, err error, want string) {
		t.Helper()
		if err == nil || !strings.HasPrefix(err.Error(), "cpu: ") || !strings.Contains(err.Error(), want) {
			t.Fatalf("got %v, want a cpu: error naming %s", err, want)
		}
	}
	for _, c := range []struct {
		name, want string
		edit       func(a *backend.SinkSoftmaxArgs)
	}{
		{"X dtype", "X", func(a *backend.SinkSoftmaxArgs) { a.X = f(tensor.BF16, R, s) }},
		{"X rows", "X", func(a *backend.SinkSoftmaxArgs) { a.X = f(tensor.F32, R+1, s) }},
		{"X rank", "X", func(a *backend.SinkSoftmaxArgs) { a.X = f(tensor.F32, R*s) }},
		{"X missing", "X", func(a *backend.SinkSoftmaxArgs) { a.X = T{} }},
		{"no heads", "heads", func(a *backend.SinkSoftmaxArgs) { a.Heads = 0 }},
		{"too few keys", "keys", func(a *backend.SinkSoftmaxArgs) { a.X, a.P = f(tensor.F32, R, n-1), f(tensor.F32, R, n-1) }},
		{"Rate", "Rate", func(a *backend.SinkSoftmaxArgs) { a.Rate = 0 }},
		{"Window", "window", func(a *backend.SinkSoftmaxArgs) { a.Window = -1 }},
		{"Sinks", "Sinks", func(a *backend.SinkSoftmaxArgs) { a.Sinks = f(tensor.F32, h+1) }},
		{"Mask shape", "Mask", func(a *backend.SinkSoftmaxArgs) { a.Mask = upInts(t, b, make([]int32, n*3), n, 3) }},
		{"Mask dtype", "Mask", func(a *backend.SinkSoftmaxArgs) { a.Mask = f(tensor.F32, n, comp) }},
		{"P shape", "P", func(a *backend.SinkSoftmaxArgs) { a.P = f(tensor.F32, R, s+1) }},
		{"P dtype", "P", func(a *backend.SinkSoftmaxArgs) { a.P = f(tensor.I32, R, s) }},
		{"LSE dtype", "LSE", func(a *backend.SinkSoftmaxArgs) { a.LSE = f(tensor.BF16, n, h) }},
		{"LSE shape", "LSE", func(a *backend.SinkSoftmaxArgs) { a.LSE = f(tensor.F32, h, n) }},
	} {
		t.Run("forward/"+c.name, func(t *testing.T) {
			a := fwd()
			c.edit(&a)
			check(t, b.SinkSoftmax(a), c.want)
		})
	}
	for _, c := range []struct {
		name, want string
		edit       func(a *backend.SinkSoftmaxBackwardArgs)
	}{
		{"no heads", "heads", func(a *backend.SinkSoftmaxBackwardArgs) { a.Heads = 0 }},
		{"P rows", "P", func(a *backend.SinkSoftmaxBackwardArgs) { a.P = f(tensor.F32, R+1, s) }},
		{"P missing", "P", func(a *backend.SinkSoftmaxBackwardArgs) { a.P = T{} }},
		{"DP dtype", "DP", func(a *backend.SinkSoftmaxBackwardArgs) { a.DP = f(tensor.BF16, R, s) }},
		{"DP shape", "DP", func(a *backend.SinkSoftmaxBackwardArgs) { a.DP = f(tensor.F32, R, s-1) }},
		{"DS", "DS", func(a *backend.SinkSoftmaxBackwardArgs) { a.DS = f(tensor.F32, R-1, s) }},
		{"Sinks", "Sinks", func(a *backend.SinkSoftmaxBackwardArgs) { a.Sinks = f(tensor.F32, h-1) }},
		{"LSE", "LSE", func(a *backend.SinkSoftmaxBackwardArgs) { a.LSE = f(tensor.F32, n+1, h) }},
		{"GSinks", "GSinks", func(a *backend.SinkSoftmaxBackwardArgs) { a.GSinks = f(tensor.F32, h, 2) }},
	} {
		t.Run("backward/"+c.name, func(t *testing.T) {
			a := bwd()
			c.edit(&a)
			check(t, b.SinkSoftmaxBackward(a), c.want)
		})
	}
}

// TestDSV4SoftmaxFills: the file's members are registered, which completes the CPU
// backend's DeepSeek-V4 ops.
func TestDSV4SoftmaxFills(t *testing.T) {
	b := newTestBackend(t)
	o := &backend.DSV4Ops{}
	for _, f := range dsv4Fills {
		f(b, o)
	}
	if o.SinkSoftmax == nil || o.SinkSoftmaxBackward == nil {
		t.Fatal("a member of this file is not registered")
	}
	if ok, missing := o.Complete(); !ok {
		t.Fatalf("DeepSeek-V4's ops still miss %s", missing)
	}
}
