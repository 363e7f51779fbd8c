package cpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// refRoute is the router written the plain way: probabilities in fp64, experts sorted by
// (score descending, index ascending), groups likewise.
func refRoute(logits []float64, n, e int, r backend.MoERouting, bias []float64) (probs []float64, sel []int32, w []float64) {
	k := r.TopK
	probs = make([]float64, n*e)
	for t := range n {
		z := logits[t*e : (t+1)*e]
		p := probs[t*e : (t+1)*e]
		if r.Score == backend.RouterSigmoid {
			for j, v := range z {
				p[j] = 1 / (1 + math.Exp(-v))
			}
		} else {
			mx := slices.Max(z)
			s := 0.0
			for j, v := range z {
				p[j] = math.Exp(v - mx)
				s += p[j]
			}
			for j := range p {
				p[j] /= s
			}
		}
		score := make([]float64, e)
		for j := range score {
			score[j] = float64(float32(p[j]))
			if bias != nil {
				score[j] += bias[j]
			}
		}
		cand := make([]int, 0, e)
		if r.Grouped() {
			per := e / r.NGroup
			gs := make([]float64, r.NGroup)
			gi := make([]int, r.NGroup)
			for g := range r.NGroup {
				s := append([]float64(nil), score[g*per:(g+1)*per]...)
				sort.Sort(sort.Reverse(sort.Float64Slice(s)))
				gs[g], gi[g] = s[0], g
				if per > 1 {
					gs[g] += s[1]
				}
			}
			sort.SliceStable(gi, func(a, b int) bool { return gs[gi[a]] > gs[gi[b]] })
			// transformers' masked_fill: the other groups' experts score 0.
			kept := make([]bool, e)
			for _, g := range gi[:r.TopKGroup] {
				for j := g * per; j < (g+1)*per; j++ {
					kept[j] = true
				}
			}
			for j := range score {
				if !kept[j] {
					score[j] = 0
				}
			}
		}
		for j := range e {
			cand = append(cand, j)
		}
		sort.SliceStable(cand, func(a, b int) bool { return score[cand[a]] > score[cand[b]] })
		sum := 0.0
		for _, j := range cand[:k] {
			sel = append(sel, int32(j))
			sum += p[j]
		}
		if r.Score == backend.RouterSigmoid {
			sum += 1e-20
		}
		for _, j := range cand[:k] {
			v := p[j]
			if r.NormTopK {
				v /= sum
			}
			w = append(w, v*float64(r.Scaling()))
		}
	}
	return probs, sel, w
}

