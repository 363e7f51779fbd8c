package cpu

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// DeepSeek-V4's hyper-connection ops (the weights, the collapse and expansion of the streams)
// and its two elementwise activations, the reference of the device kernels (engine/backend's
// dsv4.go states the contract). Per-row arithmetic is float64, results rounded once;
// parameter gradients are sums over rows kept per row and then added up column by column in
// row order, so they do not depend on how rows are shared out.

func init() {
	dsv4Fills = append(dsv4Fills, func(b *Backend, o *backend.DSV4Ops) {
		o.HyperWeights = b.HyperWeights
		o.HyperWeightsBackward = b.HyperWeightsBackward
		o.StreamCollapse = b.StreamCollapse
		o.StreamCollapseBackward = b.StreamCollapseBackward
		o.StreamExpand = b.StreamExpand
		o.StreamExpandBackward = b.StreamExpandBackward
		o.SqrtSoftplus = b.SqrtSoftplus
		o.SqrtSoftplusBackward = b.SqrtSoftplusBackward
		o.SwiGLUClampedSplit = b.SwiGLUClampedSplit
		o.SwiGLUClampedSplitBackward = b.SwiGLUClampedSplitBackward
	})
}

// hyperGroup is the scale column j of a mix uses (0: pre, 1: post, 2: comb).
func hyperGroup(j, n int, head bool) int {
	switch {
	case head || j < n:
		return 0
	case j < 2*n:
		return 1
	}
	return 2
}

// hyperRow is one row's forward: zz the scaled logits, and for the comb part the matrix
// before each Sinkhorn half-step (mats[0] the softmax plus Eps, then each half-step's input;
// mats[len-1] the result) with each half-step's line sums.
type hyperRow struct {
	n, iters int
	eps      float64
	zz       []float64
	soft     []float64   // the row softmaxes of the comb logits
	mats     [][]float64 // 2·iters matrices of n·n
	sums     [][]float64 // 2·iters-1 sets of n line sums
}

func newHyperRow(n, iters int, eps float64, m int, head bool) *hyperRow {
	h := &hyperRow{n: n, iters: iters, eps: eps, zz: make([]float64, m)}
	if !head {
		h.soft = make([]float64, n*n)
		steps := 2*iters - 1
		h.mats = make([][]float64, steps+1)
		for i := range h.mats {
			h.mats[i] = make([]float64, n*n)
		}
		h.sums = make([][]float64, steps)
		for i := range h.sums {
			h.sums[i] = make([]float64, n)
		}
	}
	return h
}

// stepOverRows reports whether Sinkhorn half-step s normalises the columns (the sums run over
// the rows): the first, then every other one.
func stepOverRows(s int) bool { return s%2 == 0 }

// forward computes zz and, without head, the Sinkhorn matrices of one row.
func (h *hyperRow) forward(z, scale, base []float32, head bool) {
	n := h.n
	for j := range h.zz {
		h.zz[j] = float64(z[j])*float64(scale[hyperGroup(j, n, head)]) + float64(base[j])
	}
	if head {
		return
	}
	m0 := h.mats[0]
	for j := 0; j < n; j++ {
		row := h.zz[2*n+j*n : 2*n+(j+1)*n]
		mx := math.Inf(-1)
		for _, v := range row {
			mx = math.Max(mx, v)
		}
		s := 0.0
		for k, v := range row {
			e := math.Exp(v - mx)
			m0[j*n+k] = e
			s += e
		}
		for k := 0; k < n; k++ {
			h.soft[j*n+k] = m0[j*n+k] / s
			m0[j*n+k] = h.soft[j*n+k] + h.eps
		}
	}
	for s := range h.sums {
		x, y, sums := h.mats[s], h.mats[s+1], h.sums[s]
		for a := 0; a < n; a++ {
			t := 0.0
			for b := 0; b < n; b++ {
				t += x[lineAt(n, a, b, stepOverRows(s))]
			}
			t += h.eps
			sums[a] = t
			for b := 0; b < n; b++ {
				i := lineAt(n, a, b, stepOverRows(s))
				y[i] = x[i] / t
			}
		}
	}
}

// lineAt is the index of element b of line a of an n×n matrix: line a is column a when
// overRows, row a otherwise.
func lineAt(n, a, b int, overRows bool) int {
	if overRows {
		return b*n + a
	}
	return a*n + b
}

