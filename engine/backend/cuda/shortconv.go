package cuda

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// Host launchers of kernels/shortconv.cu: the gated causal depthwise short convolution of the
// short-convolution layers, forward and backward.

const shortConvFile = "shortconv.cu"

// ShortConv implements backend.Optional.ShortConv.
func (b *Backend) ShortConv(a backend.ShortConvArgs) error {
	const op = "ShortConv"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	arg := b.args(op)
	pc, cc := arg.float("Conv", a.Conv)
	pg, cg := arg.float("Gated", a.Gated)
	pb, cb := arg.float("BCX", a.BCX)
	pw, cw := arg.float("W", a.W)
	pbias, cbias := arg.optFloat("Bias", a.Bias)
	pp := arg.i32("Positions", a.Positions)
	if err := arg.err(); err != nil {
		return err
	}
	n := int64(d.N) * int64(d.C)
	return b.launch1D(shortConvFile, "shortconv_fwd", n, pc, cc, pg, cg, pb, cb, pw, cw, pbias, cbias, pp,
		int64(d.N), int64(d.C), int32(d.L))
}

// ShortConvBackward implements backend.Optional.ShortConvBackward: the input gradient, then the
// filter and bias gradients (skipped when both are absent).
func (b *Backend) ShortConvBackward(a backend.ShortConvBackwardArgs) error {
	const op = "ShortConvBackward"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	arg := b.args(op)
	pd, cd := arg.float("DBCX", a.DBCX)
	pdg, cdg := arg.float("DGated", a.DGated)
	pb, cb := arg.float("BCX", a.BCX)
	pw, cw := arg.float("W", a.W)
	pc, cc := arg.float("Conv", a.Conv)
	pp := arg.i32("Positions", a.Positions)
	pgw, cgw := arg.optFloat("GW", a.GW)
	pgb, cgb := arg.optFloat("GBias", a.GBias)
	if err := arg.err(); err != nil {
		return err
	}
	nn, nc, l := int64(d.N), int64(d.C), int32(d.L)
	if err := b.launch1D(shortConvFile, "shortconv_bwd_in", nn*nc, pd, cd, pdg, cdg, pb, cb, pw, cw, pc, cc, pp,
		nn, nc, l); err != nil {
		return err
	}
	if a.GW.IsNil() && a.GBias.IsNil() {
		return nil
	}
	return b.launch1D(shortConvFile, "shortconv_bwd_w", int64(l+1)*nc, pgw, cgw, pgb, cgb, pdg, cdg, pb, cb, pp, cc,
		nn, nc, l)
}
