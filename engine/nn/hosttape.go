package nn

import (
	"fmt"
	"math"
)

// HostTape is a small reverse-mode differentiator over row-major float64 matrices held on the
// host. Every op appends its backward to the tape; Backward runs them in reverse and leaves in
// each HVar's G the gradient of the seeded outputs. It carries the layers whose forward mixes
// many small reductions (DeepSeek-V4's hyper-connections, compressors and indexer) that the
// backends have no fused ops for: each op below is written once with its exact derivative, and
// compositions of them are differentiated for free. Float64 keeps the host path well inside the
// tolerance of a float32 reference.
type HostTape struct {
	back []func()
}

// HVar is one tape value: an [R, C] matrix V and its gradient G (same length).
type HVar struct {
	V, G []float64
	R, C int
}

func newHVar(r, c int) *HVar {
	return &HVar{V: make([]float64, r*c), G: make([]float64, r*c), R: r, C: c}
}

// Leaf makes a value with a gradient and no inputs (a parameter or the embedding output).
func (t *HostTape) Leaf(v []float64, r, c int) *HVar {
	if len(v) != r*c {
		panic(fmt.Sprintf("nn: HostTape.Leaf: %d values for [%d %d]", len(v), r, c))
	}
	return &HVar{V: v, G: make([]float64, len(v)), R: r, C: c}
}

// Backward runs every recorded backward in reverse order. Seed the outputs' G first.
func (t *HostTape) Backward() {
	for i := len(t.back) - 1; i >= 0; i-- {
		t.back[i]()
	}
	t.back = nil
}

func (t *HostTape) rec(f func()) { t.back = append(t.back, f) }

// Linear returns x w^T for x [R, K] and w [M, K].
func (t *HostTape) Linear(x, w *HVar) *HVar {
	if x.C != w.C {
		panic(fmt.Sprintf("nn: HostTape.Linear: x [%d %d], w [%d %d]", x.R, x.C, w.R, w.C))
	}
	R, K, M := x.R, x.C, w.R
	y := newHVar(R, M)
	for r := 0; r < R; r++ {
		xr := x.V[r*K : (r+1)*K]
		for m := 0; m < M; m++ {
			wm := w.V[m*K : (m+1)*K]
			s := 0.0
			for k, v := range xr {
				s += v * wm[k]
			}
			y.V[r*M+m] = s
		}
	}
	t.rec(func() {
		for r := 0; r < R; r++ {
			xr, gx := x.V[r*K:(r+1)*K], x.G[r*K:(r+1)*K]
			for m := 0; m < M; m++ {
				g := y.G[r*M+m]
				if g == 0 {
					continue
				}
				wm, gw := w.V[m*K:(m+1)*K], w.G[m*K:(m+1)*K]
				for k := range xr {
					gx[k] += g * wm[k]
					gw[k] += g * xr[k]
				}
			}
		}
	})
	return y
}

// AddRow returns x [R, C] plus the row vector b [C] on every row (a linear layer's bias).
func (t *HostTape) AddRow(x, b *HVar) *HVar {
	if len(b.V) != x.C {
		panic(fmt.Sprintf("nn: HostTape.AddRow: [%d %d] plus %d", x.R, x.C, len(b.V)))
	}
	y := newHVar(x.R, x.C)
	for i, v := range x.V {
		y.V[i] = v + b.V[i%x.C]
	}
	t.rec(func() {
		for i, g := range y.G {
			x.G[i] += g
			b.G[i%x.C] += g
		}
	})
	return y
}

