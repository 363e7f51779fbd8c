package backend

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Gated delta-net stages, Optional.GatedDeltaPrep, GatedDeltaPrepBackward, GatedRMSNorm and
// GatedRMSNormBackward: the element-wise and per-head work around the gated delta rule
// (gated_delta.go) in the gated delta-net layers (Qwen3-Next, Qwen3.5; engine/nn's
// GatedDeltaNet), so that a layer's pass keeps its [N, D] rows on the device. Letters as in
// gated_delta.go, with D = 2·KH·KD + VH·VD conv channels (q | k | v) and L taps.
//
// Prep, for every token t of document [lo, hi) (CuSeqlens) and channel c:
//
//	pre[t,c] = Σ_{j<L, s = t+j-L+1 >= lo} Conv[c,j]·Mixed[s,c]      (causal depthwise conv)
//	u = pre·σ(pre)                                                    (SiLU)
//	Q[t,h]  = u_q[t,h]·(Σu_q[t,h]²+1e-6)^-½ / √KD,  K[t,h] = u_k[t,h]·(Σu_k[t,h]²+1e-6)^-½
//	V = u_v,  Beta = σ(B),  G = -exp(ALog[h])·softplus(A + DtBias[h])
//
// per key head h of KD channels (q: channels [0, KH·KD), k: [KH·KD, 2·KH·KD), v: the rest),
// softplus as torch's (threshold 20: x itself above it). Q, K, V, Beta and G are F32, the
// operands of GatedDelta; nothing else is kept, so the backward recomputes pre and the norms
// from Mixed (L multiply-adds per element).
//
// PrepBackward, from DQ, DK, DV, DBeta and DG (GatedDeltaBackward's outputs): the gradients of
// the formulas above. DMixed, DB and DA are written (=); GConv, GDtBias and GALog, the sums
// over all tokens per channel, are added (+=), each summed in an order fixed by the shape
// alone (no atomics), so the result is the same run to run.
//
// GatedRMSNorm, per row r of W values (R = X.Numel()/W rows, W = Weight.Numel(): a value
// head's VD outputs of one token):
//
//	RStd[r] = (Σ_j X[r,j]²/W + Eps)^-½,  Out[r,j] = X[r,j]·RStd[r]·Weight[j]·silu(Z[r,j])
//
// (no 1 + w offset). Backward, from DOut: DX and DZ (=), GWeight[j] (+=) summed over the rows
// in a fixed order.
//
// Fallback (nil members): the float64 host stages of engine/nn's GatedDeltaNet over
// downloaded rows.

// GatedDeltaPrepArgs are the operands of Optional.GatedDeltaPrep.
type GatedDeltaPrepArgs struct {
	Mixed        T // [N,D] float: the conv's input, channels q | k | v
	B, A         T // [N,VH] float: the write-strength and decay projections
	Conv         T // [D,L] float (any shape of D·L elements: nn.Conv1d's [D,1,L])
	DtBias, ALog T // [VH] float
	CuSeqlens    T // [docs+1] I32: 0 = c_0 <= c_1 <= ... = N
	Q, K         T // [N,KH,KD] F32 (=)
	V            T // [N,VH,VD] F32 (=)
	Beta, G      T // [N,VH] F32 (=)
	KH, VH       int
	KD, VD       int
}

// GatedDeltaPrepBackwardArgs are the operands of Optional.GatedDeltaPrepBackward.
type GatedDeltaPrepBackwardArgs struct {
	Mixed, B, A, Conv, DtBias, ALog, CuSeqlens T // the forward's
	DQ, DK                                     T // [N,KH,KD] F32
	DV                                         T // [N,VH,VD] float
	DBeta, DG                                  T // [N,VH] F32
	DMixed                                     T // [N,D] float (=)
	DB, DA                                     T // [N,VH] float (=)
	GConv                                      T // [D,L] float (+=), optional
	GDtBias, GALog                             T // [VH] float (+=), optional
	KH, VH                                     int
	KD, VD                                     int
}