func ints32(t testing.TB, b *Backend, x T) []int32 {
	t.Helper()
	v, err := backend.ToInt32(b, x)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestMoERoute checks the router's selection, probabilities, weights, counts and probability
// sums against the plain reference, with hand-checked selections where ties or groups decide.
func TestMoERoute(t *testing.T) {
	tests := []struct {
		name    string
		r       backend.MoERouting
		n, e    int
		logits  []float64 // nil: random
		bias    []float64
		wantSel []int32 // nil: the reference's
	}{
		{name: "softmax K=2 norm", r: backend.MoERouting{TopK: 2, NormTopK: true}, n: 9, e: 6},
		{name: "softmax K=1", r: backend.MoERouting{TopK: 1}, n: 7, e: 5},
		{name: "softmax K=E", r: backend.MoERouting{TopK: 4, NormTopK: true}, n: 5, e: 4},
		{name: "softmax bias chooses", r: backend.MoERouting{TopK: 2}, n: 3, e: 4,
			logits:  []float64{0, 0, 0, 1, 2, 1, 0, 0, 0, 0, 0, 0},
			bias:    []float64{0, 0, 0.5, 0},
			wantSel: []int32{2, 3, 0, 2, 2, 0}},
		{name: "ties go to the lower index", r: backend.MoERouting{TopK: 3}, n: 2, e: 5,
			logits:  []float64{1, 1, 1, 1, 1, 0, 2, 0, 2, 0},
			wantSel: []int32{0, 1, 2, 1, 3, 0}},
		{name: "sigmoid bias norm scaled", r: backend.MoERouting{Score: backend.RouterSigmoid, TopK: 3, NormTopK: true, RoutedScaling: 2.5}, n: 8, e: 8,
			bias: []float64{0.1, -0.2, 0, 0.3, -0.1, 0.05, 0, -0.3}},
		{name: "sigmoid group-limited", r: backend.MoERouting{Score: backend.RouterSigmoid, TopK: 2, NormTopK: true, NGroup: 4, TopKGroup: 2}, n: 2, e: 8,
			// token 0: the groups score 1.0, 0.97, 1.24 and 0.54, so groups 2 and 0 are kept
			// although expert 2 (group 1) has the best single score; token 1: groups 0, 1 and
			// 2 tie, group 0 is kept beside group 3.
			logits:  []float64{0, 0, 3, -4, 0.5, 0.5, -1, -1, -1, -1, -1, -1, -1, -1, 2, 1},
			wantSel: []int32{4, 5, 6, 7}},
		{name: "group-limited random", r: backend.MoERouting{Score: backend.RouterSigmoid, TopK: 4, NGroup: 4, TopKGroup: 2}, n: 16, e: 16,
			bias: []float64{0, 0.1, 0, -0.1, 0.2, 0, 0, 0, -0.2, 0, 0.1, 0, 0, 0, 0.3, 0}},
		{name: "softmax groups of one", r: backend.MoERouting{TopK: 2, NGroup: 4, TopKGroup: 3}, n: 6, e: 4},
	}
	b := newTestBackend(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(tc.n), uint64(tc.e)))
			logits := tc.logits
			if logits == nil {
				logits = rounded(randn(rng, tc.n*tc.e, 1.5), tensor.F32)
			}
			k := tc.r.TopK
			a := backend.MoERouteArgs{
				MoERouting: tc.r,
				Logits:     up(t, b, logits, tensor.F32, tc.n, tc.e),
				Probs:      zeros(t, b, tensor.F32, tc.n, tc.e),
				Sel:        zeros(t, b, tensor.I32, tc.n, k),
				Weights:    zeros(t, b, tensor.F32, tc.n, k),
				Counts:     upInts(t, b, make([]int32, tc.e), tc.e),
				ProbSum:    zeros(t, b, tensor.F32, tc.e),
			}
			if tc.bias != nil {
				a.Bias = up(t, b, tc.bias, tensor.F32, tc.e)
			}
			must(t, b.MoERoute(a))
			must(t, b.MoERoute(a)) // counts accumulate over calls
			bias := tc.bias
			if bias != nil {
				bias = rounded(bias, tensor.F32)
			}
			probs, sel, w := refRoute(logits, tc.n, tc.e, tc.r, bias)
			if tc.wantSel != nil && !slices.Equal(sel, tc.wantSel) {
				t.Fatalf("reference selection %v, want %v (the test's expectation is wrong)", sel, tc.wantSel)
			}
			gotSel := ints32(t, b, a.Sel)
			if !slices.Equal(gotSel, sel) {
				t.Fatalf("sel %v, want %v", gotSel, sel)
			}
			approx(t, "probs", down(t, b, a.Probs), probs, 1e-7, 1e-6)
			approx(t, "weights", down(t, b, a.Weights), w, 1e-7, 1e-6)
			wantCounts := make([]int32, tc.e)
			for _, x := range sel {
				wantCounts[x] += 2
			}
			if got := ints32(t, b, a.Counts); !slices.Equal(got, wantCounts) {
				t.Fatalf("counts after two calls %v, want %v", got, wantCounts)
			}
			psum := make([]float64, tc.e)
			for i, p := range probs {
				psum[i%tc.e] += p
			}
			approx(t, "probSum", down(t, b, a.ProbSum), psum, 1e-6, 1e-6)
		})
	}
}

