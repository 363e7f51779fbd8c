package nn

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// The per-head output gate of Laguna's attention (Attention.HeadGate, g_proj [NH, C]): each
// head's attention output is scaled by the softplus of one gate logit per token and head,
// before o_proj:
//
//	g      = x · HeadGate^T                 [N, NH]
//	gated  = out[n, h·HD:(h+1)·HD] · softplus(g[n, h])      [N, NH·HD]
//
// Backward: dout = dgated·softplus(g), dg[n,h] = σ(g[n,h]) · Σ_d dgated[n,h,d]·out[n,h,d], and
// HeadGate's own backward from dg (its weight gradient +=, dx +=). The gate is applied on the
// host (fp32), so every backend runs it through Download and Upload. Cached for backward: g
// (c.gate) and the gated output (c.gated); out is the attention's own cache. softplus is
// torch's (threshold 20), shared with the gated delta-net.

// applyHeadGate returns a new out scaled per head by softplus(g).
func (a *Attention) applyHeadGate(p *Pass, out, g T) (T, error) {
	o, err := backend.ToFloat32(p.B, out)
	if err != nil {
		return T{}, wrap(a.Name+" head gate", err)
	}
	gv, err := backend.ToFloat32(p.B, g)
	if err != nil {
		return T{}, wrap(a.Name+" head gate", err)
	}
	if len(gv)*a.HD != len(o) {
		return T{}, fmt.Errorf("nn: %s: head gate of %d values for %d outputs of heads of %d", a.Name, len(gv), len(o), a.HD)
	}
	for i, v := range gv {
		s := float32(softplus(float64(v)))
		for d := 0; d < a.HD; d++ {
			o[i*a.HD+d] *= s
		}
	}
	y, err := backend.FromFloat32(p.B, o, out.DType(), out.Shape()...)
	return y, wrap(a.Name+" head gate", err)
}

// headGateBackward returns new dout [N, NH·HD] and dg [N, NH] for dgated, the gradient of the
// gated output.
func (a *Attention) headGateBackward(p *Pass, dgated, out, g T) (dout, dg T, err error) {
	dy, err := backend.ToFloat32(p.B, dgated)
	if err != nil {
		return T{}, T{}, wrap(a.Name+" head gate", err)
	}
	o, err := backend.ToFloat32(p.B, out)
	if err != nil {
		return T{}, T{}, wrap(a.Name+" head gate", err)
	}
	gv, err := backend.ToFloat32(p.B, g)
	if err != nil {
		return T{}, T{}, wrap(a.Name+" head gate", err)
	}
	do, dgv := make([]float32, len(dy)), make([]float32, len(gv))
	for i, v := range gv {
		s := softplus(float64(v))
		sum := 0.0
		for d := 0; d < a.HD; d++ {
			j := i*a.HD + d
			do[j] = float32(float64(dy[j]) * s)
			sum += float64(dy[j]) * float64(o[j])
		}
		if v <= 20 {
			sum *= sigmoid(float64(v)) // softplus' = σ below the threshold, 1 above it
		}
		dgv[i] = float32(sum)
	}
	if dout, err = backend.FromFloat32(p.B, do, dgated.DType(), dgated.Shape()...); err != nil {
		return T{}, T{}, wrap(a.Name+" head gate", err)
	}
	if dg, err = backend.FromFloat32(p.B, dgv, g.DType(), g.Shape()...); err != nil {
		_ = free(p.B, &dout)
		return T{}, T{}, wrap(a.Name+" head gate", err)
	}
	return dout, dg, nil
}