// GatedDeltaPrepDims are the sizes of a gated delta-net prep.
type GatedDeltaPrepDims struct{ N, Docs, D, L, KH, VH, KD, VD int }

// Validate checks the operands and returns the sizes.
func (a GatedDeltaPrepArgs) Validate() (GatedDeltaPrepDims, error) {
	const op = "GatedDeltaPrep"
	d, err := gatedDeltaPrepDims(op, a.Mixed, a.B, a.A, a.Conv, a.DtBias, a.ALog, a.CuSeqlens, a.KH, a.VH, a.KD, a.VD)
	if err != nil {
		return d, err
	}
	for _, c := range []struct {
		name string
		t    T
		n    int
	}{{"Q", a.Q, d.N * d.KH * d.KD}, {"K", a.K, d.N * d.KH * d.KD}, {"V", a.V, d.N * d.VH * d.VD},
		{"Beta", a.Beta, d.N * d.VH}, {"G", a.G, d.N * d.VH}} {
		if err := gatedDeltaSize(op, c.name, c.t, c.n, true); err != nil {
			return d, err
		}
	}
	return d, nil
}

// Validate checks the operands and returns the sizes.
func (a GatedDeltaPrepBackwardArgs) Validate() (GatedDeltaPrepDims, error) {
	const op = "GatedDeltaPrepBackward"
	d, err := gatedDeltaPrepDims(op, a.Mixed, a.B, a.A, a.Conv, a.DtBias, a.ALog, a.CuSeqlens, a.KH, a.VH, a.KD, a.VD)
	if err != nil {
		return d, err
	}
	for _, c := range []struct {
		name string
		t    T
		n    int
		f32  bool
	}{
		{"DQ", a.DQ, d.N * d.KH * d.KD, true},
		{"DK", a.DK, d.N * d.KH * d.KD, true},
		{"DV", a.DV, d.N * d.VH * d.VD, false},
		{"DBeta", a.DBeta, d.N * d.VH, true},
		{"DG", a.DG, d.N * d.VH, true},
		{"DMixed", a.DMixed, d.N * d.D, false},
		{"DB", a.DB, d.N * d.VH, false},
		{"DA", a.DA, d.N * d.VH, false},
	} {
		if err := gatedDeltaSize(op, c.name, c.t, c.n, c.f32); err != nil {
			return d, err
		}
	}
	for _, c := range []struct {
		name string
		t    T
		n    int
	}{{"GConv", a.GConv, d.D * d.L}, {"GDtBias", a.GDtBias, d.VH}, {"GALog", a.GALog, d.VH}} {
		if c.t.IsNil() {
			continue
		}
		if err := gatedDeltaSize(op, c.name, c.t, c.n, false); err != nil {
			return d, err
		}
	}
	return d, nil
}

func gatedDeltaPrepDims(op string, mixed, b, a, conv, dt, alog, cu T, kh, vh, kd, vd int) (GatedDeltaPrepDims, error) {
	var d GatedDeltaPrepDims
	if kh <= 0 || vh <= 0 || kd <= 0 || vd <= 0 || vh%kh != 0 {
		return d, fmt.Errorf("%s: heads %d/%d of %d/%d: sizes must be positive and value heads a multiple of key heads",
			op, kh, vh, kd, vd)
	}
	d = GatedDeltaPrepDims{D: 2*kh*kd + vh*vd, KH: kh, VH: vh, KD: kd, VD: vd}
	if mixed.IsNil() || mixed.Numel()%d.D != 0 {
		return d, fmt.Errorf("%s: Mixed %v must hold N rows of D = 2·KH·KD + VH·VD = %d values", op, mixed, d.D)
	}
	d.N = mixed.Numel() / d.D
	if conv.IsNil() || conv.Numel() == 0 || conv.Numel()%d.D != 0 {
		return d, fmt.Errorf("%s: Conv %v must hold D·L values (D = %d)", op, conv, d.D)
	}
	d.L = conv.Numel() / d.D
	for _, c := range []struct {
		name string
		t    T
		n    int
	}{{"Mixed", mixed, d.N * d.D}, {"B", b, d.N * vh}, {"A", a, d.N * vh}, {"Conv", conv, d.D * d.L},
		{"DtBias", dt, vh}, {"ALog", alog, vh}} {
		if err := gatedDeltaSize(op, c.name, c.t, c.n, false); err != nil {
			return d, err
		}
	}
	if cu.IsNil() || cu.DType() != tensor.I32 || cu.Numel() < 2 {
		return d, fmt.Errorf("%s: CuSeqlens %v must be i32 with at least 2 boundaries", op, cu)
	}
	d.Docs = cu.Numel() - 1
	return d, nil
}