// TestMoERouteMatchesHostRouting pins the softmax router to the arithmetic of engine/nn's host
// routing: fp64 softmax rounded once, weights summed and divided in fp32 (bit for bit).
func TestMoERouteMatchesHostRouting(t *testing.T) {
	const n, e, k = 33, 7, 3
	b := newTestBackend(t)
	rng := rand.New(rand.NewPCG(3, 4))
	logits := f32s(randn(rng, n*e, 2))
	lt, err := backend.FromFloat32(b, logits, tensor.F32, n, e)
	must(t, err)
	a := backend.MoERouteArgs{MoERouting: backend.MoERouting{TopK: k, NormTopK: true}, Logits: lt}
	a.Probs, a.Sel, a.Weights = zeros(t, b, tensor.F32, n, e), zeros(t, b, tensor.I32, n, k), zeros(t, b, tensor.F32, n, k)
	must(t, b.MoERoute(a))
	probs, _ := backend.ToFloat32(b, a.Probs)
	sel := ints32(t, b, a.Sel)
	w, _ := backend.ToFloat32(b, a.Weights)
	for tok := range n {
		p := make([]float32, e)
		backend.Softmax64(p, logits[tok*e:(tok+1)*e])
		var sum float32
		for j := range k {
			sum += p[sel[tok*k+j]]
		}
		for j := range k {
			if want := p[sel[tok*k+j]] / sum; w[tok*k+j] != want {
				t.Fatalf("token %d weight %d = %v, want %v exactly", tok, j, w[tok*k+j], want)
			}
		}
		if !slices.Equal(probs[tok*e:(tok+1)*e], p) {
			t.Fatalf("token %d probs differ from the fp64 softmax rounded once", tok)
		}
	}
}

// TestMoERouteBackward compares the router's gradient with finite differences of
// sum(g * weights) + sum_n sum_e aux[e] * probs[n,e] with respect to the logits.
func TestMoERouteBackward(t *testing.T) {
	tests := []struct {
		name string
		r    backend.MoERouting
		aux  bool
		dt   tensor.DType
	}{
		{"softmax", backend.MoERouting{TopK: 2}, false, tensor.F32},
		{"softmax norm aux", backend.MoERouting{TopK: 3, NormTopK: true}, true, tensor.F32},
		{"softmax K=E norm", backend.MoERouting{TopK: 6, NormTopK: true}, false, tensor.F32},
		{"sigmoid norm scaled", backend.MoERouting{Score: backend.RouterSigmoid, TopK: 2, NormTopK: true, RoutedScaling: 1.5}, true, tensor.F32},
		{"sigmoid grouped", backend.MoERouting{Score: backend.RouterSigmoid, TopK: 2, NGroup: 3, TopKGroup: 2}, false, tensor.F32},
		{"softmax bf16 dlogits", backend.MoERouting{TopK: 2, NormTopK: true}, false, tensor.BF16},
	}
	const n, e = 5, 6
	b := newTestBackend(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(tc.r.TopK)))
			k := tc.r.TopK
			logits := rounded(randn(rng, n*e, 1), tensor.F32)
			g := randn(rng, n*k, 1)
			var aux []float64
			if tc.aux {
				aux = rounded(randn(rng, e, 0.5), tensor.F32)
			}
			fa := backend.MoERouteArgs{MoERouting: tc.r, Logits: up(t, b, logits, tensor.F32, n, e),
				Probs: zeros(t, b, tensor.F32, n, e), Sel: zeros(t, b, tensor.I32, n, k), Weights: zeros(t, b, tensor.F32, n, k)}
			must(t, b.MoERoute(fa))
			ba := backend.MoERouteBackwardArgs{MoERouting: tc.r, Probs: fa.Probs, Sel: fa.Sel, Weights: fa.Weights,
				DWeights: up(t, b, g, tensor.F32, n, k), DLogits: zeros(t, b, tc.dt, n, e)}
			if aux != nil {
				ba.AuxGrad = up(t, b, aux, tensor.F32, e)
			}
			must(t, b.MoERouteBackward(ba))
			_, sel, _ := refRoute(logits, n, e, tc.r, nil)
			// The objective with the selection held fixed.
			f := func(in [][]float64) []float64 {
				probs, _, _ := refRoute(in[0], n, e, tc.r, nil)
				var out []float64
				for tok := range n {
					sum := 0.0
					for j := range k {
						sum += probs[tok*e+int(sel[tok*k+j])]
					}
					if tc.r.Score == backend.RouterSigmoid {
						sum += 1e-20
					}
					for j := range k {
						v := probs[tok*e+int(sel[tok*k+j])]
						if tc.r.NormTopK {
							v /= sum
						}
						out = append(out, v*float64(tc.r.Scaling()))
					}
				}
				if aux != nil {
					out = append(out, probs...)
				}
				return out
			}
			gg := append([]float64(nil), g...)
			if aux != nil {
				for range n {
					gg = append(gg, aux...)
				}
			}
			want := fdGrad(f, [][]float64{append([]float64(nil), logits...)}, gg, 0)
			tol := 1e-5
			if tc.dt == tensor.BF16 {
				tol = 8e-3
			}
			approx(t, "dlogits", down(t, b, ba.DLogits), want, 1e-6, tol)
		})
	}
}

