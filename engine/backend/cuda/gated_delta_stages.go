package cuda

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Host launchers of kernels/gated_delta_stages.cu: the gated delta-net layer's stages around the
// recurrence (the conv, SiLU, l2 norms and gates before it, the gated RMSNorm after it), forward
// and backward, with the per-channel gradients reduced in two deterministic passes.

const gatedDeltaStagesFile = "gated_delta_stages.cu"

// gatedDeltaStagesRows is the number of tokens (rows, for the norm) that one partial of a
// per-channel gradient sums before the fold adds the partials: 256 keeps the partials of a
// Qwen3-Next layer at 4096 tokens to 16 per channel (2 MiB) while giving the first pass
// 16·(D·L + 2·VH) ≈ 0.5M threads.
const gatedDeltaStagesRows = 256

// GatedDeltaPrep implements backend.Optional.GatedDeltaPrep.
func (b *Backend) GatedDeltaPrep(a backend.GatedDeltaPrepArgs) error {
	const op = "GatedDeltaPrep"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	arg := b.args(op)
	pq, pk, pv := arg.ptr("Q", a.Q), arg.ptr("K", a.K), arg.ptr("V", a.V)
	pbeta, pg := arg.ptr("Beta", a.Beta), arg.ptr("G", a.G)
	pm, cm := arg.float("Mixed", a.Mixed)
	pb, cb := arg.float("B", a.B)
	pa, ca := arg.float("A", a.A)
	pc, cc := arg.float("Conv", a.Conv)
	pdt, cdt := arg.float("DtBias", a.DtBias)
	pal, cal := arg.float("ALog", a.ALog)
	pcu := arg.i32("CuSeqlens", a.CuSeqlens)
	if err := arg.err(); err != nil {
		return err
	}
	n := int64(d.N)
	items := n*int64(2*d.KH) + n*int64(d.VH*d.VD) + n*int64(d.VH)
	return b.launch1D(gatedDeltaStagesFile, "gated_delta_prep_fwd", items, pq, pk, pv, pbeta, pg, pm, cm, pb, cb,
		pa, ca, pc, cc, pdt, cdt, pal, cal, pcu, int32(d.Docs), n, int32(d.KH), int32(d.VH), int32(d.KD),
		int32(d.VD), int32(d.L))
}

// GatedDeltaPrepBackward implements backend.Optional.GatedDeltaPrepBackward: the gradient of
// the conv's pre-activation into F32 scratch [N,D] (with DB and DA), the input gradient from it,
// then the partial sums of the parameters' gradients and their folds (skipped for the absent).
func (b *Backend) GatedDeltaPrepBackward(a backend.GatedDeltaPrepBackwardArgs) error {
	const op = "GatedDeltaPrepBackward"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	dpre, err := b.allocScratch(tensor.F32, d.N, d.D) // the first kernel writes every element
	if err != nil {
		return err
	}
	defer b.Free(dpre)
	arg := b.args(op)
	pdpre := arg.ptr("scratch", dpre)
	pdm, cdm := arg.float("DMixed", a.DMixed)
	pdb, cdb := arg.float("DB", a.DB)
	pda, cda := arg.float("DA", a.DA)
	pdq, pdk := arg.ptr("DQ", a.DQ), arg.ptr("DK", a.DK)
	pdv, cdv := arg.float("DV", a.DV)
	pdbeta, pdg := arg.ptr("DBeta", a.DBeta), arg.ptr("DG", a.DG)
	pm, cm := arg.float("Mixed", a.Mixed)
	pb, cb := arg.float("B", a.B)
	pa, ca := arg.float("A", a.A)
	pc, cc := arg.float("Conv", a.Conv)
	pdt, cdt := arg.float("DtBias", a.DtBias)
	pal, cal := arg.float("ALog", a.ALog)
	pcu := arg.i32("CuSeqlens", a.CuSeqlens)
	pgc, cgc := arg.optFloat("GConv", a.GConv)
	pgdt, cgdt := arg.optFloat("GDtBias", a.GDtBias)
	pgal, cgal := arg.optFloat("GALog", a.GALog)
	if err := arg.err(); err != nil {
		return err
	}
	n, docs := int64(d.N), int32(d.Docs)
	items := n*int64(2*d.KH) + n*int64(d.VH*d.VD) + n*int64(d.VH)
	if err := b.launch1D(gatedDeltaStagesFile, "gated_delta_prep_bwd_pre", items, pdpre, pdb, cdb, pda, cda, pdq, pdk,
		pdv, cdv, pdbeta, pdg, pm, cm, pb, cb, pa, ca, pc, cc, pdt, cdt, pal, cal, pcu, docs, n, int32(d.KH),
		int32(d.VH), int32(d.KD), int32(d.VD), int32(d.L)); err != nil {
		return err
	}
	if err := b.launch1D(gatedDeltaStagesFile, "gated_delta_prep_bwd_in", n*int64(d.D), pdm, cdm, pdpre, pc, cc, pcu,
		docs, n, int64(d.D), int32(d.L)); err != nil {
		return err
	}
	if a.GConv.IsNil() && a.GDtBias.IsNil() && a.GALog.IsNil() {
		return nil
	}
	cols := int64(d.D*d.L + 2*d.VH)
	nb := (n + gatedDeltaStagesRows - 1) / gatedDeltaStagesRows
	part, err := b.allocScratch(tensor.F32, int(nb), int(cols)) // every partial is written
	if err != nil {
		return err
	}
	defer b.Free(part)
	parg := b.args(op)
	ppart := parg.ptr("scratch", part)
	if err := parg.err(); err != nil {
		return err
	}
	if err := b.launch1D(gatedDeltaStagesFile, "gated_delta_prep_bwd_part", nb*cols, ppart, pdpre, pm, cm, pdg, pa, ca,
		pdt, cdt, pal, cal, pcu, docs, n, int64(d.D), int32(d.VH), int32(d.L), int64(gatedDeltaStagesRows)); err != nil {
		return err
	}
	for _, g := range []struct {
		p          uintptr
		code       int32
		col0, cols int64
	}{{pgc, cgc, 0, int64(d.D * d.L)}, {pgdt, cgdt, int64(d.D * d.L), int64(d.VH)},
		{pgal, cgal, int64(d.D*d.L + d.VH), int64(d.VH)}} {
		if g.p == 0 {
			continue
		}
		if err := b.launch1D(gatedDeltaStagesFile, "gated_delta_stages_fold", g.cols, g.p, g.code, ppart, nb, cols,
			g.col0, g.cols); err != nil {
			return err
		}
	}
	return nil
}