// backward writes into gzz the gradient of the row's scaled logits from those of its
// outputs (dPost and dComb unused with head).
func (h *hyperRow) backward(gzz []float64, dPre, dPost, dComb []float32, head bool) {
	n := h.n
	for k := 0; k < n; k++ {
		s := sigmoid64(h.zz[k])
		gzz[k] = float64(dPre[k]) * s * (1 - s)
	}
	if head {
		return
	}
	for k := 0; k < n; k++ {
		s := sigmoid64(h.zz[n+k])
		gzz[n+k] = float64(dPost[k]) * 2 * s * (1 - s)
	}
	g := make([]float64, n*n)
	for i := range g {
		g[i] = float64(dComb[i])
	}
	for s := len(h.sums) - 1; s >= 0; s-- {
		x, sums := h.mats[s], h.sums[s]
		for a := 0; a < n; a++ {
			t, dot := sums[a], 0.0
			for b := 0; b < n; b++ {
				i := lineAt(n, a, b, stepOverRows(s))
				dot += g[i] * x[i]
			}
			for b := 0; b < n; b++ {
				i := lineAt(n, a, b, stepOverRows(s))
				g[i] = g[i]/t - dot/(t*t)
			}
		}
	}
	// Through the softmax of each row (Eps passes the gradient as it is).
	for j := 0; j < n; j++ {
		y := h.soft[j*n : (j+1)*n]
		dot := 0.0
		for k, v := range y {
			dot += g[j*n+k] * v
		}
		for k, v := range y {
			gzz[2*n+j*n+k] = v * (g[j*n+k] - dot)
		}
	}
}

// HyperWeights implements backend.DSV4Ops.HyperWeights.
func (b *Backend) HyperWeights(a backend.HyperWeightsArgs) error {
	const op = "hyper-weights"
	N, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	z, scale, base, err := b.hyperInputs(op, a)
	if err != nil {
		return err
	}
	pre, err := f32only(op, "Pre", a.Pre)
	if err != nil {
		return err
	}
	var post, comb []float32
	if !a.Head {
		if post, err = f32only(op, "Post", a.Post); err != nil {
			return err
		}
		if comb, err = f32only(op, "Comb", a.Comb); err != nil {
			return err
		}
	}
	n, m, eps := a.Streams, a.M(), float64(a.Eps)
	b.pool.rows(N, max(1, 4096/(m*max(1, a.Iters))), func(lo, hi int) {
		h := newHyperRow(n, a.Iters, eps, m, a.Head)
		for r := lo; r < hi; r++ {
			h.forward(z[r*m:(r+1)*m], scale, base, a.Head)
			for k := 0; k < n; k++ {
				pre[r*n+k] = float32(sigmoid64(h.zz[k]) + eps)
			}
			if a.Head {
				continue
			}
			for k := 0; k < n; k++ {
				post[r*n+k] = float32(2 * sigmoid64(h.zz[n+k]))
			}
			last := h.mats[len(h.mats)-1]
			for i, v := range last {
				comb[r*n*n+i] = float32(v)
			}
		}
	})
	return nil
}

func (b *Backend) hyperInputs(op string, a backend.HyperWeightsArgs) (z, scale, base []float32, err error) {
	if z, err = b.in(op, "Z", a.Z); err != nil {
		return
	}
	if scale, err = b.in(op, "Scale", a.Scale); err != nil {
		return
	}
	base, err = b.in(op, "Base", a.Base)
	return
}

// HyperWeightsBackward implements backend.DSV4Ops.HyperWeightsBackward: each row's forward is
// recomputed and differentiated; GScale and GBase are summed over rows in row order.
func (b *Backend) HyperWeightsBackward(a backend.HyperWeightsBackwardArgs) error {
	const op = "hyper-weights-backward"
	N, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	z, scale, base, err := b.hyperInputs(op, a.HyperWeightsArgs)
	if err != nil {
		return err
	}
	dpre, err := f32only(op, "DPre", a.DPre)
	if err != nil {
		return err
	}
	var dpost, dcomb []float32
	if !a.Head {
		if dpost, err = f32only(op, "DPost", a.DPost); err != nil {
			return err
		}
		if dcomb, err = f32only(op, "DComb", a.DComb); err != nil {
			return err
		}
	}
	dz, flush, err := b.out(op, "DZ", a.DZ, true)
	if err != nil {
		return err
	}
	n, m, eps := a.Streams, a.M(), float64(a.Eps)
	gzz := make([]float64, N*m) // per row, for the deterministic parameter sums
	b.pool.rows(N, max(1, 4096/(m*max(1, a.Iters))), func(lo, hi int) {
		h := newHyperRow(n, a.Iters, eps, m, a.Head)
		for r := lo; r < hi; r++ {
			h.forward(z[r*m:(r+1)*m], scale, base, a.Head)
			var dp, dc []float32
			if !a.Head {
				dp, dc = dpost[r*n:(r+1)*n], dcomb[r*n*n:(r+1)*n*n]
			}
			g := gzz[r*m : (r+1)*m]
			h.backward(g, dpre[r*n:(r+1)*n], dp, dc, a.Head)
			for j, v := range g {
				dz[r*m+j] = float32(float64(dz[r*m+j]) + v*float64(scale[hyperGroup(j, n, a.Head)]))
			}
		}
	})
	flush()
	gb := make([]float64, m)
	gsCols := make([]float64, m) // Σ_r gzz·z per column, then folded into its group
	b.pool.rows(m, 1, func(lo, hi int) {
		for j := lo; j < hi; j++ {
			for r := 0; r < N; r++ {
				g := gzz[r*m+j]
				gb[j] += g
				gsCols[j] += g * float64(z[r*m+j])
			}
		}
	})
	gs := make([]float64, a.Scale.Numel())
	for j, v := range gsCols {
		gs[hyperGroup(j, n, a.Head)] += v
	}
	return b.addGrads(op, gradSum{"GScale", a.GScale, gs}, gradSum{"GBase", a.GBase, gb})
}