// TestMoEPermute checks the counting sort on uneven loads with an empty expert, K=1 and K=E,
// and the gather; its backward sums the slots of each token in k order.
func TestMoEPermute(t *testing.T) {
	tests := []struct {
		name        string
		e, k        int
		sel         []int32
		wantOffsets []int32
		wantOrder   []int32
	}{
		{name: "uneven, expert 1 empty", e: 4, k: 2,
			sel:         []int32{3, 0, 0, 2, 3, 2, 0, 3},
			wantOffsets: []int32{0, 3, 3, 5, 8},
			wantOrder:   []int32{0, 1, 3, 1, 2, 0, 2, 3}},
		{name: "K=1", e: 3, k: 1, sel: []int32{2, 2, 0, 2}, wantOffsets: []int32{0, 1, 1, 4}, wantOrder: []int32{2, 0, 1, 3}},
		{name: "K=E", e: 3, k: 3, sel: []int32{2, 0, 1, 0, 1, 2}, wantOffsets: []int32{0, 2, 4, 6}, wantOrder: []int32{0, 1, 0, 1, 0, 1}},
		{name: "all to one expert", e: 5, k: 1, sel: []int32{4, 4, 4}, wantOffsets: []int32{0, 0, 0, 0, 0, 3}, wantOrder: []int32{0, 1, 2}},
	}
	b := newTestBackend(t)
	for _, tc := range tests {
		for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
			t.Run(tc.name+"/"+dt.String(), func(t *testing.T) {
				n, s, c := len(tc.sel)/tc.k, len(tc.sel), 5
				rng := rand.New(rand.NewPCG(1, 2))
				x := rounded(randn(rng, n*c, 1), dt)
				a := backend.MoEPermuteArgs{E: tc.e, Sel: upInts(t, b, tc.sel, n, tc.k), X: up(t, b, x, dt, n, c),
					Offsets: zeros(t, b, tensor.I32, tc.e+1), Order: zeros(t, b, tensor.I32, s), Slot: zeros(t, b, tensor.I32, n, tc.k), Xs: zeros(t, b, dt, s, c)}
				must(t, b.MoEPermute(a))
				if got := ints32(t, b, a.Offsets); !slices.Equal(got, tc.wantOffsets) {
					t.Fatalf("offsets %v, want %v", got, tc.wantOffsets)
				}
				order := ints32(t, b, a.Order)
				if !slices.Equal(order, tc.wantOrder) {
					t.Fatalf("order %v, want %v", order, tc.wantOrder)
				}
				slot := ints32(t, b, a.Slot)
				for i, p := range slot {
					if order[p] != int32(i/tc.k) || i > 0 && tc.sel[i-1] == tc.sel[i] && slot[i-1] > p {
						t.Fatalf("slot %v is not the stable inverse of order %v", slot, order)
					}
				}
				xs := down(t, b, a.Xs)
				for p, src := range order {
					if !slices.Equal(xs[p*c:(p+1)*c], x[int(src)*c:int(src+1)*c]) {
						t.Fatalf("xs row %d is not x row %d", p, src)
					}
				}
				dxs := rounded(randn(rng, s*c, 1), dt)
				base := rounded(randn(rng, n*c, 1), tensor.F32)
				for _, acc := range []bool{false, true} {
					dx := up(t, b, base, tensor.F32, n, c)
					must(t, b.MoEPermuteBackward(backend.MoEPermuteBackwardArgs{DXs: up(t, b, dxs, dt, s, c), Slot: a.Slot, DX: dx, Accumulate: acc}))
					want := make([]float64, n*c)
					for tok := range n {
						for i := range c {
							var v float32
							for j := range tc.k {
								v += float32(dxs[int(slot[tok*tc.k+j])*c+i])
							}
							if acc {
								v = float32(base[tok*c+i]) + v
							}
							want[tok*c+i] = float64(v)
						}
					}
					approx(t, "dx", down(t, b, dx), want, 0, 0)
				}
			})
		}
	}
}