// GroupedLinear splits each row of x [R, G*K] into G groups and multiplies group g by its
// block w_g [M, K] of w [G*M, K], giving [R, G*M] (DeepSeek-V4's grouped output projection).
func (t *HostTape) GroupedLinear(x, w *HVar, groups int) *HVar {
	K := x.C / groups
	M := w.R / groups
	if x.C != groups*K || w.R != groups*M || w.C != K {
		panic(fmt.Sprintf("nn: HostTape.GroupedLinear: x [%d %d], w [%d %d], %d groups", x.R, x.C, w.R, w.C, groups))
	}
	y := newHVar(x.R, groups*M)
	for r := 0; r < x.R; r++ {
		for g := 0; g < groups; g++ {
			xr := x.V[r*x.C+g*K : r*x.C+(g+1)*K]
			for m := 0; m < M; m++ {
				wm := w.V[(g*M+m)*K : (g*M+m+1)*K]
				s := 0.0
				for k, v := range xr {
					s += v * wm[k]
				}
				y.V[r*y.C+g*M+m] = s
			}
		}
	}
	t.rec(func() {
		for r := 0; r < x.R; r++ {
			for g := 0; g < groups; g++ {
				o := r*x.C + g*K
				for m := 0; m < M; m++ {
					gy := y.G[r*y.C+g*M+m]
					if gy == 0 {
						continue
					}
					wo := (g*M + m) * K
					for k := 0; k < K; k++ {
						x.G[o+k] += gy * w.V[wo+k]
						w.G[wo+k] += gy * x.V[o+k]
					}
				}
			}
		}
	})
	return y
}

// Add returns a + b (same shape).
func (t *HostTape) Add(a, b *HVar) *HVar {
	if len(a.V) != len(b.V) {
		panic("nn: HostTape.Add: shapes differ")
	}
	y := newHVar(a.R, a.C)
	for i := range y.V {
		y.V[i] = a.V[i] + b.V[i]
	}
	t.rec(func() {
		for i, g := range y.G {
			a.G[i] += g
			b.G[i] += g
		}
	})
	return y
}

// Rows gathers rows idx of w [R, C] into [len(idx), C] (an embedding lookup, or the tokens
// routed to one expert); the backward scatters the gradient back.
func (t *HostTape) Rows(w *HVar, idx []int) *HVar {
	C := w.C
	y := newHVar(len(idx), C)
	for i, r := range idx {
		copy(y.V[i*C:(i+1)*C], w.V[r*C:(r+1)*C])
	}
	t.rec(func() {
		for i, r := range idx {
			gw, gy := w.G[r*C:(r+1)*C], y.G[i*C:(i+1)*C]
			for c := range gy {
				gw[c] += gy[c]
			}
		}
	})
	return y
}

// ScatterRows returns the [rows, C] sum of parts[i] added at rows idx[i] (each part [len(idx[i]), C]).
func (t *HostTape) ScatterRows(rows, C int, parts []*HVar, idx [][]int) *HVar {
	y := newHVar(rows, C)
	for p, part := range parts {
		for i, r := range idx[p] {
			dst, src := y.V[r*C:(r+1)*C], part.V[i*C:(i+1)*C]
			for c := range dst {
				dst[c] += src[c]
			}
		}
	}
	t.rec(func() {
		for p, part := range parts {
			for i, r := range idx[p] {
				gs, gy := part.G[i*C:(i+1)*C], y.G[r*C:(r+1)*C]
				for c := range gs {
					gs[c] += gy[c]
				}
			}
		}
	})
	return y
}

// ConcatRows stacks a [Ra, C] on b [Rb, C].
func (t *HostTape) ConcatRows(a, b *HVar) *HVar {
	if a.C != b.C {
		panic("nn: HostTape.ConcatRows: widths differ")
	}
	y := newHVar(a.R+b.R, a.C)
	copy(y.V, a.V)
	copy(y.V[len(a.V):], b.V)
	t.rec(func() {
		for i := range a.G {
			a.G[i] += y.G[i]
		}
		for i := range b.G {
			b.G[i] += y.G[len(a.G)+i]
		}
	})
	return y
}