// GatedRMSNormArgs are the operands of Optional.GatedRMSNorm.
type GatedRMSNormArgs struct {
	X      T // [R,W] float (any shape of R·W elements)
	Z      T // [R,W] float: the gate
	Weight T // [W] float
	Out    T // [R,W] float (=)
	RStd   T // [R] F32 (=), read by the backward
	Eps    float32
}

// GatedRMSNormBackwardArgs are the operands of Optional.GatedRMSNormBackward.
type GatedRMSNormBackwardArgs struct {
	DOut         T // [R,W] float
	X, Z, Weight T // the forward's
	RStd         T // the forward's RStd
	DX, DZ       T // [R,W] float (=)
	GWeight      T // [W] float (+=), optional
}

// GatedRMSNormDims are the sizes of a gated RMSNorm: R rows of W.
type GatedRMSNormDims struct{ R, W int }

// Validate checks the operands and returns the sizes.
func (a GatedRMSNormArgs) Validate() (GatedRMSNormDims, error) {
	const op = "GatedRMSNorm"
	d, err := gatedRMSNormDims(op, a.X, a.Z, a.Weight, a.RStd)
	if err != nil {
		return d, err
	}
	return d, gatedDeltaSize(op, "Out", a.Out, d.R*d.W, false)
}

// Validate checks the operands and returns the sizes.
func (a GatedRMSNormBackwardArgs) Validate() (GatedRMSNormDims, error) {
	const op = "GatedRMSNormBackward"
	d, err := gatedRMSNormDims(op, a.X, a.Z, a.Weight, a.RStd)
	if err != nil {
		return d, err
	}
	for _, c := range []struct {
		name string
		t    T
	}{{"DOut", a.DOut}, {"DX", a.DX}, {"DZ", a.DZ}} {
		if err := gatedDeltaSize(op, c.name, c.t, d.R*d.W, false); err != nil {
			return d, err
		}
	}
	if !a.GWeight.IsNil() {
		if err := gatedDeltaSize(op, "GWeight", a.GWeight, d.W, false); err != nil {
			return d, err
		}
	}
	return d, nil
}

func gatedRMSNormDims(op string, x, z, w, rstd T) (GatedRMSNormDims, error) {
	var d GatedRMSNormDims
	if w.IsNil() || w.Numel() == 0 || !w.DType().IsFloat() {
		return d, fmt.Errorf("%s: Weight %v must be a non-empty float tensor", op, w)
	}
	d.W = w.Numel()
	if x.IsNil() || x.Numel()%d.W != 0 {
		return d, fmt.Errorf("%s: X %v must hold rows of W = %d values", op, x, d.W)
	}
	d.R = x.Numel() / d.W
	for _, c := range []struct {
		name string
		t    T
		n    int
		f32  bool
	}{{"X", x, d.R * d.W, false}, {"Z", z, d.R * d.W, false}, {"RStd", rstd, d.R, true}} {
		if err := gatedDeltaSize(op, c.name, c.t, c.n, c.f32); err != nil {
			return d, err
		}
	}
	return d, nil
}