// TestMoECombine checks the weighted combine and its backward against direct sums.
func TestMoECombine(t *testing.T) {
	const n, k, c = 6, 2, 7
	b := newTestBackend(t)
	rng := rand.New(rand.NewPCG(5, 6))
	slot := rng.Perm(n * k)
	sl := make([]int32, n*k)
	for i, p := range slot {
		sl[i] = int32(p)
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			ys := rounded(randn(rng, n*k*c, 1), dt)
			w := rounded(randn(rng, n*k, 1), tensor.F32)
			dout := rounded(randn(rng, n*c, 1), dt)
			prev := rounded(randn(rng, n*c, 1), dt)
			for _, acc := range []bool{false, true} {
				out := up(t, b, prev, dt, n, c)
				a := backend.MoECombineArgs{Ys: up(t, b, ys, dt, n*k, c), Slot: upInts(t, b, sl, n, k), Weights: up(t, b, w, tensor.F32, n, k), Out: out, Accumulate: acc}
				must(t, b.MoECombine(a))
				want := make([]float64, n*c)
				for tok := range n {
					for i := range c {
						var v float32
						for j := range k {
							v += float32(w[tok*k+j]) * float32(ys[int(sl[tok*k+j])*c+i])
						}
						if acc {
							v += float32(prev[tok*c+i])
						}
						want[tok*c+i] = float64(v)
					}
				}
				approx(t, "out", down(t, b, out), rounded(want, dt), 1e-6, 1e-6)
				dys, dw := zeros(t, b, dt, n*k, c), zeros(t, b, tensor.F32, n, k)
				must(t, b.MoECombineBackward(backend.MoECombineBackwardArgs{DOut: up(t, b, dout, dt, n, c), Ys: a.Ys, Slot: a.Slot, Weights: a.Weights, DYs: dys, DWeights: dw}))
				wantDys := make([]float64, n*k*c)
				wantDw := make([]float64, n*k)
				for tok := range n {
					for j := range k {
						p := int(sl[tok*k+j])
						for i := range c {
							wantDys[p*c+i] = float64(float32(w[tok*k+j]) * float32(dout[tok*c+i]))
							wantDw[tok*k+j] += dout[tok*c+i] * ys[p*c+i]
						}
					}
				}
				approx(t, "dYs", down(t, b, dys), rounded(wantDys, dt), 1e-7, 1e-6)
				approx(t, "dWeights", down(t, b, dw), wantDw, 1e-6, 1e-6)
			}
		})
	}
}