// StreamCollapse implements backend.DSV4Ops.StreamCollapse: out[r,c] = Σ_j w[r,j]·x[r,j·C+c].
func (b *Backend) StreamCollapse(out, w, x T) error {
	const op = "stream-collapse"
	N, n, C, err := backend.StreamDims(op, w, x, out)
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	wv, err := b.in(op, "W", w)
	if err != nil {
		return err
	}
	xv, err := b.in(op, "X", x)
	if err != nil {
		return err
	}
	ov, flush, err := b.out(op, "Out", out, false)
	if err != nil {
		return err
	}
	b.pool.rows(N, max(1, convChunk/max(1, n*C)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			for c := 0; c < C; c++ {
				acc := 0.0
				for j := 0; j < n; j++ {
					acc += float64(wv[r*n+j]) * float64(xv[(r*n+j)*C+c])
				}
				ov[r*C+c] = float32(acc)
			}
		}
	})
	flush()
	return nil
}

// StreamCollapseBackward implements backend.DSV4Ops.StreamCollapseBackward: dX[r,j·C+c] +=
// dOut[r,c]·w[r,j] and dW[r,j] += Σ_c dOut[r,c]·x[r,j·C+c] (either may be nil).
func (b *Backend) StreamCollapseBackward(dW, dX, dOut, w, x T) error {
	const op = "stream-collapse-backward"
	N, n, C, err := backend.StreamDims(op, w, x, dOut)
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	if !dW.IsNil() && (dW.Rank() != 2 || dW.Dim(0) != N || dW.Dim(1) != n) {
		return fmt.Errorf("cpu: %s: dW %v must be [%d,%d] like w", op, dW, N, n)
	}
	if !dX.IsNil() && (dX.Rank() != 2 || dX.Dim(0) != N || dX.Dim(1) != n*C) {
		return fmt.Errorf("cpu: %s: dX %v must be [%d,%d] like x", op, dX, N, n*C)
	}
	wv, err := b.in(op, "w", w)
	if err != nil {
		return err
	}
	xv, err := b.in(op, "x", x)
	if err != nil {
		return err
	}
	dov, err := b.in(op, "dOut", dOut)
	if err != nil {
		return err
	}
	var dwv, dxv []float32
	flushW, flushX := func() {}, func() {}
	if !dW.IsNil() {
		if dwv, flushW, err = b.out(op, "dW", dW, true); err != nil {
			return err
		}
	}
	if !dX.IsNil() {
		if dxv, flushX, err = b.out(op, "dX", dX, true); err != nil {
			return err
		}
	}
	b.pool.rows(N, max(1, convChunk/max(1, n*C)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			for j := 0; j < n; j++ {
				wj, s := float64(wv[r*n+j]), 0.0
				xo := (r*n + j) * C
				for c := 0; c < C; c++ {
					g := float64(dov[r*C+c])
					if dxv != nil {
						dxv[xo+c] = float32(float64(dxv[xo+c]) + g*wj)
					}
					s += g * float64(xv[xo+c])
				}
				if dwv != nil {
					dwv[r*n+j] = float32(float64(dwv[r*n+j]) + s)
				}
			}
		}
	})
	flushW()
	flushX()
	return nil
}

