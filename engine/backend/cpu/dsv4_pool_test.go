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

// windowPoolCase is one window pooling: N rows of W channels pooled Rate at a time.
type windowPoolCase struct {
	n, w, rate int
	overlap    bool
	dt         tensor.DType
}

func (c windowPoolCase) String() string {
	return fmt.Sprintf("N %d W %d rate %d overlap %v %s", c.n, c.w, c.rate, c.overlap, c.dt)
}

// windowPoolCases cover a trailing partial window, fewer rows than a window (no windows), rate
// 1, overlap and not, odd widths, f32 and bf16.
var windowPoolCases = []windowPoolCase{
	{n: 16, w: 6, rate: 4, dt: tensor.F32},
	{n: 18, w: 5, rate: 4, dt: tensor.F32},
	{n: 18, w: 10, rate: 4, overlap: true, dt: tensor.F32},
	{n: 13, w: 14, rate: 3, overlap: true, dt: tensor.F32},
	{n: 7, w: 3, rate: 1, dt: tensor.F32},
	{n: 7, w: 6, rate: 1, overlap: true, dt: tensor.F32},
	{n: 3, w: 4, rate: 4, overlap: true, dt: tensor.F32},
	{n: 2, w: 3, rate: 4, dt: tensor.F32},
	{n: 40, w: 9, rate: 8, dt: tensor.BF16},
	{n: 21, w: 18, rate: 4, overlap: true, dt: tensor.BF16},
}

// poolTol returns the absolute and relative tolerance of an output of dtype dt against the
// float64 tape: fp32 rounding, or one bf16 step of the result.
func poolTol(dt tensor.DType) (atol, rtol float64) {
	if dt == tensor.BF16 {
		return 1e-2, 1e-2
	}
	return 1e-6, 1e-5
}

// TestWindowPool compares the forward and every gradient (accumulated onto nonzero tensors)
// with nn.HostTape.WindowPool on the inputs as stored in the case's dtype.
func TestWindowPool(t *testing.T) {
	b := newTestBackend(t)
	for ci, c := range windowPoolCases {
		t.Run(c.String(), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(ci), 77))
			D := c.w
			if c.overlap {
				D = c.w / 2
			}
			nw := c.n / c.rate
			kv := rounded(randn(r, c.n*c.w, 1), c.dt)
			gate := rounded(randn(r, c.n*c.w, 1.5), c.dt)
			ape := rounded(randn(r, c.rate*c.w, 0.7), c.dt)
			dout := rounded(randn(r, nw*D, 1), c.dt)
			dkv0 := rounded(randn(r, c.n*c.w, 0.3), c.dt)
			dgate0 := rounded(randn(r, c.n*c.w, 0.3), c.dt)
			gape0 := rounded(randn(r, c.rate*c.w, 0.3), c.dt)

			tape := &nn.HostTape{}
			hkv := tape.Leaf(append([]float64(nil), kv...), c.n, c.w)
			hgate := tape.Leaf(append([]float64(nil), gate...), c.n, c.w)
			hape := tape.Leaf(append([]float64(nil), ape...), c.rate, c.w)
			y := tape.WindowPool(hkv, hgate, hape, c.rate, c.overlap)
			copy(y.G, dout)
			tape.Backward()

			fa := backend.WindowPoolArgs{
				KV: up(t, b, kv, c.dt, c.n, c.w), Gate: up(t, b, gate, c.dt, c.n, c.w),
				APE: up(t, b, ape, c.dt, c.rate, c.w), Rate: c.rate, Overlap: c.overlap,
				Out: zeros(t, b, c.dt, nw, D),
			}
			must(t, b.WindowPool(fa))
			atol, rtol := poolTol(c.dt)
			approx(t, "Out", down(t, b, fa.Out), y.V, atol, rtol)

			ba := backend.WindowPoolBackwardArgs{
				WindowPoolArgs: fa, DOut: up(t, b, dout, c.dt, nw, D),
				DKV: up(t, b, dkv0, c.dt, c.n, c.w), DGate: up(t, b, dgate0, c.dt, c.n, c.w),
				GAPE: up(t, b, gape0, c.dt, c.rate, c.w),
			}
			must(t, b.WindowPoolBackward(ba))
			plus := func(a, g []float64) []float64 {
				s := make([]float64, len(a))
				for i := range a {
					s[i] = a[i] + g[i]
				}
				return s
			}
			approx(t, "DKV", down(t, b, ba.DKV), plus(dkv0, hkv.G), atol, rtol)
			approx(t, "DGate", down(t, b, ba.DGate), plus(dgate0, hgate.G), atol, rtol)
			approx(t, "GAPE", down(t, b, ba.GAPE), plus(gape0, hape.G), atol, rtol)

			// Each gradient alone (the others absent) is the same.
			for _, only := range []string{"DKV", "DGate", "GAPE"} {
				one := ba
				one.DKV, one.DGate, one.GAPE = backend.T{}, backend.T{}, backend.T{}
				var want []float64
				switch only {
				case "DKV":
					one.DKV, want = zeros(t, b, c.dt, c.n, c.w), hkv.G
				case "DGate":
					one.DGate, want = zeros(t, b, c.dt, c.n, c.w), hgate.G
				case "GAPE":
					one.GAPE, want = zeros(t, b, c.dt, c.rate, c.w), hape.G
				}
				must(t, b.WindowPoolBackward(one))
				got := map[string]backend.T{"DKV": one.DKV, "DGate": one.DGate, "GAPE": one.GAPE}[only]
				approx(t, only+" alone", down(t, b, got), want, atol, rtol)
			}
		})
	}
}