// Cols returns columns [lo, hi) of x.
func (t *HostTape) Cols(x *HVar, lo, hi int) *HVar {
	w := hi - lo
	y := newHVar(x.R, w)
	for r := 0; r < x.R; r++ {
		copy(y.V[r*w:(r+1)*w], x.V[r*x.C+lo:r*x.C+hi])
	}
	t.rec(func() {
		for r := 0; r < x.R; r++ {
			for c := 0; c < w; c++ {
				x.G[r*x.C+lo+c] += y.G[r*w+c]
			}
		}
	})
	return y
}

// RMSNorm normalises each run of n consecutive values of x (a row, or a head of a row):
// v * rsqrt(mean(v²) + eps), times w [n] when w is not nil.
func (t *HostTape) RMSNorm(x *HVar, n int, w *HVar, eps float64) *HVar {
	if len(x.V)%n != 0 || (w != nil && len(w.V) != n) {
		panic(fmt.Sprintf("nn: HostTape.RMSNorm: [%d %d] in runs of %d", x.R, x.C, n))
	}
	y := newHVar(x.R, x.C)
	runs := len(x.V) / n
	rstd := make([]float64, runs)
	for i := 0; i < runs; i++ {
		v := x.V[i*n : (i+1)*n]
		s := 0.0
		for _, a := range v {
			s += a * a
		}
		rs := 1 / math.Sqrt(s/float64(n)+eps)
		rstd[i] = rs
		for j, a := range v {
			o := a * rs
			if w != nil {
				o *= w.V[j]
			}
			y.V[i*n+j] = o
		}
	}
	t.rec(func() {
		for i := 0; i < runs; i++ {
			v, gv, gy := x.V[i*n:(i+1)*n], x.G[i*n:(i+1)*n], y.G[i*n:(i+1)*n]
			rs := rstd[i]
			// h = v*rs; dL/dh = gy*w; dv = rs*(dh - h*mean(dh*h)).
			dot := 0.0
			for j := range v {
				dh := gy[j]
				if w != nil {
					w.G[j] += gy[j] * v[j] * rs
					dh *= w.V[j]
				}
				dot += dh * v[j] * rs
			}
			dot /= float64(n)
			for j := range v {
				dh := gy[j]
				if w != nil {
					dh *= w.V[j]
				}
				gv[j] += rs * (dh - v[j]*rs*dot)
			}
		}
	})
	return y
}

// Rope rotates, in every head of width hd of each row r of x, the trailing 2*len(inv) channels
// by pairs (2i, 2i+1) at angle sign*pos[r]*inv[i] (DeepSeek-V4's interleaved partial RoPE;
// sign -1 undoes it).
func (t *HostTape) Rope(x *HVar, hd int, pos []int, inv []float64, sign float64) *HVar {
	return t.RopeScaled(x, hd, pos, inv, sign, 1)
}

// RopeScaled is Rope with cos and sin multiplied by scale (a rope type's attention scaling,
// which transformers applies to both).
func (t *HostTape) RopeScaled(x *HVar, hd int, pos []int, inv []float64, sign, scale float64) *HVar {
	rd := 2 * len(inv)
	if x.C%hd != 0 || rd > hd || len(pos) != x.R {
		panic(fmt.Sprintf("nn: HostTape.Rope: [%d %d], head %d, rope %d, %d positions", x.R, x.C, hd, rd, len(pos)))
	}
	heads := x.C / hd
	cs := make([]float64, x.R*len(inv))
	sn := make([]float64, x.R*len(inv))
	for r, p := range pos {
		for i, f := range inv {
			a := float64(float32(float64(p) * f))
			cs[r*len(inv)+i], sn[r*len(inv)+i] = scale*math.Cos(a), scale*sign*math.Sin(a)
		}
	}
	y := newHVar(x.R, x.C)
	copy(y.V, x.V)
	for r := 0; r < x.R; r++ {
		for h := 0; h < heads; h++ {
			o := r*x.C + h*hd + hd - rd
			for i := range inv {
				c, s := cs[r*len(inv)+i], sn[r*len(inv)+i]
				a, b := x.V[o+2*i], x.V[o+2*i+1]
				y.V[o+2*i] = a*c - b*s
				y.V[o+2*i+1] = b*c + a*s
			}
		}
	}
	t.rec(func() {
		for r := 0; r < x.R; r++ {
			for h := 0; h < heads; h++ {
				base := r*x.C + h*hd
				o := base + hd - rd
				for j := base; j < o; j++ {
					x.G[j] += y.G[j]
				}
				for i := range inv {
					c, s := cs[r*len(inv)+i], sn[r*len(inv)+i]
					ga, gb := y.G[o+2*i], y.G[o+2*i+1]
					x.G[o+2*i] += ga*c + gb*s
					x.G[o+2*i+1] += -ga*s + gb*c
				}
			}
		}
	})
	return y
}