// StreamExpand implements backend.DSV4Ops.StreamExpand. Each position's n inputs are read
// before its outputs are written, so Out may be X.
func (b *Backend) StreamExpand(a backend.StreamExpandArgs) error {
	const op = "stream-expand"
	N, n, C, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	post, err := f32only(op, "Post", a.Post)
	if err != nil {
		return err
	}
	comb, err := f32only(op, "Comb", a.Comb)
	if err != nil {
		return err
	}
	f, err := b.in(op, "F", a.F)
	if err != nil {
		return err
	}
	x, err := b.in(op, "X", a.X)
	if err != nil {
		return err
	}
	out, flush, err := b.out(op, "Out", a.Out, false)
	if err != nil {
		return err
	}
	b.pool.rows(N, max(1, convChunk/max(1, n*C)), func(lo, hi int) {
		xs := make([]float64, n)
		for r := lo; r < hi; r++ {
			p, cb := post[r*n:(r+1)*n], comb[r*n*n:(r+1)*n*n]
			for c := 0; c < C; c++ {
				for j := range xs {
					xs[j] = float64(x[(r*n+j)*C+c])
				}
				fv := float64(f[r*C+c])
				for k := 0; k < n; k++ {
					acc := float64(p[k]) * fv
					for j, xj := range xs {
						acc += float64(cb[j*n+k]) * xj
					}
					out[(r*n+k)*C+c] = float32(acc)
				}
			}
		}
	})
	flush()
	return nil
}

// StreamExpandBackward implements backend.DSV4Ops.StreamExpandBackward: DF[r,c] += Σ_k
// DOut[r,k·C+c]·Post[r,k], DX[r,j·C+c] += Σ_k DOut[r,k·C+c]·Comb[r,j·n+k], DPost[r,k] += Σ_c
// DOut[r,k·C+c]·F[r,c], DComb[r,j·n+k] += Σ_c DOut[r,k·C+c]·X[r,j·C+c] (any may be nil).
func (b *Backend) StreamExpandBackward(a backend.StreamExpandBackwardArgs) error {
	const op = "stream-expand-backward"
	N, n, C, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	post, err := f32only(op, "Post", a.Post)
	if err != nil {
		return err
	}
	comb, err := f32only(op, "Comb", a.Comb)
	if err != nil {
		return err
	}
	f, err := b.in(op, "F", a.F)
	if err != nil {
		return err
	}
	x, err := b.in(op, "X", a.X)
	if err != nil {
		return err
	}
	dout, err := b.in(op, "DOut", a.DOut)
	if err != nil {
		return err
	}
	var dpost, dcomb, df, dx []float32
	var flushes []func()
	for _, g := range []struct {
		name string
		t    T
		v    *[]float32
	}{{"DPost", a.DPost, &dpost}, {"DComb", a.DComb, &dcomb}, {"DF", a.DF, &df}, {"DX", a.DX, &dx}} {
		if g.t.IsNil() {
			continue
		}
		v, fl, err := b.out(op, g.name, g.t, true)
		if err != nil {
			return err
		}
		*g.v = v
		flushes = append(flushes, fl)
	}
	b.pool.rows(N, max(1, convChunk/max(1, n*C)), func(lo, hi int) {
		sp := make([]float64, n)
		sc := make([]float64, n*n)
		for r := lo; r < hi; r++ {
			p, cb := post[r*n:(r+1)*n], comb[r*n*n:(r+1)*n*n]
			clear(sp)
			clear(sc)
			for c := 0; c < C; c++ {
				fv, gf := float64(f[r*C+c]), 0.0
				for k := 0; k < n; k++ {
					g := float64(dout[(r*n+k)*C+c])
					gf += g * float64(p[k])
					sp[k] += g * fv
				}
				if df != nil {
					df[r*C+c] = float32(float64(df[r*C+c]) + gf)
				}
				for j := 0; j < n; j++ {
					xi := (r*n+j)*C + c
					xj, gx := float64(x[xi]), 0.0
					for k := 0; k < n; k++ {
						g := float64(dout[(r*n+k)*C+c])
						gx += g * float64(cb[j*n+k])
						sc[j*n+k] += g * xj
					}
					if dx != nil {
						dx[xi] = float32(float64(dx[xi]) + gx)
					}
				}
			}
			if dpost != nil {
				for k, v := range sp {
					dpost[r*n+k] += float32(v)
				}
			}
			if dcomb != nil {
				for i, v := range sc {
					dcomb[r*n*n+i] += float32(v)
				}
			}
		}
	})
	for _, fl := range flushes {
		fl()
	}
	return nil
}