// GatedRMSNorm implements backend.Optional.GatedRMSNorm.
func (b *Backend) GatedRMSNorm(a backend.GatedRMSNormArgs) error {
	const op = "GatedRMSNorm"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	arg := b.args(op)
	po, co := arg.float("Out", a.Out)
	prs := arg.ptr("RStd", a.RStd)
	px, cx := arg.float("X", a.X)
	pz, cz := arg.float("Z", a.Z)
	pw, cw := arg.float("Weight", a.Weight)
	if err := arg.err(); err != nil {
		return err
	}
	return b.launch1D(gatedDeltaStagesFile, "gated_rmsnorm_fwd", int64(d.R), po, co, prs, px, cx, pz, cz, pw, cw,
		int64(d.R), int32(d.W), a.Eps)
}

// GatedRMSNormBackward implements backend.Optional.GatedRMSNormBackward: DX and DZ per row, then
// (with GWeight) the weight gradient's partials over stretches of rows and their fold.
func (b *Backend) GatedRMSNormBackward(a backend.GatedRMSNormBackwardArgs) error {
	const op = "GatedRMSNormBackward"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	arg := b.args(op)
	pdx, cdx := arg.float("DX", a.DX)
	pdz, cdz := arg.float("DZ", a.DZ)
	pdo, cdo := arg.float("DOut", a.DOut)
	px, cx := arg.float("X", a.X)
	pz, cz := arg.float("Z", a.Z)
	pw, cw := arg.float("Weight", a.Weight)
	prs := arg.ptr("RStd", a.RStd)
	pgw, cgw := arg.optFloat("GWeight", a.GWeight)
	if err := arg.err(); err != nil {
		return err
	}
	r, w := int64(d.R), int64(d.W)
	if err := b.launch1D(gatedDeltaStagesFile, "gated_rmsnorm_bwd", r, pdx, cdx, pdz, cdz, pdo, cdo, px, cx, pz, cz,
		pw, cw, prs, r, int32(d.W)); err != nil {
		return err
	}
	if pgw == 0 {
		return nil
	}
	nb := (r + gatedDeltaStagesRows - 1) / gatedDeltaStagesRows
	part, err := b.allocScratch(tensor.F32, int(nb), d.W) // every partial is written
	if err != nil {
		return err
	}
	defer b.Free(part)
	parg := b.args(op)
	ppart := parg.ptr("scratch", part)
	if err := parg.err(); err != nil {
		return err
	}
	if err := b.launch1D(gatedDeltaStagesFile, "gated_rmsnorm_bwd_part", nb*w, ppart, pdo, cdo, px, cx, pz, cz, prs,
		r, int32(d.W), int64(gatedDeltaStagesRows)); err != nil {
		return err
	}
	return b.launch1D(gatedDeltaStagesFile, "gated_delta_stages_fold", w, pgw, cgw, ppart, nb, w, int64(0), w)
}