// Map applies f elementwise; df(x, y) is its derivative given the input and the output.
func (t *HostTape) Map(x *HVar, f func(float64) float64, df func(x, y float64) float64) *HVar {
	y := newHVar(x.R, x.C)
	for i, v := range x.V {
		y.V[i] = f(v)
	}
	t.rec(func() {
		for i, g := range y.G {
			if g != 0 {
				x.G[i] += g * df(x.V[i], y.V[i])
			}
		}
	})
	return y
}

// Sigmoid returns a*sigmoid(x) + b elementwise.
func (t *HostTape) Sigmoid(x *HVar, a, b float64) *HVar {
	return t.Map(x, func(v float64) float64 { return a/(1+math.Exp(-v)) + b },
		func(v, _ float64) float64 { s := 1 / (1 + math.Exp(-v)); return a * s * (1 - s) })
}

// SqrtSoftplus returns sqrt(softplus(x)) elementwise (DeepSeek-V4's router scores).
func (t *HostTape) SqrtSoftplus(x *HVar) *HVar {
	return t.Map(x, func(v float64) float64 { return math.Sqrt(softplus(v)) },
		func(v, y float64) float64 {
			if y == 0 {
				return 0
			}
			return 1 / (1 + math.Exp(-v)) / (2 * y)
		})
}

// AddConst returns x + c elementwise.
func (t *HostTape) AddConst(x *HVar, c float64) *HVar {
	return t.Map(x, func(v float64) float64 { return v + c }, func(_, _ float64) float64 { return 1 })
}

// ScaleShift returns x[r, j] * s[group(j)] + b[j], where column j of x belongs to group
// groupOf(j) of the scales s (the hyper-connection mixes' scale and base).
func (t *HostTape) ScaleShift(x, s, b *HVar, groupOf func(j int) int) *HVar {
	y := newHVar(x.R, x.C)
	for r := 0; r < x.R; r++ {
		for j := 0; j < x.C; j++ {
			y.V[r*x.C+j] = x.V[r*x.C+j]*s.V[groupOf(j)] + b.V[j]
		}
	}
	t.rec(func() {
		for r := 0; r < x.R; r++ {
			for j := 0; j < x.C; j++ {
				g := y.G[r*x.C+j]
				x.G[r*x.C+j] += g * s.V[groupOf(j)]
				s.G[groupOf(j)] += g * x.V[r*x.C+j]
				b.G[j] += g
			}
		}
	})
	return y
}

// Softmax takes the softmax of each run of n consecutive values.
func (t *HostTape) Softmax(x *HVar, n int) *HVar {
	y := newHVar(x.R, x.C)
	for o := 0; o < len(x.V); o += n {
		mx := math.Inf(-1)
		for _, v := range x.V[o : o+n] {
			mx = math.Max(mx, v)
		}
		s := 0.0
		for j, v := range x.V[o : o+n] {
			e := math.Exp(v - mx)
			y.V[o+j] = e
			s += e
		}
		for j := 0; j < n; j++ {
			y.V[o+j] /= s
		}
	}
	t.rec(func() {
		for o := 0; o < len(x.V); o += n {
			dot := 0.0
			for j := 0; j < n; j++ {
				dot += y.G[o+j] * y.V[o+j]
			}
			for j := 0; j < n; j++ {
				x.G[o+j] += y.V[o+j] * (y.G[o+j] - dot)
			}
		}
	})
	return y
}

