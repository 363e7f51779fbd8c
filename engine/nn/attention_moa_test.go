package nn

import (
	"math"
	"sort"
	"strings"
	"testing"
)

const (
	moaC, moaE, moaK, moaNKV, moaHD = 8, 4, 2, 2, 4
)

// newMoA makes a random mixture of attention heads whose router gives every token of x a
// top-k with a clear gap (at least minGap between the K-th and the next logit), so that small
// perturbations keep the choice.
func newMoA(t *testing.T, e *env, x T, minGap float64) *MoA {
	t.Helper()
	q := moaNKV * moaHD
	m := &MoA{Name: "moa", E: moaE, TopK: moaK, NKV: moaNKV, HD: moaHD, Layer: 3,
		KV: Linear{W: e.randn(0.4, 2*q, moaC), GW: e.zeros(2*q, moaC)},
		WQ: e.randn(0.4, moaE, q, moaC), GWQ: e.zeros(moaE, q, moaC),
		WO: e.randn(0.4, moaE, moaC, q), GWO: e.zeros(moaE, moaC, q),
		Bias: e.randn(0.2, moaC), GBias: e.zeros(moaC)}
	xv := e.get(x)
	n := len(xv) / moaC
	for try := 0; ; try++ {
		if try == 100 {
			t.Fatal("no router with a clear top-k found")
		}
		w := e.randn(1, moaE, moaC)
		wv := e.get(w)
		gap := math.Inf(1)
		for tok := 0; tok < n; tok++ {
			l := make([]float64, moaE)
			for j := range l {
				for c := 0; c < moaC; c++ {
					l[j] += float64(wv[j*moaC+c]) * float64(xv[tok*moaC+c])
				}
			}
			sort.Sort(sort.Reverse(sort.Float64Slice(l)))
			gap = math.Min(gap, l[moaK-1]-l[moaK])
		}
		if gap >= minGap {
			m.Router = Linear{W: w, GW: e.zeros(moaE, moaC)}
			return m
		}
		_ = e.b.Free(w)
	}
}

// moaReference computes the block's output in float64 from the semantics of transformers'
// JetMoeAttention.
func moaReference(e *env, p *Pass, m *MoA, x T, lens []int) []float64 {
	xv, rw, kvw := e.get(x), e.get(m.Router.W), e.get(m.KV.W)
	wq, wo, bias := e.get(m.WQ), e.get(m.WO), e.get(m.Bias)
	inv := e.get(p.InvFreq)
	scaling := float64(p.AttentionScaling)
	n, c, hd, nkv, k := p.N, moaC, moaHD, moaNKV, moaK
	q := nkv * hd
	dot := func(w []float32, row int, t int) float64 {
		s := 0.0
		for i := 0; i < c; i++ {
			s += float64(w[row*c+i]) * float64(xv[t*c+i])
		}
		return s
	}
	pos, doc := make([]int, n), make([]int, n)
	for d, at := 0, 0; d < len(lens); d++ {
		for i := 0; i < lens[d]; i++ {
			pos[at], doc[at] = i, d
			at++
		}
	}
	rope := func(h []float64, t int) {
		half := hd / 2
		for i := 0; i < half; i++ {
			ang := float64(float32(pos[t]) * inv[i])
			co, si := math.Cos(ang)*scaling, math.Sin(ang)*scaling
			a, b := h[i], h[i+half]
			h[i], h[i+half] = a*co-b*si, b*co+a*si
		}
	}
	sel := make([][]int, n)
	gate := make([][]float64, n)
	qs := make([][][]float64, n) // [t][i*nkv+j][hd]
	ks, vs := make([][][]float64, n), make([][][]float64, n)
	for t := 0; t < n; t++ {
		l := make([]float64, moaE)
		idx := make([]int, moaE)
		for j := range l {
			l[j], idx[j] = dot(rw, j, t), j
		}
		sort.SliceStable(idx, func(a, b int) bool { return l[idx[a]] > l[idx[b]] })
		sel[t] = idx[:k]
		s := 0.0
		gate[t] = make([]float64, k)
		for i, ex := range sel[t] {
			gate[t][i] = math.Exp(l[ex] - l[sel[t][0]])
			s += gate[t][i]
		}
		for i := range gate[t] {
			gate[t][i] /= s
		}
		for _, ex := range sel[t] {
			for j := 0; j < nkv; j++ {
				h := make([]float64, hd)
				for d := range h {
					h[d] = dot(wq, ex*q+j*hd+d, t)
				}
				rope(h, t)
				qs[t] = append(qs[t], h)
			}
		}
		for j := 0; j < nkv; j++ {
			kh, vh := make([]float64, hd), make([]float64, hd)
			for d := range kh {
				kh[d] = dot(kvw, j*hd+d, t)
				vh[d] = dot(kvw, q+j*hd+d, t)
			}
			rope(kh, t)
			ks[t], vs[t] = append(ks[t], kh), append(vs[t], vh)
		}
	}
	out := make([]float64, n*c)
	for t := 0; t < n; t++ {
		for i, ex := range sel[t] {
			o := make([]float64, q)
			for j := 0; j < nkv; j++ {
				h := qs[t][i*nkv+j]
				var ss []float64
				var src []int
				mx := math.Inf(-1)
				for s := 0; s <= t; s++ {
					if doc[s] != doc[t] {
						continue
					}
					v := 0.0
					for d := 0; d < hd; d++ {
						v += h[d] * ks[s][j][d]
					}
					v /= math.Sqrt(float64(hd))
					ss, src = append(ss, v), append(src, s)
					mx = math.Max(mx, v)
				}
				z := 0.0
				for a := range ss {
					ss[a] = math.Exp(ss[a] - mx)
					z += ss[a]
				}
				for a, s := range src {
					for d := 0; d < hd; d++ {
						o[j*hd+d] += ss[a] / z * vs[s][j][d]
					}
				}
			}
			for r := 0; r < c; r++ {
				acc := 0.0
				for u := 0; u < q; u++ {
					acc += float64(wo[(ex*c+r)*q+u]) * o[u]
				}
				out[t*c+r] += gate[t][i] * acc
			}
		}
		for r := 0; r < c; r++ {
			out[t*c+r] += float64(bias[r])
		}
	}
	return out
}