// TestSwiGLUPacked: the packed op equals SwiGLU and SwiGLUBackward on the two halves, bit for
// bit, also with the backward written over its input.
func TestSwiGLUPacked(t *testing.T) {
	const r, w = 5, 6
	b := newTestBackend(t)
	rng := rand.New(rand.NewPCG(8, 9))
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			gu := rounded(randn(rng, r*2*w, 2), dt)
			var g, u []float64
			for row := range r {
				g = append(g, gu[row*2*w:row*2*w+w]...)
				u = append(u, gu[row*2*w+w:(row+1)*2*w]...)
			}
			d := rounded(randn(rng, r*w, 1), dt)
			out, ref := zeros(t, b, dt, r, w), zeros(t, b, dt, r, w)
			gt, ut := up(t, b, g, dt, r, w), up(t, b, u, dt, r, w)
			must(t, b.SwiGLUPacked(out, up(t, b, gu, dt, r, 2*w)))
			must(t, b.SwiGLU(ref, gt, ut))
			approx(t, "out", down(t, b, out), down(t, b, ref), 0, 0)
			must(t, b.SwiGLUBackward(gt, ut, up(t, b, d, dt, r, w), gt, ut))
			gut := up(t, b, gu, dt, r, 2*w)
			must(t, b.SwiGLUPackedBackward(gut, up(t, b, d, dt, r, w), gut))
			got := down(t, b, gut)
			dg, du := down(t, b, gt), down(t, b, ut)
			for row := range r {
				approx(t, "dGate", got[row*2*w:row*2*w+w], dg[row*w:(row+1)*w], 0, 0)
				approx(t, "dUp", got[row*2*w+w:(row+1)*2*w], du[row*w:(row+1)*w], 0, 0)
			}
		})
	}
}

// TestGeGLUPacked: the packed op equals GeGLU and GeGLUBackward on the two halves, bit for
// bit, also with the backward written over its input.
func TestGeGLUPacked(t *testing.T) {
	const r, w = 5, 6
	b := newTestBackend(t)
	rng := rand.New(rand.NewPCG(10, 11))
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			gu := rounded(randn(rng, r*2*w, 2), dt)
			var g, u []float64
			for row := range r {
				g = append(g, gu[row*2*w:row*2*w+w]...)
				u = append(u, gu[row*2*w+w:(row+1)*2*w]...)
			}
			d := rounded(randn(rng, r*w, 1), dt)
			out, ref := zeros(t, b, dt, r, w), zeros(t, b, dt, r, w)
			gt, ut := up(t, b, g, dt, r, w), up(t, b, u, dt, r, w)
			must(t, b.GeGLUPacked(out, up(t, b, gu, dt, r, 2*w)))
			must(t, b.GeGLU(ref, gt, ut))
			if slices.Equal(down(t, b, out), make([]float64, r*w)) {
				t.Fatal("GeGLUPacked wrote zeros")
			}
			approx(t, "out", down(t, b, out), down(t, b, ref), 0, 0)
			must(t, b.GeGLUBackward(gt, ut, up(t, b, d, dt, r, w), gt, ut))
			gut := up(t, b, gu, dt, r, 2*w)
			must(t, b.GeGLUPackedBackward(gut, up(t, b, d, dt, r, w), gut))
			got := down(t, b, gut)
			dg, du := down(t, b, gt), down(t, b, ut)
			for row := range r {
				approx(t, "dGate", got[row*2*w:row*2*w+w], dg[row*w:(row+1)*w], 0, 0)
				approx(t, "dUp", got[row*2*w+w:(row+1)*2*w], du[row*w:(row+1)*w], 0, 0)
			}
		})
	}
}

