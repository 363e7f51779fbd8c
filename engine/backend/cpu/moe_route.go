package cpu

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Mixture-of-experts routing, permutation and combine (backend/moe_route.go gives the
// contract). The router reproduces engine/nn's host routing exactly: probabilities in fp64
// rounded once to fp32, the top-k by fp64 scores with ties to the lower index, the chosen
// probabilities summed in fp32 for NormTopK.

// moeDims checks that t is a 2-D [rows, cols] tensor of dtype dt (any float when dt is 0).
func moeMatrix(op, name string, t T, rows, cols int) error {
	if t.IsNil() {
		return fmt.Errorf("cpu: %s: %s is missing (want [%d,%d])", op, name, rows, cols)
	}
	if t.Numel() != rows*cols || (t.Rank() > 0 && t.Dim(-1) != cols) {
		return fmt.Errorf("cpu: %s: %s %v must be [%d,%d]", op, name, t, rows, cols)
	}
	return nil
}

func f32Matrix(op, name string, t T, rows, cols int) ([]float32, error) {
	if err := moeMatrix(op, name, t, rows, cols); err != nil {
		return nil, err
	}
	return f32only(op, name, t)
}

func i32Matrix(op, name string, t T, rows, cols int) ([]int32, error) {
	if err := moeMatrix(op, name, t, rows, cols); err != nil {
		return nil, err
	}
	return ints(op, name, t)
}

// MoERoute implements backend.Optional.MoERoute.
func (b *Backend) MoERoute(a backend.MoERouteArgs) error {
	const op = "moe-route"
	if a.Logits.IsNil() || a.Logits.Rank() != 2 {
		return fmt.Errorf("cpu: %s: logits %v must be [N,E]", op, a.Logits)
	}
	n, e := a.Logits.Dim(0), a.Logits.Dim(1)
	if err := a.Check(op, e); err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	k := a.TopK
	logits, err := b.in(op, "logits", a.Logits)
	if err != nil {
		return err
	}
	probs, err := f32Matrix(op, "probs", a.Probs, n, e)
	if err != nil {
		return err
	}
	sel, err := i32Matrix(op, "sel", a.Sel, n, k)
	if err != nil {
		return err
	}
	weights, err := f32Matrix(op, "weights", a.Weights, n, k)
	if err != nil {
		return err
	}
	var bias, psum []float32
	var counts []int32
	if !a.Bias.IsNil() {
		if bias, err = f32Matrix(op, "bias", a.Bias, 1, e); err != nil {
			return err
		}
	}
	if !a.Counts.IsNil() {
		if counts, err = i32Matrix(op, "counts", a.Counts, 1, e); err != nil {
			return err
		}
	}
	if !a.ProbSum.IsNil() {
		if psum, err = f32Matrix(op, "probSum", a.ProbSum, 1, e); err != nil {
			return err
		}
	}
	var escale []float32
	if !a.ExpertScale.IsNil() {
		if escale, err = f32Matrix(op, "expertScale", a.ExpertScale, 1, e); err != nil {
			return err
		}
	}
	scale := a.Scaling()
	const per = 64
	bad := make([]int, (n+per-1)/per) // per chunk, the first token with a NaN score, or -1
	for i := range bad {
		bad[i] = -1
	}
	b.pool.rows(n, per, func(lo, hi int) {
		score := make([]float64, e)
		var keep []bool
		var gscore []float64
		var gsel []int32
		if a.Grouped() {
			keep, gscore, gsel = make([]bool, e), make([]float64, a.NGroup), make([]int32, a.TopKGroup)
		}
		for t := lo; t < hi; t++ {
			z := logits[t*e : (t+1)*e]
			p := probs[t*e : (t+1)*e]
			if a.Score == backend.RouterSigmoid {
				backend.Sigmoid64(p, z)
			} else {
				backend.Softmax64(p, z)
			}
			nan := false
			for j, v := range p {
				score[j] = float64(v)
				if bias != nil {
					score[j] += float64(bias[j])
				}
				nan = nan || math.IsNaN(score[j])
			}
			if nan {
				bad[lo/per] = t
				return
			}
			if keep != nil {
				backend.KeepGroups(keep, score, gscore, gsel)
			}
			s := sel[t*k : (t+1)*k]
			backend.RouteTopK(s, score, nil)
			w := weights[t*k : (t+1)*k]
			var sum float32
			for j, x := range s {
				w[j] = p[x]
				sum += p[x]
			}
			if a.Score == backend.RouterSigmoid {
				sum += 1e-20
			}
			for j := range w {
				if a.NormTopK {
					w[j] /= sum
				}
				w[j] *= scale
				if escale != nil {
					w[j] *= escale[s[j]]
				}
			}
		}
	})
	for _, t := range bad {
		if t >= 0 {
			return fmt.Errorf("cpu: %s: router output of token %d is NaN", op, t)
		}
	}
	for _, x := range sel {
		if counts != nil {
			counts[x]++
		}
	}
	if psum != nil {
		for j := range e {
			s := 0.0
			for t := range n {
				s += float64(probs[t*e+j])
			}
			psum[j] = float32(s)
		}
	}
	return nil
}

// MoERouteBackward implements backend.Optional.MoERouteBackward, in fp64.
func (b *Backend) MoERouteBackward(a backend.MoERouteBackwardArgs) error {
	const op = "moe-route-backward"
	if a.Probs.IsNil() || a.Probs.Rank() != 2 {
		return fmt.Errorf("cpu: %s: probs %v must be [N,E]", op, a.Probs)
	}
	n, e := a.Probs.Dim(0), a.Probs.Dim(1)
	if err := a.Check(op, e); err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	k := a.TopK
	probs, err := f32Matrix(op, "probs", a.Probs, n, e)
	if err != nil {
		return err
	}
	sel, err := i32Matrix(op, "sel", a.Sel, n, k)
	if err != nil {
		return err
	}
	weights, err := f32Matrix(op, "weights", a.Weights, n, k)
	if err != nil {
		return err
	}
	dw, err := f32Matrix(op, "dWeights", a.DWeights, n, k)
	if err != nil {
		return err
	}
	var aux []float32
	if !a.AuxGrad.IsNil() {
		if aux, err = f32Matrix(op, "auxGrad", a.AuxGrad, 1, e); err != nil {
			return err
		}
	}
	if err := moeMatrix(op, "dLogits", a.DLogits, n, e); err != nil {
		return err
	}
	var escale, descale []float32
	if !a.ExpertScale.IsNil() {
		if escale, err = f32Matrix(op, "expertScale", a.ExpertScale, 1, e); err != nil {
			return err
		}
	}
	if !a.DExpertScale.IsNil() {
		if escale == nil {
			return fmt.Errorf("cpu: %s: dExpertScale needs the forward's expertScale", op)
		}
		if descale, err = f32Matrix(op, "dExpertScale", a.DExpertScale, 1, e); err != nil {
			return err
		}
	}
	if err := checkSel(op, sel, e); err != nil {
		return err
	}
	dz, flush, err := b.out(op, "dLogits", a.DLogits, false)
	if err != nil {
		return err
	}
	// gq[n,j] = g[n,j] * q[n,j], the terms of dExpertScale, summed in slot order below.
	var gq []float64
	if descale != nil {
		gq = make([]float64, n*k)
	}
	s := float64(a.Scaling())
	b.pool.rows(n, 64, func(lo, hi int) {
		dp := make([]float64, e)
		for t := lo; t < hi; t++ {
			clear(dp)
			p := probs[t*e : (t+1)*e]
			st := sel[t*k : (t+1)*k]
			w := weights[t*k : (t+1)*k]
			g := dw[t*k : (t+1)*k]
			// ag(j) is g[j] times the slot's expert scale: the gradient of its weight before
			// the scale.
			ag := func(j int) float64 {
				if escale == nil {
					return float64(g[j])
				}
				return float64(g[j]) * float64(escale[st[j]])
			}
			if a.NormTopK {
				d, dot := 0.0, 0.0
				for j, x := range st {
					d += float64(p[x])
					dot += float64(g[j]) * float64(w[j])
				}
				if a.Score == backend.RouterSigmoid {
					d += 1e-20
				}
				for j, x := range st {
					dp[x] += (s*ag(j) - dot) / d
				}
				if gq != nil {
					for j, x := range st {
						gq[t*k+j] = float64(g[j]) * s * float64(p[x]) / d
					}
				}
			} else {
				for j, x := range st {
					dp[x] += s * ag(j)
				}
				if gq != nil {
					for j, x := range st {
						gq[t*k+j] = float64(g[j]) * s * float64(p[x])
					}
				}
			}
			for j, c := range aux {
				dp[j] += float64(c)
			}
			out := dz[t*e : (t+1)*e]
			if a.Score == backend.RouterSigmoid {
				for j, v := range p {
					pv := float64(v)
					out[j] = float32(pv * (1 - pv) * dp[j])
				}
				continue
			}
			dot := 0.0
			for j, v := range p {
				dot += float64(v) * dp[j]
			}
			for j, v := range p {
				out[j] = float32(float64(v) * (dp[j] - dot))
			}
		}
	})
	flush()
	if descale != nil {
		acc := make([]float64, e)
		for i, x := range sel {
			acc[x] += gq[i]
		}
		for j, v := range acc {
			descale[j] = float32(v)
		}
	}
	return nil
}

func checkSel(op string, sel []int32, e int) error {
	for i, x := range sel {
		if x < 0 || int(x) >= e {
			return fmt.Errorf("cpu: %s: slot %d chooses expert %d, outside [0, %d)", op, i, x, e)
		}
	}
	return nil
}

// rowBytes returns t's memory and the byte size of one row of c elements.
func rowBytes(op, name string, t T, c int) ([]byte, int, error) {
	raw, err := hostBytes(op, name, t)
	if err != nil {
		return nil, 0, err
	}
	return raw, c * t.DType().Size(), nil
}

// MoEPermute implements backend.Optional.MoEPermute.
func (b *Backend) MoEPermute(a backend.MoEPermuteArgs) error {
	const op = "moe-permute"
	if a.Sel.IsNil() || a.Sel.Rank() != 2 {
		return fmt.Errorf("cpu: %s: sel %v must be [N,K]", op, a.Sel)
	}
	n, k := a.Sel.Dim(0), a.Sel.Dim(1)
	if a.E < 1 {
		return fmt.Errorf("cpu: %s: %d experts", op, a.E)
	}
	if a.X.IsNil() || a.X.Rank() != 2 || a.X.Dim(0) != n {
		return fmt.Errorf("cpu: %s: x %v must be [N=%d,C]", op, a.X, n)
	}
	c, s := a.X.Dim(1), n*k
	sel, err := ints(op, "sel", a.Sel)
	if err != nil {
		return err
	}
	offsets, err := i32Matrix(op, "offsets", a.Offsets, 1, a.E+1)
	if err != nil {
		return err
	}
	order, err := i32Matrix(op, "order", a.Order, 1, s)
	if err != nil {
		return err
	}
	slot, err := i32Matrix(op, "slot", a.Slot, n, k)
	if err != nil {
		return err
	}
	if err := moeMatrix(op, "xs", a.Xs, s, c); err != nil {
		return err
	}
	if a.Xs.DType() != a.X.DType() {
		return fmt.Errorf("cpu: %s: xs %v must have x's dtype %s", op, a.Xs, a.X.DType())
	}
	if err := checkSel(op, sel, a.E); err != nil {
		return err
	}
	xr, rb, err := rowBytes(op, "x", a.X, c)
	if err != nil {
		return err
	}
	xsr, _, err := rowBytes(op, "xs", a.Xs, c)
	if err != nil {
		return err
	}
	clear(offsets)
	for _, x := range sel {
		offsets[x+1]++
	}
	for e := range a.E {
		offsets[e+1] += offsets[e]
	}
	next := append([]int32(nil), offsets[:a.E]...)
	for i, x := range sel {
		p := next[x]
		next[x]++
		order[p] = int32(i / k)
		slot[i] = p
	}
	b.pool.rows(s, 256, func(lo, hi int) {
		for p := lo; p < hi; p++ {
			src := int(order[p])
			copy(xsr[p*rb:(p+1)*rb], xr[src*rb:(src+1)*rb])
		}
	})
	return nil
}

// slotShapes checks slot [N,K] against a row-stacked [S,C] tensor and an [N,C] tensor.
func slotShapes(op string, slot T, sname string, st T, nname string, nt T) (n, k, c int, sl []int32, err error) {
	if slot.IsNil() || slot.Rank() != 2 {
		return 0, 0, 0, nil, fmt.Errorf("cpu: %s: slot %v must be [N,K]", op, slot)
	}
	n, k = slot.Dim(0), slot.Dim(1)
	if nt.IsNil() || nt.Rank() != 2 || nt.Dim(0) != n {
		return 0, 0, 0, nil, fmt.Errorf("cpu: %s: %s %v must be [N=%d,C]", op, nname, nt, n)
	}
	c = nt.Dim(1)
	if err = moeMatrix(op, sname, st, n*k, c); err != nil {
		return 0, 0, 0, nil, err
	}
	if sl, err = ints(op, "slot", slot); err != nil {
		return 0, 0, 0, nil, err
	}
	if err = checkSel(op, sl, n*k); err != nil {
		return 0, 0, 0, nil, err
	}
	return n, k, c, sl, nil
}

// MoEPermuteBackward implements backend.Optional.MoEPermuteBackward.
func (b *Backend) MoEPermuteBackward(a backend.MoEPermuteBackwardArgs) error {
	const op = "moe-permute-backward"
	n, k, c, slot, err := slotShapes(op, a.Slot, "dXs", a.DXs, "dX", a.DX)
	if err != nil {
		return err
	}
	dxs, err := b.in(op, "dXs", a.DXs)
	if err != nil {
		return err
	}
	dx, flush, err := b.out(op, "dX", a.DX, a.Accumulate)
	if err != nil {
		return err
	}
	b.slotSum(n, k, c, slot, nil, dxs, dx, a.Accumulate)
	flush()
	return nil
}

// slotSum sets (or, accumulating, adds to) dst[t] the sum over j < k of w[t*k+j] * src[slot[t*k+j]]
// for every token t, in fixed j order with fp32 accumulation; nil w weighs every slot 1. It is
// the combine and the permutation's backward alike.
func (b *Backend) slotSum(n, k, c int, slot []int32, w, src, dst []float32, accumulate bool) {
	b.pool.rows(n, 16, func(lo, hi int) {
		acc := make([]float32, c)
		for t := lo; t < hi; t++ {
			clear(acc)
			for j, p := range slot[t*k : (t+1)*k] {
				row := src[int(p)*c : int(p+1)*c]
				if w == nil {
					for i, v := range row {
						acc[i] += v
					}
					continue
				}
				wj := w[t*k+j]
				for i, v := range row {
					acc[i] += wj * v
				}
			}
			out := dst[t*c : (t+1)*c]
			if accumulate {
				for i, v := range acc {
					out[i] += v
				}
			} else {
				copy(out, acc)
			}
		}
	})
}

// MoECombine implements backend.Optional.MoECombine.
func (b *Backend) MoECombine(a backend.MoECombineArgs) error {
	const op = "moe-combine"
	n, k, c, slot, err := slotShapes(op, a.Slot, "ys", a.Ys, "out", a.Out)
	if err != nil {
		return err
	}
	w, err := f32Matrix(op, "weights", a.Weights, n, k)
	if err != nil {
		return err
	}
	ys, err := b.in(op, "ys", a.Ys)
	if err != nil {
		return err
	}
	out, flush, err := b.out(op, "out", a.Out, a.Accumulate)
	if err != nil {
		return err
	}
	b.slotSum(n, k, c, slot, w, ys, out, a.Accumulate)
	flush()
	return nil
}

// MoECombineBackward implements backend.Optional.MoECombineBackward.
func (b *Backend) MoECombineBackward(a backend.MoECombineBackwardArgs) error {
	const op = "moe-combine-backward"
	n, k, c, slot, err := slotShapes(op, a.Slot, "ys", a.Ys, "dOut", a.DOut)
	if err != nil {
		return err
	}
	w, err := f32Matrix(op, "weights", a.Weights, n, k)
	if err != nil {
		return err
	}
	dwt, err := f32Matrix(op, "dWeights", a.DWeights, n, k)
	if err != nil {
		return err
	}
	if err := moeMatrix(op, "dYs", a.DYs, n*k, c); err != nil {
		return err
	}
	if err := overlapErr(op, "dYs", a.DYs, "ys", a.Ys); err != nil {
		return err
	}
	dout, err := b.in(op, "dOut", a.DOut)
	if err != nil {
		return err
	}
	ys, err := b.in(op, "ys", a.Ys)
	if err != nil {
		return err
	}
	dys, flush, err := b.out(op, "dYs", a.DYs, false)
	if err != nil {
		return err
	}
	b.pool.rows(n, 16, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			d := dout[t*c : (t+1)*c]
			for j, p := range slot[t*k : (t+1)*k] {
				wj := w[t*k+j]
				y := ys[int(p)*c : int(p+1)*c]
				dy := dys[int(p)*c : int(p+1)*c]
				dot := 0.0
				for i, v := range d {
					dot += float64(v) * float64(y[i])
					dy[i] = wj * v
				}
				dwt[t*k+j] = float32(dot)
			}
		}
	})
	flush()
	return nil
}