// Normalize divides each n×n matrix of x (one per row) by its column sums (overRows true:
// m[i][j] / (Σ_i m[i][j] + eps)) or by its row sums (m[i][j] / (Σ_j m[i][j] + eps)): one
// half-step of Sinkhorn-Knopp.
func (t *HostTape) Normalize(x *HVar, n int, overRows bool, eps float64) *HVar {
	y := newHVar(x.R, x.C)
	sums := make([]float64, len(x.V)/n)
	at := func(o, a, b int) int { // element b of line a
		if overRows {
			return o + b*n + a // line a is column a
		}
		return o + a*n + b
	}
	for o, l := 0, 0; o < len(x.V); o += n * n {
		for a := 0; a < n; a++ {
			s := 0.0
			for b := 0; b < n; b++ {
				s += x.V[at(o, a, b)]
			}
			s += eps
			sums[l] = s
			for b := 0; b < n; b++ {
				y.V[at(o, a, b)] = x.V[at(o, a, b)] / s
			}
			l++
		}
	}
	t.rec(func() {
		for o, l := 0, 0; o < len(x.V); o += n * n {
			for a := 0; a < n; a++ {
				s := sums[l]
				dot := 0.0
				for b := 0; b < n; b++ {
					dot += y.G[at(o, a, b)] * x.V[at(o, a, b)]
				}
				for b := 0; b < n; b++ {
					x.G[at(o, a, b)] += y.G[at(o, a, b)]/s - dot/(s*s)
				}
				l++
			}
		}
	})
	return y
}

// StreamCollapse returns Σ_j w[r, j] * x[r, j*C:(j+1)*C] for w [R, n] and x [R, n*C].
func (t *HostTape) StreamCollapse(w, x *HVar) *HVar {
	n := w.C
	C := x.C / n
	y := newHVar(x.R, C)
	for r := 0; r < x.R; r++ {
		for j := 0; j < n; j++ {
			wj := w.V[r*n+j]
			for c := 0; c < C; c++ {
				y.V[r*C+c] += wj * x.V[r*x.C+j*C+c]
			}
		}
	}
	t.rec(func() {
		for r := 0; r < x.R; r++ {
			for j := 0; j < n; j++ {
				wj, s := w.V[r*n+j], 0.0
				for c := 0; c < C; c++ {
					g := y.G[r*C+c]
					x.G[r*x.C+j*C+c] += g * wj
					s += g * x.V[r*x.C+j*C+c]
				}
				w.G[r*n+j] += s
			}
		}
	})
	return y
}

// StreamExpand returns the n output streams y[r, k] = post[r, k] * f[r] + Σ_j comb[r, j, k] *
// x[r, j] for post [R, n], f [R, C], comb [R, n*n] and x [R, n*C] (a hyper-connection's write
// back into the residual streams).
func (t *HostTape) StreamExpand(post, f, comb, x *HVar) *HVar {
	n := post.C
	C := f.C
	y := newHVar(x.R, n*C)
	for r := 0; r < x.R; r++ {
		for k := 0; k < n; k++ {
			yo := r*n*C + k*C
			p := post.V[r*n+k]
			for c := 0; c < C; c++ {
				y.V[yo+c] = p * f.V[r*C+c]
			}
			for j := 0; j < n; j++ {
				m := comb.V[r*n*n+j*n+k]
				for c := 0; c < C; c++ {
					y.V[yo+c] += m * x.V[r*n*C+j*C+c]
				}
			}
		}
	}
	t.rec(func() {
		for r := 0; r < x.R; r++ {
			for k := 0; k < n; k++ {
				yo := r*n*C + k*C
				p, sp := post.V[r*n+k], 0.0
				for c := 0; c < C; c++ {
					g := y.G[yo+c]
					f.G[r*C+c] += g * p
					sp += g * f.V[r*C+c]
				}
				post.G[r*n+k] += sp
				for j := 0; j < n; j++ {
					m, sm := comb.V[r*n*n+j*n+k], 0.0
					for c := 0; c < C; c++ {
						g := y.G[yo+c]
						x.G[r*n*C+j*C+c] += g * m
						sm += g * x.V[r*n*C+j*C+c]
					}
					comb.G[r*n*n+j*n+k] += sm
				}
			}
		}
	})
	return y
}

