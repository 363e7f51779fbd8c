package nn

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// The output gate of Qwen3-Next's full attention (Attention.OutGate). q_proj projects, for each
// head h, HD queries and then HD gate values: columns [2h·HD, (2h+1)·HD) are its queries and
// [(2h+1)·HD, (2h+2)·HD) its gate. The attention output is scaled elementwise before o_proj:
//
//	gated = out · σ(gate)        [N, NH·HD]
//
// Backward: dout = dgated·σ(gate), dgate = dgated·out·σ(gate)(1-σ(gate)). The gate is applied
// on the host (fp32), so every backend runs it through Download and Upload. Cached for
// backward: gate and gated (device, the activation dtype); out is the attention's own cache.

// splitGate copies the query and gate columns of qg [N, NH·2·HD] into new q and gate tensors
// [N, NH·HD].
func (a *Attention) splitGate(p *Pass, qg T) (q, gate T, err error) {
	hd := a.HD
	for i, dst := range []*T{&q, &gate} {
		if *dst, err = p.out(p.N, a.NH*hd); err != nil {
			_ = free(p.B, &q, &gate)
			return T{}, T{}, wrap(a.Name, err)
		}
		if err = p.B.CopyColumns(backend.ColumnCopyArgs{Dst: *dst, Src: qg, Groups: a.NH, Width: hd,
			DstStride: hd, SrcOffset: i * hd, SrcStride: 2 * hd}); err != nil {
			_ = free(p.B, &q, &gate)
			return T{}, T{}, wrap(a.Name+" output gate", err)
		}
	}
	return q, gate, nil
}

// joinGate lays dq and dgate [N, NH·HD] out as q_proj's output gradient [N, NH·2·HD] (new).
func (a *Attention) joinGate(p *Pass, dq, dgate T) (T, error) {
	hd := a.HD
	dqg, err := p.out(p.N, 2*a.NH*hd)
	if err != nil {
		return T{}, wrap(a.Name, err)
	}
	for i, src := range []T{dq, dgate} {
		if err = p.B.CopyColumns(backend.ColumnCopyArgs{Dst: dqg, Src: src, Groups: a.NH, Width: hd,
			DstOffset: i * hd, DstStride: 2 * hd, SrcStride: hd}); err != nil {
			_ = free(p.B, &dqg)
			return T{}, wrap(a.Name+" output gate", err)
		}
	}
	return dqg, nil
}

// applyGate returns a new out·σ(gate).
func (a *Attention) applyGate(p *Pass, out, gate T) (T, error) {
	o, err := backend.ToFloat32(p.B, out)
	if err != nil {
		return T{}, wrap(a.Name+" output gate", err)
	}
	g, err := backend.ToFloat32(p.B, gate)
	if err != nil {
		return T{}, wrap(a.Name+" output gate", err)
	}
	if len(o) != len(g) {
		return T{}, fmt.Errorf("nn: %s: output gate of %d values for %d outputs", a.Name, len(g), len(o))
	}
	for i := range o {
		o[i] *= float32(1 / (1 + math.Exp(-float64(g[i]))))
	}
	y, err := backend.FromFloat32(p.B, o, out.DType(), out.Shape()...)
	return y, wrap(a.Name+" output gate", err)
}

// gateBackward returns new dout and dgate for dgated, the gradient of out·σ(gate).
func (a *Attention) gateBackward(p *Pass, dgated, out, gate T) (dout, dgate T, err error) {
	dy, err := backend.ToFloat32(p.B, dgated)
	if err != nil {
		return T{}, T{}, wrap(a.Name+" output gate", err)
	}
	o, err := backend.ToFloat32(p.B, out)
	if err != nil {
		return T{}, T{}, wrap(a.Name+" output gate", err)
	}
	g, err := backend.ToFloat32(p.B, gate)
	if err != nil {
		return T{}, T{}, wrap(a.Name+" output gate", err)
	}
	do, dg := make([]float32, len(dy)), make([]float32, len(dy))
	for i := range dy {
		s := 1 / (1 + math.Exp(-float64(g[i])))
		do[i] = float32(float64(dy[i]) * s)
		dg[i] = float32(float64(dy[i]) * float64(o[i]) * s * (1 - s))
	}
	if dout, err = backend.FromFloat32(p.B, do, dgated.DType(), dgated.Shape()...); err != nil {
		return T{}, T{}, wrap(a.Name+" output gate", err)
	}
	if dgate, err = backend.FromFloat32(p.B, dg, dgated.DType(), dgated.Shape()...); err != nil {
		_ = free(p.B, &dout)
		return T{}, T{}, wrap(a.Name+" output gate", err)
	}
	return dout, dgate, nil
}