// TestWindowPoolDeterministic: the backward gives the same bits run to run.
func TestWindowPoolDeterministic(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(5, 6))
	const n, w, rate = 203, 34, 4
	fa := backend.WindowPoolArgs{
		KV: up(t, b, randn(r, n*w, 1), tensor.F32, n, w), Gate: up(t, b, randn(r, n*w, 1), tensor.F32, n, w),
		APE: up(t, b, randn(r, rate*w, 1), tensor.F32, rate, w), Rate: rate, Overlap: true,
		Out: zeros(t, b, tensor.F32, n/rate, w/2),
	}
	must(t, b.WindowPool(fa))
	dout := up(t, b, randn(r, n/rate*w/2, 1), tensor.F32, n/rate, w/2)
	var first []float64
	for run := 0; run < 3; run++ {
		g := zeros(t, b, tensor.F32, rate, w)
		must(t, b.WindowPoolBackward(backend.WindowPoolBackwardArgs{WindowPoolArgs: fa, DOut: dout, GAPE: g}))
		got := down(t, b, g)
		if first == nil {
			first = got
			continue
		}
		for i := range got {
			if got[i] != first[i] {
				t.Fatalf("run %d: GAPE[%d] = %v, first run %v", run, i, got[i], first[i])
			}
		}
	}
}

// indexScoresCase is one indexer scoring: N queries of Hi heads of Di against n keys.
type indexScoresCase struct {
	n, keys, hi, di, rate int
	dt                    tensor.DType
}

func (c indexScoresCase) String() string {
	return fmt.Sprintf("N %d n %d Hi %d Di %d rate %d %s", c.n, c.keys, c.hi, c.di, c.rate, c.dt)
}

var indexScoresCases = []indexScoresCase{
	{n: 17, keys: 4, hi: 1, di: 8, rate: 4, dt: tensor.F32},
	{n: 19, keys: 4, hi: 3, di: 5, rate: 4, dt: tensor.F32},
	{n: 9, keys: 9, hi: 4, di: 16, rate: 1, dt: tensor.F32},
	{n: 12, keys: 7, hi: 2, di: 3, rate: 2, dt: tensor.F32}, // more keys than any query sees
	{n: 33, keys: 8, hi: 5, di: 12, rate: 4, dt: tensor.BF16},
}

// refIndexScores is DSV4.index's score loop in float64.
func refIndexScores(q, keys, wts []float64, N, n, Hi, Di, rate int) []float64 {
	out := make([]float64, N*n)
	for t := 0; t < N; t++ {
		limit := (t + 1) / rate
		for w := 0; w < n; w++ {
			if w >= limit {
				out[t*n+w] = math.Inf(-1)
				continue
			}
			s := 0.0
			for h := 0; h < Hi; h++ {
				d := 0.0
				for j := 0; j < Di; j++ {
					d += q[t*Hi*Di+h*Di+j] * keys[w*Di+j]
				}
				s += math.Max(d, 0) / math.Sqrt(float64(Di)) * wts[t*Hi+h] / math.Sqrt(float64(Hi))
			}
			out[t*n+w] = s
		}
	}
	return out
}

// TestIndexScores compares the scores with DSV4.index's loop: -Inf exactly where the query may
// not see the entry, fp32 rounding elsewhere.
func TestIndexScores(t *testing.T) {
	b := newTestBackend(t)
	for ci, c := range indexScoresCases {
		t.Run(c.String(), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(ci), 99))
			q := rounded(randn(r, c.n*c.hi*c.di, 1), c.dt)
			keys := rounded(randn(r, c.keys*c.di, 1), c.dt)
			wts := rounded(randn(r, c.n*c.hi, 1), c.dt)
			a := backend.IndexScoresArgs{
				Q: up(t, b, q, c.dt, c.n, c.hi*c.di), Keys: up(t, b, keys, c.dt, c.keys, c.di),
				Weights: up(t, b, wts, c.dt, c.n, c.hi), Heads: c.hi, Rate: c.rate,
				Out: up(t, b, randn(r, c.n*c.keys, 1), tensor.F32, c.n, c.keys),
			}
			must(t, b.IndexScores(a))
			got := down(t, b, a.Out)
			want := refIndexScores(q, keys, wts, c.n, c.keys, c.hi, c.di, c.rate)
			var gf, wf []float64
			for i := range want {
				if math.IsInf(want[i], -1) != math.IsInf(got[i], -1) {
					t.Fatalf("Out[%d,%d] = %v, want %v", i/c.keys, i%c.keys, got[i], want[i])
				}
				if !math.IsInf(want[i], -1) {
					gf, wf = append(gf, got[i]), append(wf, want[i])
				}
			}
			approx(t, "Out", gf, wf, 1e-6, 1e-5)
		})
	}
}