// packedShapes checks gateUp [R,2I] against a [R,I] tensor.
func packedShapes(op string, gateUp T, hname string, half T) (r, i int, err error) {
	if gateUp.IsNil() || gateUp.Rank() < 1 || gateUp.Dim(-1)%2 != 0 {
		return 0, 0, fmt.Errorf("cpu: %s: gateUp %v must be [R,2I]", op, gateUp)
	}
	i = gateUp.Dim(-1) / 2
	if i == 0 {
		return 0, 0, nil
	}
	r = gateUp.Numel() / (2 * i)
	if err = moeMatrix(op, hname, half, r, i); err != nil {
		return 0, 0, err
	}
	return r, i, nil
}

// packedRows runs row on every row of a packed gate|up activation's forward: gateUp [R, 2W]
// (gate columns, then up columns) into out [R, W]. scratch is a W-float buffer per worker.
func (b *Backend) packedRows(op string, out, gateUp T, row func(g, u, dst, scratch []float32)) error {
	r, w, err := packedShapes(op, gateUp, "out", out)
	if err != nil || r == 0 {
		return err
	}
	gu, err := b.in(op, "gateUp", gateUp)
	if err != nil {
		return err
	}
	o, flush, err := b.out(op, "out", out, false)
	if err != nil {
		return err
	}
	b.pool.rows(r, max(1, convChunk/w), func(lo, hi int) {
		sc := make([]float32, w)
		for k := lo; k < hi; k++ {
			row(gu[k*2*w:k*2*w+w], gu[k*2*w+w:(k+1)*2*w], o[k*w:(k+1)*w], sc)
		}
	})
	flush()
	return nil
}