// Repeat returns x [R, C] repeated n times along the columns ([R, n*C]).
func (t *HostTape) Repeat(x *HVar, n int) *HVar {
	y := newHVar(x.R, n*x.C)
	for r := 0; r < x.R; r++ {
		for k := 0; k < n; k++ {
			copy(y.V[r*n*x.C+k*x.C:r*n*x.C+(k+1)*x.C], x.V[r*x.C:(r+1)*x.C])
		}
	}
	t.rec(func() {
		for r := 0; r < x.R; r++ {
			for k := 0; k < n; k++ {
				for c := 0; c < x.C; c++ {
					x.G[r*x.C+c] += y.G[r*n*x.C+k*x.C+c]
				}
			}
		}
	})
	return y
}

// ClampSwiGLU returns silu(min(g, limit)) * clamp(u, -limit, limit) elementwise; the clamps
// pass no gradient outside their range, as torch.clamp does.
func (t *HostTape) ClampSwiGLU(g, u *HVar, limit float64) *HVar {
	y := newHVar(g.R, g.C)
	for i := range y.V {
		gc, uc := math.Min(g.V[i], limit), math.Max(-limit, math.Min(u.V[i], limit))
		y.V[i] = gc / (1 + math.Exp(-gc)) * uc
	}
	t.rec(func() {
		for i, gy := range y.G {
			if gy == 0 {
				continue
			}
			gc, uc := math.Min(g.V[i], limit), math.Max(-limit, math.Min(u.V[i], limit))
			s := 1 / (1 + math.Exp(-gc))
			if g.V[i] <= limit {
				g.G[i] += gy * uc * s * (1 + gc*(1-s))
			}
			if u.V[i] >= -limit && u.V[i] <= limit {
				u.G[i] += gy * gc * s
			}
		}
	})
	return y
}

// ScaleRowsBy multiplies row i of y by w.V[at[i]].
func (t *HostTape) ScaleRowsBy(y, w *HVar, at []int) *HVar {
	o := newHVar(y.R, y.C)
	for i := 0; i < y.R; i++ {
		s := w.V[at[i]]
		for c := 0; c < y.C; c++ {
			o.V[i*y.C+c] = y.V[i*y.C+c] * s
		}
	}
	t.rec(func() {
		for i := 0; i < y.R; i++ {
			s, d := w.V[at[i]], 0.0
			for c := 0; c < y.C; c++ {
				g := o.G[i*y.C+c]
				y.G[i*y.C+c] += g * s
				d += g * y.V[i*y.C+c]
			}
			w.G[at[i]] += d
		}
	})
	return o
}

// RouteWeights gathers, for each row r of scores [R, E], the scores of its experts idx[r*k:],
// divides them by their sum (+1e-20) and multiplies by scale: [R, k].
func (t *HostTape) RouteWeights(scores *HVar, idx []int, k int, scale float64) *HVar {
	E := scores.C
	y := newHVar(scores.R, k)
	sums := make([]float64, scores.R)
	for r := 0; r < scores.R; r++ {
		s := 1e-20
		for j := 0; j < k; j++ {
			s += scores.V[r*E+idx[r*k+j]]
		}
		sums[r] = s
		for j := 0; j < k; j++ {
			y.V[r*k+j] = scores.V[r*E+idx[r*k+j]] / s * scale
		}
	}
	t.rec(func() {
		for r := 0; r < scores.R; r++ {
			s, dot := sums[r], 0.0
			for j := 0; j < k; j++ {
				dot += y.G[r*k+j] * scores.V[r*E+idx[r*k+j]]
			}
			for j := 0; j < k; j++ {
				scores.G[r*E+idx[r*k+j]] += scale * (y.G[r*k+j]/s - dot/(s*s))
			}
		}
	})
	return y
}

