package backend

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Short convolution, Optional.ShortConv and Optional.ShortConvBackward: the gated causal
// depthwise convolution between the two projections of a short-convolution layer (LFM2's conv
// operator, engine/nn's ShortConv). Letters: N tokens, C channels, L taps.
//
// Forward, for token n and channel c, with BCX [N,3C] the input projection's rows (columns
// B | Cg | X) and pos[n] the position of token n in its document:
//
//	bx[n,c]    = round(B[n,c] * X[n,c])
//	Conv[n,c]  = round(Bias[c] + sum_{k<L, back=L-1-k <= pos[n]} W[c,k] * bx[n-back,c])
//	Gated[n,c] = round(Cg[n,c] * Conv[n,c])
//
// round is the rounding to the dtype of Conv and Gated (the pass dtype), as the host block
// rounds them; a token sees the L-1 tokens before it in its own document only (earlier rows,
// and rows before the first, count as zero), so packed documents never mix.
//
// Backward, with dG [N,C] the gradient of Gated and dConv = dG * Cg (fp32):
//
//	dbx[n,c]  = sum_{back<L, n+back<N, pos[n+back] >= back} W[c,L-1-back] * dConv[n+back,c]
//	dB = dbx * X, dCg = dG * Conv, dX = dbx * B   (DBCX [N,3C] =)
//	GW[c,k]  += sum_n dConv[n,c] * bx[n-(L-1-k),c] (over the taps the forward used)
//	GBias[c] += sum_n dConv[n,c]
//
// bx is recomputed from BCX in the backward rather than stored.
//
// Fallback (nil members): the host computation of engine/nn's ShortConv over downloaded rows.

// ShortConvArgs are the operands of Optional.ShortConv.
type ShortConvArgs struct {
	BCX       T // [N,3C] float: B | Cg | X
	W         T // [C,L] float (any shape of C*L elements: nn.Conv1d's [C,1,L])
	Bias      T // [C] float, optional
	Positions T // [N] I32: each token's position in its document
	Conv      T // [N,C] float (=), read by the backward
	Gated     T // [N,C] float (=), Conv's dtype
}

// ShortConvBackwardArgs are the operands of Optional.ShortConvBackward.
type ShortConvBackwardArgs struct {
	DGated    T // [N,C] float
	BCX       T // [N,3C] the forward's
	W         T // [C,L] the forward's
	Positions T // [N] I32 the forward's
	Conv      T // [N,C] the forward's Conv
	DBCX      T // [N,3C] float (=)
	GW        T // [C,L] float (+=), optional (a frozen filter)
	GBias     T // [C] float (+=), optional
}

// ShortConvDims are the sizes of a short convolution.
type ShortConvDims struct{ N, C, L int }

// Validate checks the operands and returns the sizes.
func (a ShortConvArgs) Validate() (ShortConvDims, error) {
	d, err := shortConvDims("ShortConv", a.BCX, a.W, a.Positions)
	if err != nil {
		return d, err
	}
	if err := shortConvRows("ShortConv", d, []string{"Conv", "Gated"}, a.Conv, a.Gated); err != nil {
		return d, err
	}
	if a.Conv.DType() != a.Gated.DType() {
		return d, fmt.Errorf("ShortConv: Conv %v and Gated %v must share a dtype", a.Conv, a.Gated)
	}
	if !a.Bias.IsNil() && (!a.Bias.DType().IsFloat() || a.Bias.Numel() != d.C) {
		return d, fmt.Errorf("ShortConv: Bias %v must be a float tensor of C = %d elements", a.Bias, d.C)
	}
	return d, nil
}

// Validate checks the operands and returns the sizes.
func (a ShortConvBackwardArgs) Validate() (ShortConvDims, error) {
	const op = "ShortConvBackward"
	d, err := shortConvDims(op, a.BCX, a.W, a.Positions)
	if err != nil {
		return d, err
	}
	if err := shortConvRows(op, d, []string{"DGated", "Conv"}, a.DGated, a.Conv); err != nil {
		return d, err
	}
	if a.DBCX.IsNil() || !a.DBCX.DType().IsFloat() || a.DBCX.Rank() != 2 || a.DBCX.Dim(0) != d.N || a.DBCX.Dim(1) != 3*d.C {
		return d, fmt.Errorf("%s: DBCX %v must be a float tensor [%d, %d]", op, a.DBCX, d.N, 3*d.C)
	}
	if !a.GW.IsNil() && (!a.GW.DType().IsFloat() || a.GW.Numel() != d.C*d.L) {
		return d, fmt.Errorf("%s: GW %v must be a float tensor of C*L = %d elements", op, a.GW, d.C*d.L)
	}
	if !a.GBias.IsNil() && (!a.GBias.DType().IsFloat() || a.GBias.Numel() != d.C) {
		return d, fmt.Errorf("%s: GBias %v must be a float tensor of C = %d elements", op, a.GBias, d.C)
	}
	return d, nil
}

func shortConvDims(op string, bcx, w, pos T) (ShortConvDims, error) {
	var d ShortConvDims
	if bcx.IsNil() || !bcx.DType().IsFloat() || bcx.Rank() != 2 || bcx.Dim(1)%3 != 0 || bcx.Dim(1) == 0 {
		return d, fmt.Errorf("%s: BCX %v must be a float tensor [N, 3C]", op, bcx)
	}
	d.N, d.C = bcx.Dim(0), bcx.Dim(1)/3
	if w.IsNil() || !w.DType().IsFloat() || w.Numel()%d.C != 0 || w.Numel() == 0 {
		return d, fmt.Errorf("%s: W %v must be a float filter of C*L elements (C = %d)", op, w, d.C)
	}
	d.L = w.Numel() / d.C
	if pos.IsNil() || pos.DType() != tensor.I32 || pos.Numel() != d.N {
		return d, fmt.Errorf("%s: Positions %v must be i32 with N = %d elements", op, pos, d.N)
	}
	return d, nil
}

func shortConvRows(op string, d ShortConvDims, names []string, ts ...T) error {
	for i, t := range ts {
		name := names[i]
		if t.IsNil() || !t.DType().IsFloat() || t.Rank() != 2 || t.Dim(0) != d.N || t.Dim(1) != d.C {
			return fmt.Errorf("%s: %s %v must be a float tensor [%d, %d]", op, name, t, d.N, d.C)
		}
	}
	return nil
}