// TestMoERouteExpertScale: with ExpertScale a the router's weights are those without it times
// a[sel]; its backward gives the dlogits of the unscaled router for the gradient a[sel]*g (the
// chain rule through w = q*a), and dExpertScale[e] the sum over the slots choosing e of g*q,
// with and without the renormalisation and a routed scaling, softmax and sigmoid.
func TestMoERouteExpertScale(t *testing.T) {
	const n, e = 9, 6
	b := newTestBackend(t)
	rng := rand.New(rand.NewPCG(12, 13))
	for _, r := range []backend.MoERouting{
		{TopK: 2, NormTopK: true},
		{TopK: 1, NormTopK: true},
		{TopK: 3},
		{Score: backend.RouterSigmoid, TopK: 2, NormTopK: true, RoutedScaling: 2.5},
	} {
		k := r.TopK
		logits := up(t, b, randn(rng, n*e, 1.5), tensor.F32, n, e)
		a := make([]float64, e)
		for j := range a {
			a[j] = 1 + 0.4*rng.NormFloat64()
		}
		at := up(t, b, a, tensor.F32, e)
		route := func(scale T) (probs, sel, w T) {
			probs, sel, w = zeros(t, b, tensor.F32, n, e), zeros(t, b, tensor.I32, n, k), zeros(t, b, tensor.F32, n, k)
			must(t, b.MoERoute(backend.MoERouteArgs{MoERouting: r, Logits: logits, Probs: probs, Sel: sel, Weights: w, ExpertScale: scale}))
			return probs, sel, w
		}
		probs, sel, q := route(T{})
		_, sels, w := route(at)
		ids, err := backend.ToInt32(b, sel)
		must(t, err)
		idsScaled, err := backend.ToInt32(b, sels)
		must(t, err)
		if !slices.Equal(ids, idsScaled) {
			t.Fatalf("%+v: the expert scale changed the selection: %v, %v", r, idsScaled, ids)
		}
		qv, wv := down(t, b, q), down(t, b, w)
		want := make([]float64, n*k)
		for i, x := range ids {
			want[i] = float64(float32(qv[i]) * float32(a[x]))
		}
		approx(t, "weights", wv, rounded(want, tensor.F32), 0, 0)

		g := randn(rng, n*k, 1)
		ag, wantDA := make([]float64, n*k), make([]float64, e)
		for i, x := range ids {
			ag[i] = g[i] * float64(float32(a[x]))
			wantDA[x] += g[i] * qv[i]
		}
		dz, dzRef, da := zeros(t, b, tensor.F32, n, e), zeros(t, b, tensor.F32, n, e), zeros(t, b, tensor.F32, e)
		must(t, b.MoERouteBackward(backend.MoERouteBackwardArgs{MoERouting: r, Probs: probs, Sel: sel, Weights: w,
			DWeights: up(t, b, g, tensor.F32, n, k), DLogits: dz, ExpertScale: at, DExpertScale: da}))
		must(t, b.MoERouteBackward(backend.MoERouteBackwardArgs{MoERouting: r, Probs: probs, Sel: sel, Weights: q,
			DWeights: up(t, b, ag, tensor.F32, n, k), DLogits: dzRef}))
		approx(t, "dLogits", down(t, b, dz), down(t, b, dzRef), 1e-7, 1e-5)
		approx(t, "dExpertScale", down(t, b, da), wantDA, 1e-7, 1e-5)
		if slices.Equal(down(t, b, da), make([]float64, e)) {
			t.Fatalf("%+v: dExpertScale is all zeros", r)
		}
	}
	if err := b.MoERouteBackward(backend.MoERouteBackwardArgs{MoERouting: backend.MoERouting{TopK: 1}, Probs: zeros(t, b, tensor.F32, 2, 2),
		Sel: zeros(t, b, tensor.I32, 2, 1), Weights: zeros(t, b, tensor.F32, 2, 1), DWeights: zeros(t, b, tensor.F32, 2, 1),
		DLogits: zeros(t, b, tensor.F32, 2, 2), DExpertScale: zeros(t, b, tensor.F32, 2)}); err == nil || !strings.Contains(err.Error(), "needs the forward's expertScale") {
		t.Errorf("dExpertScale without expertScale: error %v", err)
	}
}