// SinkAttention is attention of the queries q [T, H*D] over the shared keys-and-values kv
// [S, D] (one head read as both key and value), where query t sees key s only where
// allow(t, s), with a learned sink logit per head (sinks [H]) joining each softmax and taking
// no value. It returns [T, H*D].
func (t *HostTape) SinkAttention(q, kv, sinks *HVar, allow func(t, s int) bool, scale float64) *HVar {
	D := kv.C
	H := q.C / D
	T, S := q.R, kv.R
	if H*D != q.C || sinks.R*sinks.C != H {
		panic(fmt.Sprintf("nn: HostTape.SinkAttention: q [%d %d], kv [%d %d], %d sinks", q.R, q.C, kv.R, kv.C, len(sinks.V)))
	}
	p := make([]float64, T*H*S) // probabilities (0 where masked)
	y := newHVar(T, H*D)
	for ti := 0; ti < T; ti++ {
		for h := 0; h < H; h++ {
			qv := q.V[ti*q.C+h*D : ti*q.C+(h+1)*D]
			pr := p[(ti*H+h)*S : (ti*H+h+1)*S]
			mx := sinks.V[h]
			for s := 0; s < S; s++ {
				if !allow(ti, s) {
					pr[s] = math.Inf(-1)
					continue
				}
				d := 0.0
				for c, v := range qv {
					d += v * kv.V[s*D+c]
				}
				pr[s] = d * scale
				mx = math.Max(mx, pr[s])
			}
			sum := math.Exp(sinks.V[h] - mx)
			for s := range pr {
				if math.IsInf(pr[s], -1) {
					pr[s] = 0
					continue
				}
				pr[s] = math.Exp(pr[s] - mx)
				sum += pr[s]
			}
			out := y.V[ti*y.C+h*D : ti*y.C+(h+1)*D]
			for s := range pr {
				pr[s] /= sum
				if pr[s] != 0 {
					for c := range out {
						out[c] += pr[s] * kv.V[s*D+c]
					}
				}
			}
		}
	}
	t.rec(func() {
		for ti := 0; ti < T; ti++ {
			for h := 0; h < H; h++ {
				qv, gq := q.V[ti*q.C+h*D:ti*q.C+(h+1)*D], q.G[ti*q.C+h*D:ti*q.C+(h+1)*D]
				gy := y.G[ti*y.C+h*D : ti*y.C+(h+1)*D]
				pr := p[(ti*H+h)*S : (ti*H+h+1)*S]
				// dp_s = gy·v_s; dlogit_s = p_s (dp_s - Σ p dp); the sink's p is 1 - Σ p_s.
				dps := make([]float64, S)
				dot := 0.0
				for s := range pr {
					if pr[s] == 0 {
						continue
					}
					d := 0.0
					for c, g := range gy {
						d += g * kv.V[s*D+c]
						kv.G[s*D+c] += pr[s] * g
					}
					dps[s] = d
					dot += pr[s] * d
				}
				psink := 1.0
				for s := range pr {
					psink -= pr[s]
				}
				sinks.G[h] += -psink * dot
				for s := range pr {
					if pr[s] == 0 {
						continue
					}
					dl := pr[s] * (dps[s] - dot) * scale
					for c := range qv {
						gq[c] += dl * kv.V[s*D+c]
						kv.G[s*D+c] += dl * qv[c]
					}
				}
			}
		}
	})
	return y
}

