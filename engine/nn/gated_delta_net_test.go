package nn

import (
	"fmt"
	"math"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// gdnCase is one shape of gated delta-net under test.
type gdnCase struct {
	kh, vh, kd, vd, k int
	grouped           bool
}

func (c gdnCase) String() string {
	return fmt.Sprintf("KH%d_VH%d_KD%d_VD%d_K%d_grouped=%v", c.kh, c.vh, c.kd, c.vd, c.k, c.grouped)
}

var gdnCases = []gdnCase{
	{kh: 2, vh: 4, kd: 5, vd: 3, k: 3, grouped: true},
	{kh: 1, vh: 3, kd: 4, vd: 6, k: 4},
	{kh: 2, vh: 2, kd: 4, vd: 3, k: 2, grouped: true},
}

func newGDN(e *env, cc int, c gdnCase) *GatedDeltaNet {
	lin := func(out, in int) Linear { return Linear{W: e.randn(0.3, out, in), GW: e.zeros(out, in)} }
	d, vd := 2*c.kh*c.kd+c.vh*c.vd, c.vh*c.vd
	l := &GatedDeltaNet{Name: "gdn", Grouped: c.grouped, KH: c.kh, VH: c.vh, KD: c.kd, VD: c.vd, K: c.k, Eps: 1e-6,
		Out:  lin(cc, vd),
		Conv: e.randn(0.3, d, 1, c.k), GConv: e.zeros(d, 1, c.k),
		DtBias: e.randn(0.5, c.vh), GDtBias: e.zeros(c.vh),
		ALog: e.randn(0.5, c.vh), GALog: e.zeros(c.vh),
		NormW: e.ones(0.2, c.vd), GNormW: e.zeros(c.vd)}
	if c.grouped {
		l.QKVZ, l.BA = lin(d+vd, cc), lin(2*c.vh, cc)
	} else {
		l.QKV, l.Z, l.B, l.A = lin(d, cc), lin(vd, cc), lin(c.vh, cc), lin(c.vh, cc)
	}
	return l
}

func gdnLayer(l *GatedDeltaNet) layer {
	out := layer{
		fwd: func(p *Pass, x T, keep bool) (T, error) { return l.Forward(p, x, keep) },
		bwd: func(p *Pass, _ T, dy T) (T, error) { return l.Backward(p, dy) },
	}
	for _, lin := range []*Linear{&l.QKVZ, &l.BA, &l.QKV, &l.Z, &l.B, &l.A, &l.Out} {
		if !lin.W.IsNil() {
			out.param, out.grad = append(out.param, lin.W), append(out.grad, lin.GW)
		}
	}
	out.param = append(out.param, l.Conv, l.DtBias, l.ALog, l.NormW)
	out.grad = append(out.grad, l.GConv, l.GDtBias, l.GALog, l.GNormW)
	return out
}

// refGDN computes the layer in float64 the way transformers' torch path writes it: the
// projections split as fix_query_key_value_ordering (grouped) or in_proj_qkv/z/b/a lay them
// out, F.conv1d with padding K-1 cut to the sequence, silu, the gates, and
// torch_chunk_gated_delta_rule (chunks of 64: the UT transform by forward substitution, then
// the scan over chunks) per document, then the gated RMSNorm and out_proj.
func refGDN(e *env, l *GatedDeltaNet, x []float32, lens []int, cc int) []float64 {
	f64 := func(t T) []float64 {
		v := e.get(t)
		out := make([]float64, len(v))
		for i, x := range v {
			out[i] = float64(x)
		}
		return out
	}
	matvec := func(w []float64, out, in int, row []float32) []float64 {
		y := make([]float64, out)
		for o := range out {
			for i := range in {
				y[o] += w[o*in+i] * float64(row[i])
			}
		}
		return y
	}
	kh, vh, kd, vd, K := l.KH, l.VH, l.KD, l.VD, l.K
	r := vh / kh
	d := 2*kh*kd + vh*vd
	n := len(x) / cc
	mixed := make([][]float64, n)
	z, b, a := make([][]float64, n), make([][]float64, n), make([][]float64, n)
	for t := range n {
		row := x[t*cc : (t+1)*cc]
		if l.Grouped {
			qkvz := matvec(f64(l.QKVZ.W), d+vh*vd, cc, row)
			ba := matvec(f64(l.BA.W), 2*vh, cc, row)
			q, k, v, zz, bb, aa := []float64{}, []float64{}, []float64{}, []float64{}, []float64{}, []float64{}
			per := 2*kd + 2*r*vd
			for g := range kh {
				blk := qkvz[g*per : (g+1)*per]
				q = append(q, blk[:kd]...)
				k = append(k, blk[kd:2*kd]...)
				v = append(v, blk[2*kd:2*kd+r*vd]...)
				zz = append(zz, blk[2*kd+r*vd:]...)
				bb = append(bb, ba[g*2*r:g*2*r+r]...)
				aa = append(aa, ba[g*2*r+r:(g+1)*2*r]...)
			}
			mixed[t] = append(append(q, k...), v...)
			z[t], b[t], a[t] = zz, bb, aa
		} else {
			mixed[t] = matvec(f64(l.QKV.W), d, cc, row)
			z[t], b[t], a[t] = matvec(f64(l.Z.W), vh*vd, cc, row), matvec(f64(l.B.W), vh, cc, row), matvec(f64(l.A.W), vh, cc, row)
		}
	}
	conv, dt, alog, nw := f64(l.Conv), f64(l.DtBias), f64(l.ALog), f64(l.NormW)
	core := make([]float64, n*vh*vd)
	start := 0
	for _, ln := range lens {
		// Conv over the document, silu.
		u := make([][]float64, ln)
		for t := range ln {
			u[t] = make([]float64, d)
			for ch := range d {
				s := 0.0
				for j := range K {
					if src := t + j - (K - 1); src >= 0 {
						s += conv[ch*K+j] * mixed[start+src][ch]
					}
				}
				u[t][ch] = s / (1 + math.Exp(-s))
			}
		}
		l2 := func(v []float64) []float64 {
			ss := 0.0
			for _, x := range v {
				ss += x * x
			}
			out := make([]float64, len(v))
			for i, x := range v {
				out[i] = x / math.Sqrt(ss+1e-6)
			}
			return out
		}
		const C = 64
		nc := (ln + C - 1) / C
		for h := range vh {
			g := h / r
			// Per token: q̂ (scaled), k̂, v, β, decay log.
			Q, Kk, V := make([][]float64, nc*C), make([][]float64, nc*C), make([][]float64, nc*C)
			beta, gl := make([]float64, nc*C), make([]float64, nc*C)
			for t := range nc * C {
				Q[t], Kk[t], V[t] = make([]float64, kd), make([]float64, kd), make([]float64, vd)
				if t >= ln {
					continue // padding: zeros
				}
				q := l2(u[t][g*kd : (g+1)*kd])
				for i := range q {
					Q[t][i] = q[i] / math.Sqrt(float64(kd))
				}
				Kk[t] = l2(u[t][kh*kd+g*kd : kh*kd+(g+1)*kd])
				copy(V[t], u[t][2*kh*kd+h*vd:2*kh*kd+(h+1)*vd])
				beta[t] = 1 / (1 + math.Exp(-b[start+t][h]))
				sp := math.Log1p(math.Exp(a[start+t][h] + dt[h]))
				gl[t] = -math.Exp(alog[h]) * sp
			}
			S := make([]float64, kd*vd)
			for c := range nc {
				o := c * C
				G := make([]float64, C)
				acc := 0.0
				for i := range C {
					acc += gl[o+i]
					G[i] = acc
				}
				// attn = -(k_beta kᵀ ⊙ decay), strictly lower; forward substitution; + I.
				A := make([][]float64, C)
				for i := range C {
					A[i] = make([]float64, C)
					for j := range i {
						s := 0.0
						for m := range kd {
							s += Kk[o+i][m] * beta[o+i] * Kk[o+j][m]
						}
						A[i][j] = -s * math.Exp(G[i]-G[j])
					}
				}
				for i := 1; i < C; i++ {
					row := append([]float64(nil), A[i][:i]...)
					for j := range i {
						s := row[j]
						for m := range i {
							s += row[m] * A[m][j]
						}
						A[i][j] = s
					}
				}
				for i := range C {
					A[i][i] = 1
				}
				value := make([][]float64, C)
				kcum := make([][]float64, C)
				for i := range C {
					value[i], kcum[i] = make([]float64, vd), make([]float64, kd)
					for j := range C {
						for m := range vd {
							value[i][m] += A[i][j] * V[o+j][m] * beta[o+j]
						}
						for m := range kd {
							kcum[i][m] += A[i][j] * Kk[o+j][m] * beta[o+j] * math.Exp(G[j])
						}
					}
				}
				vnew := make([][]float64, C)
				for i := range C {
					vnew[i] = make([]float64, vd)
					for m := range vd {
						s := 0.0
						for p := range kd {
							s += kcum[i][p] * S[p*vd+m]
						}
						vnew[i][m] = value[i][m] - s
					}
				}
				for i := range C {
					t := o + i
					if t >= ln {
						break
					}
					for m := range vd {
						s := 0.0
						for p := range kd {
							s += Q[t][p] * math.Exp(G[i]) * S[p*vd+m]
						}
						for j := 0; j <= i; j++ {
							qk := 0.0
							for p := range kd {
								qk += Q[t][p] * Kk[o+j][p]
							}
							s += qk * math.Exp(G[i]-G[j]) * vnew[j][m]
						}
						core[(start+t)*vh*vd+h*vd+m] = s
					}
				}
				last := G[C-1]
				for p := range kd {
					for m := range vd {
						s := S[p*vd+m] * math.Exp(last)
						for j := range C {
							s += Kk[o+j][p] * math.Exp(last-G[j]) * vnew[j][m]
						}
						S[p*vd+m] = s
					}
				}
			}
		}
		start += ln
	}
	// Gated RMSNorm and out_proj.
	wo := f64(l.Out.W)
	y := make([]float64, n*cc)
	for t := range n {
		normed := make([]float64, vh*vd)
		for h := range vh {
			o := core[t*vh*vd+h*vd : t*vh*vd+(h+1)*vd]
			ss := 0.0
			for _, x := range o {
				ss += x * x
			}
			rs := 1 / math.Sqrt(ss/float64(vd)+float64(l.Eps))
			for j := range vd {
				zz := z[t][h*vd+j]
				normed[h*vd+j] = o[j] * rs * nw[j] * zz / (1 + math.Exp(-zz))
			}
		}
		for c := range cc {
			for i := range vh * vd {
				y[t*cc+c] += wo[c*vh*vd+i] * normed[i]
			}
		}
	}
	return y
}

// TestGatedDeltaNetMatchesChunkedRule checks the forward against transformers' chunked
// formulation computed independently, over documents shorter and longer than a chunk (the
// scan over chunks and the state kept across them).
func TestGatedDeltaNetMatchesChunkedRule(t *testing.T) {
	const C = 10
	lens := []int{5, 1, 70}
	for _, c := range gdnCases {
		t.Run(c.String(), func(t *testing.T) {
			e := newEnv(t)
			l := newGDN(e, C, c)
			p := e.pass(lens, 4)
			x := e.randn(1, p.N, C)
			y, err := l.Forward(p, x, false)
			if err != nil {
				t.Fatal(err)
			}
			got, want := e.get(y), refGDN(e, l, e.get(x), lens, C)
			for i := range want {
				if d := math.Abs(float64(got[i]) - want[i]); d > 1e-5+1e-5*math.Abs(want[i]) {
					t.Fatalf("y[%d] = %.7g, transformers' chunked rule gives %.7g", i, got[i], want[i])
				}
			}
		})
	}
}

// TestGatedDeltaNetGradients checks dx and every parameter gradient of L = Σ y·r against
// central differences of the float64 reference (refGDN) along random unit directions, with a
// document longer than stateChunk so that backward recomputes states from more than one kept
// state. (The layer is curved enough that the float32 differences of checkGradients' step
// are too coarse.)
func TestGatedDeltaNetGradients(t *testing.T) {
	const C = 8
	lens := []int{4, 1, stateChunk + 6}
	for _, c := range gdnCases {
		t.Run(c.String(), func(t *testing.T) {
			e := newEnv(t)
			l := newGDN(e, C, c)
			p := e.pass(lens, 4)
			x := e.randn(1, p.N, C)
			lay := gdnLayer(l)
			y, err := l.Forward(p, x, true)
			if err != nil {
				t.Fatal(err)
			}
			r := e.randn(1, y.Shape()...)
			rv := e.get(r)
			dx, err := l.Backward(p, r)
			if err != nil {
				t.Fatal(err)
			}
			objective := func() float64 {
				s := 0.0
				for i, v := range refGDN(e, l, e.get(x), lens, C) {
					s += v * float64(rv[i])
				}
				return s
			}
			targets, grads := append([]T{x}, lay.param...), append([]T{dx}, lay.grad...)
			for i := range targets {
				v0, g := e.get(targets[i]), e.get(grads[i])
				dir := make([]float64, len(v0))
				norm, analytic := 0.0, 0.0
				for j := range dir {
					dir[j] = e.rng.NormFloat64()
					norm += dir[j] * dir[j]
				}
				for j := range dir {
					dir[j] /= math.Sqrt(norm)
					analytic += dir[j] * float64(g[j])
				}
				const h = 1e-3
				eval := func(s float64) float64 {
					v := make([]float32, len(v0))
					for j := range v {
						v[j] = v0[j] + float32(s*dir[j])
					}
					e.set(targets[i], v)
					return objective()
				}
				numeric := (eval(h) - eval(-h)) / (2 * h)
				e.set(targets[i], v0)
				if math.Abs(numeric-analytic) > 1e-3+5e-3*math.Abs(numeric) {
					t.Errorf("target %d (0 is the input): directional derivative %.6g, gradient gives %.6g", i, numeric, analytic)
				}
			}
		})
	}
}

// TestGatedDeltaNetShortGradients runs the shared gradient check on short documents, where the
// layer is gentle enough for its float32 differences.
func TestGatedDeltaNetShortGradients(t *testing.T) {
	e := newEnv(t)
	l := newGDN(e, 6, gdnCases[0])
	p := e.pass([]int{3, 5}, 4)
	checkGradients(t, e, p, e.randn(1, p.N, 6), gdnLayer(l))
}

// TestGatedDeltaNetDecodingContinuesRows: a prefill of two documents with a cache, then a
// decoding pass of one token per row in the other order (StateRows), gives each new token
// the output a whole forward of its extended document gives; the conv inputs kept across the
// pass (K-1 of them, more than the one new token) and the recurrent state carry over. A
// slotted cache is refused.
func TestGatedDeltaNetDecodingContinuesRows(t *testing.T) {
	const C = 6
	for _, c := range gdnCases {
		t.Run(c.String(), func(t *testing.T) {
			e := newEnv(t)
			l := newGDN(e, C, c)
			a, b := e.get(e.randn(1, 5, C)), e.get(e.randn(1, 2, C))
			na, nb := e.get(e.randn(1, 1, C)), e.get(e.randn(1, 1, C))
			cache := []*KVCache{{}}
			pre := e.pass([]int{5, 2}, 4)
			pre.Cache = cache
			x := e.randn(0, 7, C)
			e.set(x, append(append([]float32{}, a...), b...))
			if _, err := l.Forward(pre, x, false); err != nil {
				t.Fatal(err)
			}
			step := e.pass([]int{1, 1}, 4)
			step.Cache, step.StateRows = cache, []int{1, 0} // row b's token first
			xs := e.randn(0, 2, C)
			e.set(xs, append(append([]float32{}, nb...), na...))
			y, err := l.Forward(step, xs, false)
			if err != nil {
				t.Fatal(err)
			}
			got := e.get(y)
			for j, doc := range [][]float32{append(b, nb...), append(a, na...)} {
				n := len(doc) / C
				full := e.pass([]int{n}, 4)
				xf := e.randn(0, n, C)
				e.set(xf, doc)
				yf, err := l.Forward(full, xf, false)
				if err != nil {
					t.Fatal(err)
				}
				want := e.get(yf)[(n-1)*C:]
				for i := range want {
					if d := math.Abs(float64(got[j*C+i] - want[i])); d > 1e-5 {
						t.Fatalf("row %d output %d: decoded %.6g, whole document %.6g", j, i, got[j*C+i], want[i])
					}
				}
			}
			if len(cache[0].Linear.S) != 2 {
				t.Errorf("state holds %d rows after a pass of 2", len(cache[0].Linear.S))
			}
			// A second step, rows in the same order: row b's conv now reads inputs from the
			// prefill and the first step.
			nb2, na2 := e.get(e.randn(1, 1, C)), e.get(e.randn(1, 1, C))
			step2 := e.pass([]int{1, 1}, 4)
			step2.Cache, step2.StateRows = cache, []int{0, 1}
			x2 := e.randn(0, 2, C)
			e.set(x2, append(append([]float32{}, nb2...), na2...))
			y2, err := l.Forward(step2, x2, false)
			if err != nil {
				t.Fatal(err)
			}
			got2 := e.get(y2)
			for j, doc := range [][]float32{append(append(b, nb...), nb2...), append(append(a, na...), na2...)} {
				n := len(doc) / C
				full := e.pass([]int{n}, 4)
				xf := e.randn(0, n, C)
				e.set(xf, doc)
				yf, err := l.Forward(full, xf, false)
				if err != nil {
					t.Fatal(err)
				}
				want := e.get(yf)[(n-1)*C:]
				for i := range want {
					if d := math.Abs(float64(got2[j*C+i] - want[i])); d > 1e-5 {
						t.Fatalf("second step, row %d output %d: decoded %.6g, whole document %.6g", j, i, got2[j*C+i], want[i])
					}
				}
			}
			slotted := e.pass([]int{1}, 4)
			slotted.Slots = &SlotCache{}
			if _, err := l.Forward(slotted, e.randn(1, 1, C), false); err == nil {
				t.Error("a slotted cache was accepted")
			}
		})
	}
}

// noGatedDelta is a backend without the gated delta rule op, to exercise the host recurrence.
type noGatedDelta struct{ backend.Backend }

func (u noGatedDelta) Optional() backend.Optional {
	o := u.Backend.Optional()
	o.GatedDelta, o.GatedDeltaBackward = nil, nil
	return o
}

// TestGatedDeltaNetBackendOpMatchesHost runs the layer forward and backward with its
// recurrence in the backend's GatedDelta op and on the host (the same backend without the op),
// the stages around it on the host in both, and compares y, dx and every gradient, over
// documents that cross the kept-state stretches.
func TestGatedDeltaNetBackendOpMatchesHost(t *testing.T) {
	const C = 8
	lens := []int{3, stateChunk + 9, 1, 2*stateChunk + 1}
	for _, c := range gdnCases {
		t.Run(c.String(), func(t *testing.T) {
			e := newEnv(t)
			l := newGDN(e, C, c)
			lay := gdnLayer(l)
			p0 := e.pass(lens, 4)
			x, dy := e.randn(1, p0.N, C), e.randn(1, p0.N, C)
			run := func(b backend.Backend) [][]float32 {
				for _, g := range lay.grad {
					e.set(g, make([]float32, g.Numel()))
				}
				p := e.pass(lens, 4)
				p.B = b
				y, err := l.Forward(p, x, true)
				if err != nil {
					t.Fatal(err)
				}
				dx, err := l.Backward(p, dy)
				if err != nil {
					t.Fatal(err)
				}
				out := [][]float32{e.get(y), e.get(dx)}
				for _, g := range lay.grad {
					out = append(out, e.get(g))
				}
				return out
			}
			dev, host := run(noGatedDeltaStages{e.b}), run(noGatedDelta{e.b})
			for i := range host {
				for j := range host[i] {
					if g, w := dev[i][j], host[i][j]; math.Abs(float64(g-w)) > 1e-4*(1+math.Abs(float64(w))) {
						t.Errorf("output %d (0 y, 1 dx, then the gradients) [%d]: op %g, host %g", i, j, g, w)
						break
					}
				}
			}
		})
	}
}

// noGatedDeltaStages is a backend without the gated delta-net stage ops (the prep and the
// gated norm) but with the recurrence op, to exercise the host stages around it.
type noGatedDeltaStages struct{ backend.Backend }

func (u noGatedDeltaStages) Optional() backend.Optional {
	o := u.Backend.Optional()
	o.GatedDeltaPrep, o.GatedDeltaPrepBackward, o.GatedRMSNorm, o.GatedRMSNormBackward = nil, nil, nil, nil
	return o
}

// castAll replaces every tensor of ts with a copy in dt.
func castAll(e *env, dt tensor.DType, ts ...*T) {
	for _, t := range ts {
		if t.IsNil() {
			continue
		}
		c, err := backend.FromFloat32(e.b, e.get(*t), dt, t.Shape()...)
		if err != nil {
			e.t.Fatal(err)
		}
		*t = c
	}
}

// TestGatedDeltaNetDeviceStagesMatchHost runs the layer forward and backward on its device path
// (every stage a backend op: the CPU backend's GatedDeltaPrep, GatedDelta and GatedRMSNorm) and
// on the host paths of the same layer — the float64 stages around the recurrence op, and
// everything in float64 on the host — and compares y, dx and every parameter gradient. The
// documents include single tokens and ones shorter than the conv kernel, and ones that cross
// the kept-state stretches. Bounds, per element against the reference w with rms(w) over its
// tensor: |got-w| <= tol·(|w| + rms(w)). Against the host stages (the same recurrence op) tol
// is 1e-5 in f32: the paths differ by the order of float64 sums and where a float32 rounding
// falls (they agree within 1e-6 here). Against the all-host path it is 1e-4 in f32, the bound
// of TestGatedDeltaNetBackendOpMatchesHost: the recurrence op's float32 operands and outputs,
// amplified over a document's steps. In bf16 tol is 1e-2 against either: both paths round to
// bf16 at the same places, but a value that lands one bf16 step (2^-8) away on one of them
// carries into what follows (they agree within 2e-3 here).
func TestGatedDeltaNetDeviceStagesMatchHost(t *testing.T) {
	const C = 8
	lens := []int{1, 2, stateChunk + 9, 1, 3, 2*stateChunk + 1}
	cases := append([]gdnCase{}, gdnCases...)
	cases = append(cases, gdnCase{kh: 1, vh: 2, kd: 6, vd: 4, k: 4})
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		for _, c := range cases {
			t.Run(dt.String()+"_"+c.String(), func(t *testing.T) {
				e := newEnv(t)
				l := newGDN(e, C, c)
				lay := gdnLayer(l)
				p0 := e.pass(lens, 4)
				x, dy := e.randn(1, p0.N, C), e.randn(1, p0.N, C)
				if dt != tensor.F32 {
					ts := []*T{&x, &dy, &l.Conv, &l.DtBias, &l.ALog, &l.NormW, &l.GConv, &l.GDtBias, &l.GALog, &l.GNormW}
					for _, lin := range l.Linears() {
						ts = append(ts, &lin.W, &lin.GW)
					}
					castAll(e, dt, ts...)
					lay = gdnLayer(l)
				}
				if !l.stagesOnDevice(&Pass{B: e.b}) || l.stagesOnDevice(&Pass{B: noGatedDeltaStages{e.b}}) {
					t.Fatal("the CPU backend does not offer the stage ops, or the wrapper does not hide them: this test compares nothing")
				}
				run := func(b backend.Backend) [][]float32 {
					for _, g := range lay.grad {
						raw, err := tensor.EncodeFloat32(g.DType(), make([]float32, g.Numel()))
						if err != nil {
							t.Fatal(err)
						}
						if err := e.b.Upload(g, raw); err != nil {
							t.Fatal(err)
						}
					}
					p := e.pass(lens, 4)
					p.B, p.DType = b, dt
					y, err := l.Forward(p, x, true)
					if err != nil {
						t.Fatal(err)
					}
					dx, err := l.Backward(p, dy)
					if err != nil {
						t.Fatal(err)
					}
					out := [][]float32{e.get(y), e.get(dx)}
					for _, g := range lay.grad {
						out = append(out, e.get(g))
					}
					return out
				}
				dev := run(e.b)
				for _, ref := range []struct {
					name     string
					b        backend.Backend
					tol, b16 float64
				}{{"host stages", noGatedDeltaStages{e.b}, 1e-5, 1e-2}, {"host", noGatedDelta{e.b}, 1e-4, 1e-2}} {
					tol := ref.tol
					if dt != tensor.F32 {
						tol = ref.b16
					}
					want := run(ref.b)
					for i := range want {
						rms := 0.0
						for _, w := range want[i] {
							rms += float64(w) * float64(w)
						}
						rms = math.Sqrt(rms / float64(len(want[i])))
						if rms == 0 {
							t.Errorf("output %d of the %s path is all zeros: nothing to compare", i, ref.name)
						}
						for j, w := range want[i] {
							if g := dev[i][j]; !(math.Abs(float64(g-w)) <= tol*(math.Abs(float64(w))+rms)) {
								t.Errorf("output %d (0 y, 1 dx, then the gradients) [%d]: device %g, %s %g", i, j, g, ref.name, w)
								break
							}
						}
					}
				}
			})
		}
	}
}