func TestMoAForward(t *testing.T) {
	lens := []int{5, 3}
	e := newEnv(t)
	p := e.pass(lens, moaHD)
	x := e.randn(1, p.N, moaC)
	m := newMoA(t, e, x, 0)
	a := &Attention{Name: "attn", MoA: m}
	y, err := a.Forward(p, x, false)
	if err != nil {
		t.Fatal(err)
	}
	got := e.get(y)
	want := moaReference(e, p, m, x, lens)
	for i, w := range want {
		if math.Abs(float64(got[i])-w) > 1e-5*(1+math.Abs(w)) {
			t.Errorf("y[%d,%d] = %g, want %g", i/moaC, i%moaC, got[i], w)
		}
	}
}

func TestMoAGradients(t *testing.T) {
	lens := []int{5, 3}
	e := newEnv(t)
	p := e.pass(lens, moaHD)
	x := e.randn(1, p.N, moaC)
	m := newMoA(t, e, x, 0.25)
	a := &Attention{Name: "attn", MoA: m}
	l := layer{
		fwd:   func(p *Pass, x T, keep bool) (T, error) { return a.Forward(p, x, keep) },
		bwd:   func(p *Pass, _ T, dy T) (T, error) { return a.Backward(p, dy) },
		param: []T{m.Router.W, m.KV.W, m.WQ, m.WO, m.Bias},
		grad:  []T{m.Router.GW, m.KV.GW, m.GWQ, m.GWO, m.GBias},
	}
	checkGradients(t, e, p, x, l)
	// The router's gradient is not zero: the gates carry one.
	nz := false
	for _, v := range e.get(m.Router.GW) {
		nz = nz || v != 0
	}
	if !nz {
		t.Error("the router's gradient is zero")
	}
}

func TestMoAReleaseAndErrors(t *testing.T) {
	e := newEnv(t)
	p := e.pass([]int{5, 3}, moaHD)
	x := e.randn(1, p.N, moaC)
	m := newMoA(t, e, x, 0)
	a := &Attention{Name: "attn", MoA: m}
	before := e.b.MemStats().Allocated
	y, err := a.Forward(p, x, true)
	if err != nil {
		t.Fatal(err)
	}
	if held := e.b.MemStats().Allocated - before - y.Bytes(); held <= 0 {
		t.Errorf("a kept forward holds %d bytes of cache", held)
	}
	if _, err := a.Forward(p, x, true); err == nil || !strings.Contains(err.Error(), "moa") || !strings.Contains(err.Error(), "layer 3") {
		t.Errorf("a second forward: got %v, want an error naming the layer", err)
	}
	a.Release(p)
	_ = e.b.Free(y)
	if left := e.b.MemStats().Allocated - before; left != 0 {
		t.Errorf("%d bytes left after Release", left)
	}
	if _, err := a.Backward(p, y); err == nil || !strings.Contains(err.Error(), "moa") || !strings.Contains(err.Error(), "layer 3") {
		t.Errorf("a backward after Release: got %v, want an error naming the layer", err)
	}
	// A full forward and backward leaves nothing behind either.
	y, err = a.Forward(p, x, true)
	if err != nil {
		t.Fatal(err)
	}
	dx, err := a.Backward(p, y)
	if err != nil {
		t.Fatal(err)
	}
	_ = e.b.Free(y)
	_ = e.b.Free(dx)
	if left := e.b.MemStats().Allocated - before; left != 0 {
		t.Errorf("%d bytes left after Backward", left)
	}
	bad := *m
	bad.c = moaCache{}
	bad.TopK = 5
	if _, err := bad.Forward(p, x, false); err == nil || !strings.Contains(err.Error(), "layer 3") {
		t.Errorf("top-5 of 4: got %v, want an error naming the layer", err)
	}
}