// WindowPool compresses the rows of kv and gate [T, W] window by window (DeepSeek-V4's
// compressors): window w holds rows w*m..w*m+m-1; each channel's value is the softmax over the
// window's slots of gate + ape[slot] ([m, W]) weighting kv. With overlap (W = 2*D), window w
// pools 2m slots: the first D channels of window w-1's rows (none for window 0) and the last D
// channels of its own; without (W = D), its own m rows. It returns [n, D], n = T/m windows
// (a trailing partial window is dropped).
func (t *HostTape) WindowPool(kv, gate, ape *HVar, m int, overlap bool) *HVar {
	W := kv.C
	D := W
	if overlap {
		D = W / 2
	}
	n := kv.R / m
	y := newHVar(n, D)
	type slot struct{ row, col int } // source element of kv/gate; col also indexes ape
	slots := func(w, d int) []slot {
		var out []slot
		if overlap {
			if w > 0 {
				for i := 0; i < m; i++ {
					out = append(out, slot{(w-1)*m + i, d})
				}
			}
			for i := 0; i < m; i++ {
				out = append(out, slot{w*m + i, D + d})
			}
			return out
		}
		for i := 0; i < m; i++ {
			out = append(out, slot{w*m + i, d})
		}
		return out
	}
	probs := make([][]float64, n*D)
	for w := 0; w < n; w++ {
		for d := 0; d < D; d++ {
			ss := slots(w, d)
			pr := make([]float64, len(ss))
			mx := math.Inf(-1)
			for i, s := range ss {
				pr[i] = gate.V[s.row*W+s.col] + ape.V[(s.row%m)*W+s.col]
				mx = math.Max(mx, pr[i])
			}
			sum := 0.0
			for i := range pr {
				pr[i] = math.Exp(pr[i] - mx)
				sum += pr[i]
			}
			v := 0.0
			for i, s := range ss {
				pr[i] /= sum
				v += pr[i] * kv.V[s.row*W+s.col]
			}
			y.V[w*D+d] = v
			probs[w*D+d] = pr
		}
	}
	t.rec(func() {
		for w := 0; w < n; w++ {
			for d := 0; d < D; d++ {
				g := y.G[w*D+d]
				if g == 0 {
					continue
				}
				ss, pr := slots(w, d), probs[w*D+d]
				v := y.V[w*D+d]
				for i, s := range ss {
					e := s.row*W + s.col
					kv.G[e] += g * pr[i]
					dl := g * pr[i] * (kv.V[e] - v)
					gate.G[e] += dl
					ape.G[(s.row%m)*W+s.col] += dl
				}
			}
		}
	})
	return y
}

// TokenLogprobs returns log softmax(logits)[r, targets[r]] for each row ([R, 1]); rows whose
// target is negative get 0 and no gradient.
func (t *HostTape) TokenLogprobs(logits *HVar, targets []int) *HVar {
	V := logits.C
	y := newHVar(logits.R, 1)
	soft := make([]float64, len(logits.V))
	for r := 0; r < logits.R; r++ {
		row := logits.V[r*V : (r+1)*V]
		mx := math.Inf(-1)
		for _, v := range row {
			mx = math.Max(mx, v)
		}
		s := 0.0
		for j, v := range row {
			soft[r*V+j] = math.Exp(v - mx)
			s += soft[r*V+j]
		}
		for j := range row {
			soft[r*V+j] /= s
		}
		if targets[r] >= 0 {
			y.V[r] = row[targets[r]] - mx - math.Log(s)
		}
	}
	t.rec(func() {
		for r := 0; r < logits.R; r++ {
			if targets[r] < 0 || y.G[r] == 0 {
				continue
			}
			g := y.G[r]
			for j := 0; j < V; j++ {
				logits.G[r*V+j] -= g * soft[r*V+j]
			}
			logits.G[r*V+targets[r]] += g
		}
	})
	return y
}