// packedBackwardRows runs row on every row of a packed gate|up activation's backward: from
// dOut [R, W] and the forward's gateUp [R, 2W] into dGateUp [R, 2W] (which may be gateUp: an
// fp32 gateUp is read from a copy), d the row of dOut, dg and du the gate and up halves of its
// gradient.
func (b *Backend) packedBackwardRows(op string, dGateUp, dOut, gateUp T, row func(g, u, d, dg, du, scratch []float32)) error {
	r, w, err := packedShapes(op, gateUp, "dOut", dOut)
	if err != nil || r == 0 {
		return err
	}
	if err := numel(op, "dGateUp", dGateUp, gateUp.Numel(), "numel(gateUp)"); err != nil {
		return err
	}
	gu, err := b.in(op, "gateUp", gateUp)
	if err != nil {
		return err
	}
	if gateUp.DType() == tensor.F32 {
		// dGateUp may be gateUp: read the forward values from a copy.
		gu = append([]float32(nil), gu...)
	}
	d, err := b.in(op, "dOut", dOut)
	if err != nil {
		return err
	}
	dgu, flush, err := b.out(op, "dGateUp", dGateUp, false)
	if err != nil {
		return err
	}
	b.pool.rows(r, max(1, convChunk/w), func(lo, hi int) {
		sc := make([]float32, w)
		for k := lo; k < hi; k++ {
			row(gu[k*2*w:k*2*w+w], gu[k*2*w+w:(k+1)*2*w], d[k*w:(k+1)*w], dgu[k*2*w:k*2*w+w], dgu[k*2*w+w:(k+1)*2*w], sc)
		}
	})
	flush()
	return nil
}

// SwiGLUPacked implements backend.Optional.SwiGLUPacked with SwiGLU's arithmetic.
func (b *Backend) SwiGLUPacked(out, gateUp T) error {
	return b.packedRows("swiglu-packed", out, gateUp, func(g, u, dst, sg []float32) {
		sigmoidInto(sg, g)
		for i, gv := range g {
			dst[i] = gv * sg[i] * u[i]
		}
	})
}

// SwiGLUPackedBackward implements backend.Optional.SwiGLUPackedBackward with SwiGLUBackward's
// arithmetic.
func (b *Backend) SwiGLUPackedBackward(dGateUp, dOut, gateUp T) error {
	return b.packedBackwardRows("swiglu-packed-backward", dGateUp, dOut, gateUp, func(g, u, d, dg, du, sg []float32) {
		sigmoidInto(sg, g)
		for i, gv := range g {
			s, uv, dv := sg[i], u[i], d[i]
			dg[i] = dv * uv * s * (1 + gv*(1-s))
			du[i] = dv * gv * s
		}
	})
}
