package nn

import (
	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// The device path of GatedDeltaNet: every stage runs as a backend op on device tensors, for
// every pass but a decoding one, when the backend has the stage ops (Optional.GatedDeltaPrep,
// GatedRMSNorm and their backwards, gated_delta_stages.go in engine/backend) besides the
// recurrence (GatedDelta). Nothing of [N, D] size crosses to the host.
//
//	projections → mixed, z, b, a          (activation dtype; Grouped: CopyColumns out of
//	                                        in_proj_qkvz and in_proj_ba)
//	GatedDeltaPrep → q̂, k̂, v, β, g        (F32, the recurrence's operands)
//	GatedDelta → o                        (F32), the states every stateChunk tokens (F32)
//	GatedRMSNorm → core                   (activation dtype, out_proj's input), rs (F32)
//
// Cached for backward, on the device: mixed, z, b and a in the activation dtype (the
// projections' outputs as they are), o and rs in F32 (the norm's input at the precision the
// recurrence gives it) and the recurrent states in F32. q̂, k̂, v, β and g are recomputed in
// backward by a second GatedDeltaPrep (a few multiply-adds per element, against F32 copies of
// size N·D that would otherwise be held from forward to backward), and core by a second
// GatedRMSNorm.

// stagesOnDevice reports whether the pass takes the device path: the recurrence runs in the
// backend op (onDevice) and the backend has the stage ops.
func (l *GatedDeltaNet) stagesOnDevice(p *Pass) bool {
	o := p.B.Optional()
	return l.onDevice(p) && o.GatedDeltaPrep != nil && o.GatedDeltaPrepBackward != nil &&
		o.GatedRMSNorm != nil && o.GatedRMSNormBackward != nil
}

// forwardDevice runs the layer up to out_proj's input on the device and returns that input
// core [N, VH·VD] (new, in the activation dtype), caching what backwardDevice reads.
func (l *GatedDeltaNet) forwardDevice(p *Pass, x T, keep bool) (core T, err error) {
	c, n, vd := &l.c, p.N, l.VH*l.VD
	c.stages = true
	if err = l.projectDevice(p, x); err != nil {
		return T{}, err
	}
	in, release, err := l.prepDevice(p)
	if err != nil {
		return T{}, err
	}
	defer release()
	if c.devO, err = p.outF32(n, vd); err != nil {
		return T{}, wrap(l.Name, err)
	}
	if keep {
		if c.devStates, err = p.B.Empty(tensor.F32, (n+stateChunk-1)/stateChunk, l.VH, l.KD, l.VD); err != nil {
			return T{}, wrap(l.Name, err)
		}
	}
	if err = p.B.Optional().GatedDelta(backend.GatedDeltaArgs{Q: in[0], K: in[1], V: in[2], Beta: in[3], G: in[4],
		CuSeqlens: p.CuSeqlens, Out: c.devO, States: c.devStates, Chunk: stateChunk,
		KH: l.KH, VH: l.VH, KD: l.KD, VD: l.VD}); err != nil {
		return T{}, wrap(l.Name, err)
	}
	if c.devRS, err = p.outF32(n * l.VH); err != nil {
		return T{}, wrap(l.Name, err)
	}
	return l.gatedNormDevice(p)
}

// gatedNormDevice runs GatedRMSNorm over the cached o and z into a new core, writing rs.
func (l *GatedDeltaNet) gatedNormDevice(p *Pass) (core T, err error) {
	c := &l.c
	if core, err = p.out(p.N, l.VH*l.VD); err != nil {
		return T{}, wrap(l.Name, err)
	}
	if err = p.B.Optional().GatedRMSNorm(backend.GatedRMSNormArgs{X: c.devO, Z: c.devZ, Weight: l.NormW,
		Out: core, RStd: c.devRS, Eps: l.Eps}); err != nil {
		_ = free(p.B, &core)
		return T{}, wrap(l.Name, err)
	}
	return core, nil
}

// projectDevice runs the input projections into the cached mixed [N,D], z [N,VH·VD], b and a
// [N,VH]: the projections' own outputs, or (Grouped) column blocks copied out of in_proj_qkvz
// and in_proj_ba by the layout of groupedLayout.
func (l *GatedDeltaNet) projectDevice(p *Pass, x T) error {
	c := &l.c
	if !l.Grouped {
		for _, pr := range []struct {
			lin *Linear
			dst *T
		}{{&l.QKV, &c.devMixed}, {&l.Z, &c.devZ}, {&l.B, &c.devB}, {&l.A, &c.devA}} {
			y, err := pr.lin.Forward(p, x)
			if err != nil {
				return err
			}
			*pr.dst = y
		}
		return nil
	}
	qkvz, err := l.QKVZ.Forward(p, x)
	if err != nil {
		return err
	}
	defer func() { _ = free(p.B, &qkvz) }()
	ba, err := l.BA.Forward(p, x)
	if err != nil {
		return err
	}
	defer func() { _ = free(p.B, &ba) }()
	n := p.N
	for _, a := range []struct {
		dst  *T
		cols int
	}{{&c.devMixed, l.convDim()}, {&c.devZ, l.VH * l.VD}, {&c.devB, l.VH}, {&c.devA, l.VH}} {
		if *a.dst, err = p.out(n, a.cols); err != nil {
			return wrap(l.Name, err)
		}
	}
	for _, cp := range l.groupedCopies(c.devMixed, c.devZ, c.devB, c.devA, qkvz, ba) {
		if err := p.B.CopyColumns(cp); err != nil {
			return wrap(l.Name+" projection layout", err)
		}
	}
	return nil
}

// groupedCopies are the column copies from in_proj_qkvz's rows (key head g's block: q, k,
// R·v, R·z) and in_proj_ba's (R·b, R·a) into mixed (q | k | v), z, b and a. Swapping each
// copy's Dst and Src with its offsets and strides gives the backward's layout.
func (l *GatedDeltaNet) groupedCopies(mixed, z, b, a, qkvz, ba T) []backend.ColumnCopyArgs {
	r := l.VH / l.KH
	kd, rv := l.KH*l.KD, r*l.VD
	group := 2*l.KD + 2*rv
	blk := func(dst, src T, w, dOff, dStride, sOff, sStride int) backend.ColumnCopyArgs {
		return backend.ColumnCopyArgs{Dst: dst, Src: src, Groups: l.KH, Width: w,
			DstOffset: dOff, DstStride: dStride, SrcOffset: sOff, SrcStride: sStride}
	}
	return []backend.ColumnCopyArgs{
		blk(mixed, qkvz, l.KD, 0, l.KD, 0, group),
		blk(mixed, qkvz, l.KD, kd, l.KD, l.KD, group),
		blk(mixed, qkvz, rv, 2*kd, rv, 2*l.KD, group),
		blk(z, qkvz, rv, 0, rv, 2*l.KD+rv, group),
		blk(b, ba, r, 0, r, 0, 2*r),
		blk(a, ba, r, 0, r, r, 2*r),
	}
}

// prepDevice runs GatedDeltaPrep on the cached projections: q̂, k̂, v, β and g as new F32
// tensors, and a release that frees them.
func (l *GatedDeltaNet) prepDevice(p *Pass) (ts [5]T, release func(), err error) {
	c, n := &l.c, p.N
	release = func() {
		for i := range ts {
			_ = free(p.B, &ts[i])
		}
	}
	for i, cols := range []int{l.KH * l.KD, l.KH * l.KD, l.VH * l.VD, l.VH, l.VH} {
		if ts[i], err = p.outF32(n, cols); err != nil {
			release()
			return ts, nil, wrap(l.Name, err)
		}
	}
	if err = p.B.Optional().GatedDeltaPrep(backend.GatedDeltaPrepArgs{Mixed: c.devMixed, B: c.devB, A: c.devA,
		Conv: l.Conv, DtBias: l.DtBias, ALog: l.ALog, CuSeqlens: p.CuSeqlens,
		Q: ts[0], K: ts[1], V: ts[2], Beta: ts[3], G: ts[4], KH: l.KH, VH: l.VH, KD: l.KD, VD: l.VD}); err != nil {
		release()
		return ts, nil, wrap(l.Name, err)
	}
	return ts, release, nil
}

// backwardDevice is Backward on the device path: out_proj's backward on a recomputed core,
// the gated norm's, the recurrence's on recomputed q̂, k̂, v, β and g, the prep's, and the
// projections'. dx is new (=); the parameters' gradients accumulate (+=).
func (l *GatedDeltaNet) backwardDevice(p *Pass, dy T) (dx T, err error) {
	c, n, vd := &l.c, p.N, l.VH*l.VD
	var tmp []*T
	defer func() {
		for _, t := range tmp {
			_ = free(p.B, t)
		}
	}()
	newT := func(dst *T, f32, zero bool, shape ...int) error {
		var e error
		switch {
		case f32 && zero:
			*dst, e = p.allocF32(shape...)
		case f32:
			*dst, e = p.outF32(shape...)
		default:
			*dst, e = p.out(shape...)
		}
		tmp = append(tmp, dst)
		if e != nil {
			return wrap(l.Name, e)
		}
		return nil
	}
	var core, dcore, do, dz T
	if core, err = l.gatedNormDevice(p); err != nil {
		return T{}, err
	}
	tmp = append(tmp, &core)
	if err = newT(&dcore, false, false, n, vd); err != nil {
		return T{}, err
	}
	if err = l.Out.Backward(p, dcore, dy, core, false); err != nil {
		return T{}, err
	}
	if err = newT(&do, true, false, n, vd); err != nil {
		return T{}, err
	}
	if err = newT(&dz, false, false, n, vd); err != nil {
		return T{}, err
	}
	if err = p.B.Optional().GatedRMSNormBackward(backend.GatedRMSNormBackwardArgs{DOut: dcore, X: c.devO, Z: c.devZ,
		Weight: l.NormW, RStd: c.devRS, DX: do, DZ: dz, GWeight: l.GNormW}); err != nil {
		return T{}, wrap(l.Name, err)
	}
	in, release, err := l.prepDevice(p)
	if err != nil {
		return T{}, err
	}
	defer release()
	// dq, dk, dβ and dg accumulate in the op (+=): zeroed here.
	var dq, dk, dv, dbeta, dg T
	kd := l.KH * l.KD
	for _, g := range []struct {
		dst  *T
		zero bool
		cols int
	}{{&dq, true, kd}, {&dk, true, kd}, {&dv, false, vd}, {&dbeta, true, l.VH}, {&dg, true, l.VH}} {
		if err = newT(g.dst, true, g.zero, n, g.cols); err != nil {
			return T{}, err
		}
	}
	if err = p.B.Optional().GatedDeltaBackward(backend.GatedDeltaBackwardArgs{Q: in[0], K: in[1], V: in[2],
		Beta: in[3], G: in[4], CuSeqlens: p.CuSeqlens, States: c.devStates, DOut: do,
		DQ: dq, DK: dk, DV: dv, DBeta: dbeta, DG: dg, Chunk: stateChunk,
		KH: l.KH, VH: l.VH, KD: l.KD, VD: l.VD}); err != nil {
		return T{}, wrap(l.Name, err)
	}
	var dmixed, db, da T
	if err = newT(&dmixed, false, false, n, l.convDim()); err != nil {
		return T{}, err
	}
	if err = newT(&db, false, false, n, l.VH); err != nil {
		return T{}, err
	}
	if err = newT(&da, false, false, n, l.VH); err != nil {
		return T{}, err
	}
	if err = p.B.Optional().GatedDeltaPrepBackward(backend.GatedDeltaPrepBackwardArgs{Mixed: c.devMixed,
		B: c.devB, A: c.devA, Conv: l.Conv, DtBias: l.DtBias, ALog: l.ALog, CuSeqlens: p.CuSeqlens,
		DQ: dq, DK: dk, DV: dv, DBeta: dbeta, DG: dg, DMixed: dmixed, DB: db, DA: da,
		GConv: l.GConv, GDtBias: l.GDtBias, GALog: l.GALog, KH: l.KH, VH: l.VH, KD: l.KD, VD: l.VD}); err != nil {
		return T{}, wrap(l.Name, err)
	}
	if dx, err = p.alloc(c.x.Shape()...); err != nil {
		return T{}, wrap(l.Name, err)
	}
	if err = l.projectBackwardDevice(p, dx, dmixed, dz, db, da); err != nil {
		_ = free(p.B, &dx)
		return T{}, err
	}
	return dx, nil
}

// projectBackwardDevice runs the projections' backward into dx (+=) from the gradients of
// mixed, z, b and a, laid out (Grouped) as in_proj_qkvz's and in_proj_ba's rows by the
// reverse of groupedCopies, which together cover every column.
func (l *GatedDeltaNet) projectBackwardDevice(p *Pass, dx, dmixed, dz, db, da T) error {
	c := &l.c
	type part struct {
		lin  *Linear
		grad T
	}
	parts := []part{{&l.QKV, dmixed}, {&l.Z, dz}, {&l.B, db}, {&l.A, da}}
	if l.Grouped {
		var dqkvz, dba T
		defer func() { _ = free(p.B, &dqkvz, &dba) }()
		var err error
		if dqkvz, err = p.out(p.N, l.convDim()+l.VH*l.VD); err != nil {
			return wrap(l.Name, err)
		}
		if dba, err = p.out(p.N, 2*l.VH); err != nil {
			return wrap(l.Name, err)
		}
		for _, cp := range l.groupedCopies(dmixed, dz, db, da, dqkvz, dba) {
			cp.Dst, cp.Src = cp.Src, cp.Dst
			cp.DstOffset, cp.SrcOffset = cp.SrcOffset, cp.DstOffset
			cp.DstStride, cp.SrcStride = cp.SrcStride, cp.DstStride
			if err := p.B.CopyColumns(cp); err != nil {
				return wrap(l.Name+" projection layout", err)
			}
		}
		parts = []part{{&l.QKVZ, dqkvz}, {&l.BA, dba}}
	}
	for _, pt := range parts {
		if err := pt.lin.Backward(p, dx, pt.grad, c.x, true); err != nil {
			return err
		}
	}
	return nil
}