// SqrtSoftplus implements backend.DSV4Ops.SqrtSoftplus: out = sqrt(softplus(x)).
func (b *Backend) SqrtSoftplus(out, x T) error {
	const op = "sqrt-softplus"
	cnt, err := backend.ElementwiseCount(op, []string{"x", "out"}, x, out)
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	xv, err := b.in(op, "x", x)
	if err != nil {
		return err
	}
	ov, flush, err := b.out(op, "out", out, false)
	if err != nil {
		return err
	}
	b.pool.rows(cnt, convChunk, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			ov[i] = float32(math.Sqrt(softplus64(float64(xv[i]))))
		}
	})
	flush()
	return nil
}

// SqrtSoftplusBackward implements backend.DSV4Ops.SqrtSoftplusBackward: dX += dOut ·
// sigmoid(x) / (2·out), nothing where out is 0.
func (b *Backend) SqrtSoftplusBackward(dX, dOut, x, out T) error {
	const op = "sqrt-softplus-backward"
	cnt, err := backend.ElementwiseCount(op, []string{"x", "out", "dOut", "dX"}, x, out, dOut, dX)
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	xv, err := b.in(op, "x", x)
	if err != nil {
		return err
	}
	ov, err := b.in(op, "out", out)
	if err != nil {
		return err
	}
	dov, err := b.in(op, "dOut", dOut)
	if err != nil {
		return err
	}
	dxv, flush, err := b.out(op, "dX", dX, true)
	if err != nil {
		return err
	}
	b.pool.rows(cnt, convChunk, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			if ov[i] == 0 {
				continue
			}
			d := float64(dov[i]) * sigmoid64(float64(xv[i])) / (2 * float64(ov[i]))
			dxv[i] = float32(float64(dxv[i]) + d)
		}
	})
	flush()
	return nil
}

// SwiGLUClampedSplit implements backend.DSV4Ops.SwiGLUClampedSplit: out = silu(min(gate,
// limit)) · clamp(up, -limit, limit), gate and up separate tensors.
func (b *Backend) SwiGLUClampedSplit(out, gate, up T, limit float32) error {
	const op = "swiglu-clamped-split"
	cnt, err := backend.ElementwiseCount(op, []string{"gate", "up", "out"}, gate, up, out)
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	gv, err := b.in(op, "gate", gate)
	if err != nil {
		return err
	}
	uv, err := b.in(op, "up", up)
	if err != nil {
		return err
	}
	ov, flush, err := b.out(op, "out", out, false)
	if err != nil {
		return err
	}
	l := float64(limit)
	b.pool.rows(cnt, convChunk, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			gc := math.Min(float64(gv[i]), l)
			uc := math.Max(-l, math.Min(float64(uv[i]), l))
			ov[i] = float32(gc * sigmoid64(gc) * uc)
		}
	})
	flush()
	return nil
}

// SwiGLUClampedSplitBackward implements backend.DSV4Ops.SwiGLUClampedSplitBackward: dGate +=
// dOut·uc·σ(gc)·(1 + gc·(1-σ(gc))) where gate ≤ limit, dUp += dOut·silu(gc) where |up| ≤
// limit (gc, uc the clamped inputs); either gradient may be nil.
func (b *Backend) SwiGLUClampedSplitBackward(dGate, dUp, dOut, gate, up T, limit float32) error {
	const op = "swiglu-clamped-split-backward"
	cnt, err := backend.SwiGLUClampedSplitBackwardCount(op, dGate, dUp, dOut, gate, up)
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	gv, err := b.in(op, "gate", gate)
	if err != nil {
		return err
	}
	uv, err := b.in(op, "up", up)
	if err != nil {
		return err
	}
	dov, err := b.in(op, "dOut", dOut)
	if err != nil {
		return err
	}
	var dgv, duv []float32
	flushG, flushU := func() {}, func() {}
	if !dGate.IsNil() {
		if dgv, flushG, err = b.out(op, "dGate", dGate, true); err != nil {
			return err
		}
	}
	if !dUp.IsNil() {
		if duv, flushU, err = b.out(op, "dUp", dUp, true); err != nil {
			return err
		}
	}
	l := float64(limit)
	b.pool.rows(cnt, convChunk, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			d := float64(dov[i])
			if d == 0 {
				continue
			}
			g, u := float64(gv[i]), float64(uv[i])
			gc, uc := math.Min(g, l), math.Max(-l, math.Min(u, l))
			s := sigmoid64(gc)
			if dgv != nil && g <= l {
				dgv[i] = float32(float64(dgv[i]) + d*uc*s*(1+gc*(1-s)))
			}
			if duv != nil && u >= -l && u <= l {
				duv[i] = float32(float64(duv[i]) + d*gc*s)
			}
		}
	})
	flushG()
	flushU()
	return nil
}