// TestDSV4PoolShapes: bad operands are refused with an error naming the operand.
func TestDSV4PoolShapes(t *testing.T) {
	b := newTestBackend(t)
	f := func(r, c int) backend.T { return zeros(t, b, tensor.F32, r, c) }
	i32 := func(r, c int) backend.T { return zeros(t, b, tensor.I32, r, c) }
	pool := func() backend.WindowPoolBackwardArgs {
		return backend.WindowPoolBackwardArgs{
			WindowPoolArgs: backend.WindowPoolArgs{KV: f(8, 6), Gate: f(8, 6), APE: f(4, 6), Rate: 4, Overlap: true, Out: f(2, 3)},
			DOut:           f(2, 3), DKV: f(8, 6), DGate: f(8, 6), GAPE: f(4, 6),
		}
	}
	index := func() backend.IndexScoresArgs {
		return backend.IndexScoresArgs{Q: f(8, 6), Keys: f(2, 3), Weights: f(8, 2), Heads: 2, Rate: 4, Out: f(8, 2)}
	}
	for _, tc := range []struct {
		name, want string
		edit       func(a *backend.WindowPoolBackwardArgs)
	}{
		{"gate rows", "Gate", func(a *backend.WindowPoolBackwardArgs) { a.Gate = f(7, 6) }},
		{"ape rows", "APE", func(a *backend.WindowPoolBackwardArgs) { a.APE = f(3, 6) }},
		{"out width", "Out", func(a *backend.WindowPoolBackwardArgs) { a.Out = f(2, 6) }},
		{"odd overlap", "even width", func(a *backend.WindowPoolBackwardArgs) {
			a.KV, a.Gate, a.APE = f(8, 5), f(8, 5), f(4, 5)
		}},
		{"rate", "rate", func(a *backend.WindowPoolBackwardArgs) { a.Rate = 0 }},
		{"int kv", "KV", func(a *backend.WindowPoolBackwardArgs) { a.KV = i32(8, 6) }},
		{"dout", "DOut", func(a *backend.WindowPoolBackwardArgs) { a.DOut = f(3, 3) }},
		{"dkv", "DKV", func(a *backend.WindowPoolBackwardArgs) { a.DKV = f(8, 3) }},
		{"dgate", "DGate", func(a *backend.WindowPoolBackwardArgs) { a.DGate = f(4, 6) }},
		{"gape", "GAPE", func(a *backend.WindowPoolBackwardArgs) { a.GAPE = f(2, 6) }},
	} {
		a := pool()
		tc.edit(&a)
		err := b.WindowPoolBackward(a)
		if err == nil || !strings.HasPrefix(err.Error(), "cpu: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("window-pool-backward, %s: error %v, want one from cpu naming %q", tc.name, err, tc.want)
		}
		if tc.name == "dout" || tc.name == "dkv" || tc.name == "dgate" || tc.name == "gape" {
			continue
		}
		err = b.WindowPool(a.WindowPoolArgs)
		if err == nil || !strings.HasPrefix(err.Error(), "cpu: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("window-pool, %s: error %v, want one from cpu naming %q", tc.name, err, tc.want)
		}
	}
	for _, tc := range []struct {
		name, want string
		edit       func(a *backend.IndexScoresArgs)
	}{
		{"q width", "Q", func(a *backend.IndexScoresArgs) { a.Q = f(8, 5) }},
		{"weights", "Weights", func(a *backend.IndexScoresArgs) { a.Weights = f(8, 3) }},
		{"bf16 out", "Out", func(a *backend.IndexScoresArgs) { a.Out = zeros(t, b, tensor.BF16, 8, 2) }},
		{"out keys", "Out", func(a *backend.IndexScoresArgs) { a.Out = f(8, 3) }},
		{"keys", "Keys", func(a *backend.IndexScoresArgs) { a.Keys = i32(2, 3) }},
		{"heads", "heads", func(a *backend.IndexScoresArgs) { a.Heads = 0 }},
		{"rate", "rate", func(a *backend.IndexScoresArgs) { a.Rate = 0 }},
	} {
		a := index()
		tc.edit(&a)
		err := b.IndexScores(a)
		if err == nil || !strings.HasPrefix(err.Error(), "cpu: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("index-scores, %s: error %v, want one from cpu naming %q", tc.name, err, tc.want)
		}
	}
}