// TestMoEOpErrors: bad arguments get errors that name them.
func TestMoEOpErrors(t *testing.T) {
	b := newTestBackend(t)
	f := func(shape ...int) T { return zeros(t, b, tensor.F32, shape...) }
	i := func(shape ...int) T { return zeros(t, b, tensor.I32, shape...) }
	nan := up(t, b, []float64{0, math.NaN(), 1, 2}, tensor.F32, 2, 2)
	route := func(r backend.MoERouting, logits T) error {
		return b.MoERoute(backend.MoERouteArgs{MoERouting: r, Logits: logits, Probs: f(2, 2), Sel: i(2, r.TopK), Weights: f(2, r.TopK)})
	}
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"top-k above E", route(backend.MoERouting{TopK: 3}, f(2, 2)), "top-k 3 must be in [1, 2 experts]"},
		{"NaN router output", route(backend.MoERouting{TopK: 1}, nan), "token 0 is NaN"},
		{"groups do not divide", b.MoERoute(backend.MoERouteArgs{MoERouting: backend.MoERouting{TopK: 1, NGroup: 3, TopKGroup: 1}, Logits: f(2, 4)}), "NGroup 3 does not divide"},
		{"kept groups too small", b.MoERoute(backend.MoERouteArgs{MoERouting: backend.MoERouting{TopK: 3, NGroup: 2, TopKGroup: 1}, Logits: f(2, 4)}), "fewer than top-k 3"},
		{"sel outside the experts", b.MoEPermute(backend.MoEPermuteArgs{E: 2, Sel: upInts(t, b, []int32{0, 2}, 2, 1), X: f(2, 3), Offsets: i(3), Order: i(2), Slot: i(2, 1), Xs: f(2, 3)}),
			"slot 1 chooses expert 2, outside [0, 2)"},
		{"xs of another dtype", b.MoEPermute(backend.MoEPermuteArgs{E: 2, Sel: i(2, 1), X: f(2, 3), Offsets: i(3), Order: i(2), Slot: i(2, 1), Xs: zeros(t, b, tensor.BF16, 2, 3)}),
			"must have x's dtype"},
		{"combine weights missing", b.MoECombine(backend.MoECombineArgs{Ys: f(2, 3), Slot: i(2, 1), Out: f(2, 3)}), "weights is missing"},
		{"packed width odd", b.SwiGLUPacked(f(2, 1), f(2, 3)), "must be [R,2I]"},
	}
	for _, tc := range tests {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, tc.err, tc.want)
		}
	}
}

// TestMoERouteMaskedGroupsScoreZero: as transformers masks the experts of the groups it does not
// keep with 0 (not -inf), such an expert outranks a kept expert whose biased score is below 0.
func TestMoERouteMaskedGroupsScoreZero(t *testing.T) {
	b := newTestBackend(t)
	// sigmoid(4, -3, -1, -1) = 0.982, 0.047, 0.269, 0.269; with the bias 0.982, -0.053, 0.269,
	// 0.269: group 0 scores 0.929 and is kept over group 1 (0.538); the top-2 over
	// (0.982, -0.053, 0, 0) is expert 0, then expert 2 (a masked 0 above -0.053; ties to the
	// lower index).
	r := backend.MoERouting{Score: backend.RouterSigmoid, TopK: 2, NGroup: 2, TopKGroup: 1, NormTopK: true}
	logits := up(t, b, []float64{4, -3, -1, -1}, tensor.F32, 1, 4)
	bias := up(t, b, []float64{0, -0.1, 0, 0}, tensor.F32, 4)
	probs, sel, w := zeros(t, b, tensor.F32, 1, 4), zeros(t, b, tensor.I32, 1, 2), zeros(t, b, tensor.F32, 1, 2)
	must(t, b.MoERoute(backend.MoERouteArgs{MoERouting: r, Logits: logits, Bias: bias, Probs: probs, Sel: sel, Weights: w}))
	if got := ints32(t, b, sel); !slices.Equal(got, []int32{0, 2}) {
		t.Fatalf("selection %v, want [0 2]", got)
	}
}