// transferCount is a backend that counts the bytes its callers move between host and device.
type transferCount struct {
	backend.Backend
	down, up *int
}

func (c transferCount) Download(dst []byte, src T) error {
	*c.down += len(dst)
	return c.Backend.Download(dst, src)
}

func (c transferCount) Upload(dst T, src []byte) error {
	*c.up += len(src)
	return c.Backend.Upload(dst, src)
}

// TestGatedDeltaNetDevicePathStaysOnDevice: a training pass (Forward with keep, then Backward)
// on the device path moves nothing between host and device, in either layout, while the host
// stages' path of the same layer downloads its rows (so the count sees the layer's transfers).
func TestGatedDeltaNetDevicePathStaysOnDevice(t *testing.T) {
	const C = 8
	lens := []int{1, 5, 2}
	for _, c := range gdnCases[:2] {
		t.Run(c.String(), func(t *testing.T) {
			e := newEnv(t)
			l := newGDN(e, C, c)
			p0 := e.pass(lens, 4)
			x, dy := e.randn(1, p0.N, C), e.randn(1, p0.N, C)
			moved := func(b backend.Backend) (down, up int) {
				p := e.pass(lens, 4)
				p.B = transferCount{b, &down, &up}
				if _, err := l.Forward(p, x, true); err != nil {
					t.Fatal(err)
				}
				if _, err := l.Backward(p, dy); err != nil {
					t.Fatal(err)
				}
				return down, up
			}
			if down, up := moved(e.b); down != 0 || up != 0 {
				t.Errorf("the device path downloaded %d and uploaded %d bytes", down, up)
			}
			if down, _ := moved(noGatedDeltaStages{e.b}); down == 0 {
				t.Error("the host stages' path downloaded nothing: the count does not see the layer's transfers")
			}
		})
	}
}
