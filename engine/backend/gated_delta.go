package backend

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Gated delta rule, Optional.GatedDelta and Optional.GatedDeltaBackward: the recurrence of the
// gated delta-net linear-attention layers (Qwen3-Next, Qwen3.5; engine/nn's GatedDeltaNet), as
// transformers' torch_recurrent_gated_delta_rule computes it. Letters: N tokens, KH query/key
// heads of KD, VH value heads of VD (key head h/R serves value head h, R = VH/KH).
//
// For every document (CuSeqlens) and value head h, with S [KD,VD] zero at the document's start:
//
//	Ŝ_t = e^{G[t,h]}·S_{t-1}
//	S_t = Ŝ_t + K_t·δ_tᵀ,   δ_t = Beta[t,h]·(V[t,h] - Ŝ_tᵀ·K_t)
//	Out[t,h] = S_tᵀ·Q_t                                            (=)
//
// with Q_t, K_t the rows of key head h/R (already normalised and scaled by the caller). The
// forward also keeps, when States is set, the state before every token t with t % Chunk == 0
// (zero when t starts its document): States [ceil(N/Chunk), VH, KD, VD] F32 (=). The backward
// restarts each stretch of at most Chunk tokens from those states and recomputes the states
// inside it, so that nothing of size N·KD·VD is ever held.
//
// Backward, from DOut [N,VH,VD]: DQ and DK [N,KH,KD] F32 (+=, summed over a key head's value
// heads), DV [N,VH,VD] (=), DBeta and DG [N,VH] F32 (+=) — the gradients of the formula above.
// The (+=) outputs let a device sum the columns of a state with atomic additions; callers zero
// them first for "=".
//
// Fallback (nil members): the float64 host recurrence of engine/nn's GatedDeltaNet, which
// takes the op for every pass but a decoding one.

// GatedDeltaArgs are the operands of Optional.GatedDelta.
type GatedDeltaArgs struct {
	Q, K      T // [N,KH,KD] float (any shape of that many elements)
	V         T // [N,VH,VD] float
	Beta, G   T // [N,VH] float: the write strength and the log decay
	CuSeqlens T // [docs+1] I32: 0 = c_0 <= c_1 <= ... = N
	Out       T // [N,VH,VD] float (=)
	States    T // [ceil(N/Chunk),VH,KD,VD] F32 (=), optional (needed by the backward)
	Chunk     int
	KH, VH    int
	KD, VD    int
}

// GatedDeltaBackwardArgs are the operands of Optional.GatedDeltaBackward.
type GatedDeltaBackwardArgs struct {
	Q, K, V, Beta, G, CuSeqlens T // the forward's
	States                      T // the forward's States (required)
	DOut                        T // [N,VH,VD] float
	DQ, DK                      T // [N,KH,KD] F32 (+=)
	DV                          T // [N,VH,VD] float (=)
	DBeta, DG                   T // [N,VH] F32 (+=)
	Chunk                       int
	KH, VH                      int
	KD, VD                      int
}

// GatedDeltaDims are the sizes of a gated delta rule.
type GatedDeltaDims struct{ N, Docs, KH, VH, KD, VD, Chunk int }

// StateRows is the first dimension of States: ceil(N/Chunk).
func (d GatedDeltaDims) StateRows() int { return (d.N + d.Chunk - 1) / d.Chunk }

// Validate checks the operands and returns the sizes.
func (a GatedDeltaArgs) Validate() (GatedDeltaDims, error) {
	const op = "GatedDelta"
	d, err := gatedDeltaDims(op, a.Q, a.K, a.V, a.Beta, a.G, a.CuSeqlens, a.KH, a.VH, a.KD, a.VD, a.Chunk)
	if err != nil {
		return d, err
	}
	if err := gatedDeltaSize(op, "Out", a.Out, d.N*d.VH*d.VD, false); err != nil {
		return d, err
	}
	if !a.States.IsNil() {
		if err := gatedDeltaSize(op, "States", a.States, d.StateRows()*d.VH*d.KD*d.VD, true); err != nil {
			return d, err
		}
	}
	return d, nil
}

// Validate checks the operands and returns the sizes.
func (a GatedDeltaBackwardArgs) Validate() (GatedDeltaDims, error) {
	const op = "GatedDeltaBackward"
	d, err := gatedDeltaDims(op, a.Q, a.K, a.V, a.Beta, a.G, a.CuSeqlens, a.KH, a.VH, a.KD, a.VD, a.Chunk)
	if err != nil {
		return d, err
	}
	for _, c := range []struct {
		name string
		t    T
		n    int
		f32  bool
	}{
		{"States", a.States, d.StateRows() * d.VH * d.KD * d.VD, true},
		{"DOut", a.DOut, d.N * d.VH * d.VD, false},
		{"DQ", a.DQ, d.N * d.KH * d.KD, true},
		{"DK", a.DK, d.N * d.KH * d.KD, true},
		{"DV", a.DV, d.N * d.VH * d.VD, false},
		{"DBeta", a.DBeta, d.N * d.VH, true},
		{"DG", a.DG, d.N * d.VH, true},
	} {
		if err := gatedDeltaSize(op, c.name, c.t, c.n, c.f32); err != nil {
			return d, err
		}
	}
	return d, nil
}

func gatedDeltaDims(op string, q, k, v, beta, g, cu T, kh, vh, kd, vd, chunk int) (GatedDeltaDims, error) {
	var d GatedDeltaDims
	if kh <= 0 || vh <= 0 || kd <= 0 || vd <= 0 || vh%kh != 0 || chunk <= 0 {
		return d, fmt.Errorf("%s: heads %d/%d of %d/%d, chunk %d: sizes must be positive and value heads a multiple of key heads",
			op, kh, vh, kd, vd, chunk)
	}
	if q.IsNil() || q.Numel()%(kh*kd) != 0 {
		return d, fmt.Errorf("%s: Q %v must hold N rows of KH*KD = %d values", op, q, kh*kd)
	}
	d = GatedDeltaDims{N: q.Numel() / (kh * kd), KH: kh, VH: vh, KD: kd, VD: vd, Chunk: chunk}
	for _, c := range []struct {
		name string
		t    T
		n    int
	}{{"Q", q, d.N * kh * kd}, {"K", k, d.N * kh * kd}, {"V", v, d.N * vh * vd}, {"Beta", beta, d.N * vh}, {"G", g, d.N * vh}} {
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

func gatedDeltaSize(op, name string, t T, n int, f32 bool) error {
	switch {
	case t.IsNil():
		return fmt.Errorf("%s: %s is required", op, name)
	case f32 && t.DType() != tensor.F32:
		return fmt.Errorf("%s: %s %v must be f32", op, name, t)
	case !t.DType().IsFloat():
		return fmt.Errorf("%s: %s %v must be a float tensor", op, name, t)
	case t.Numel() != n:
		return fmt.Errorf("%s: %s %v must have %d elements", op, name, t, n)
	}
	return nil
}
