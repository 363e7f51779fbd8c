package nn

import (
	"hash/fnv"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// LoRA is a low-rank adapter on a frozen Linear, as PEFT's LoraLayer computes it:
//
//	y = base(x) + Scale * dropout(x) @ A^T @ B^T
//
// A [R,I] (PEFT's lora_A.weight), B [O,R] (lora_B.weight); GA, GB are their gradients
// (optional: nil when the adapter is only evaluated). Scale is lora_alpha/r, or
// lora_alpha/sqrt(r) with rsLoRA.
//
// Dropout (probability Dropout, applied to the adapter input only, never to the base path) is
// active only in passes with Pass.Train set. Its keep mask comes from the backend's Dropout op
// (backend.DropoutBits keyed by Seed mixed with the layer name, and Pass.DropoutKey): drawn on
// the device, never stored or uploaded, and the same for the same micro-batch in its forward,
// in a recomputed forward and in the backward, so dropout is deterministic and recomputation
// bit-identical. A backend without the op gets the same mask from the host (DropoutMask,
// uploaded and applied with ScaleRows).
//
// Nothing is cached: Backward recomputes h = dropout(x) @ A^T ([M,R], cheap since R is small)
// from the x that the caller keeps alive for the base backward anyway.
type LoRA struct {
	A, B    T
	GA, GB  T
	Scale   float32
	Dropout float32
	Seed    uint64
}

// dropout returns this layer's dropout in pass p (operands unset) and whether it is active.
func (a *LoRA) dropout(p *Pass, name string) (backend.DropoutArgs, bool) {
	if !p.Train || a.Dropout <= 0 {
		return backend.DropoutArgs{}, false
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return backend.DropoutArgs{P: a.Dropout, Seed: a.Seed ^ h.Sum64(), Key: p.DropoutKey}, true
}

// applyDropout writes out = dropout(x) (out may be x) with the backend's Dropout, or else
// through the host mask and ScaleRows, which give the same bits.
func applyDropout(b backend.Backend, d backend.DropoutArgs, out, x T) error {
	d.Out, d.X = out, x
	if f := b.Optional().Dropout; f != nil {
		return f(d)
	}
	raw, err := tensor.EncodeFloat32(tensor.F32, backend.DropoutMask(d.Seed, d.Key, x.Numel(), d.P))
	if err != nil {
		return err
	}
	mask, err := b.Empty(tensor.F32, x.Numel())
	if err != nil {
		return err
	}
	defer func() { _ = b.Free(mask) }()
	if err := b.Upload(mask, raw); err != nil {
		return err
	}
	if out.Buffer() != x.Buffer() || out.Offset() != x.Offset() {
		if err := b.Copy(out, x); err != nil {
			return err
		}
	}
	return scaleElems(b, out, mask)
}

// input returns the adapter input: x itself, or (training with dropout) a new dropped-out copy
// that the caller frees (owned).
func (a *LoRA) input(p *Pass, name string, x T) (xd T, owned bool, err error) {
	d, on := a.dropout(p, name)
	if !on {
		return x, false, nil
	}
	if xd, err = p.out(x.Shape()...); err != nil {
		return T{}, false, err
	}
	if err = applyDropout(p.B, d, xd, x); err != nil {
		_ = free(p.B, &xd)
		return T{}, false, err
	}
	return xd, true, nil
}

// scaleElems computes t *= mask elementwise: t viewed as [numel, 1] rows scaled by mask [numel].
func scaleElems(b backend.Backend, t, mask T) error {
	col, err := t.Reshape(t.Numel(), 1)
	if err != nil {
		return err
	}
	return b.ScaleRows(col, mask)
}

// forward adds the adapter's contribution to out [M,O] (+=).
func (a *LoRA) forward(p *Pass, name string, out, x T) error {
	xd, owned, err := a.input(p, name, x)
	if err != nil {
		return err
	}
	defer func() {
		if owned {
			_ = free(p.B, &xd)
		}
	}()
	h, err := p.out(x.Dim(0), a.A.Dim(0))
	if err != nil {
		return err
	}
	defer func() { _ = free(p.B, &h) }()
	if err := p.B.GEMM(backend.GEMMArgs{A: xd, B: a.A, C: h, TransB: true, Alpha: 1}); err != nil {
		return err
	}
	return p.B.GEMM(backend.GEMMArgs{A: h, B: a.B, C: out, TransB: true, Alpha: a.Scale, Beta: 1})
}

// backward accumulates GA and GB (+=) and adds the adapter's part of dx (+=; skipped when dx
// is the zero tensor), for the upstream gradient dy [M,O] and the forward input x [M,I].
//
//	h  = xd @ A^T          [M,R] (recomputed)
//	GB += Scale * dy^T @ h [O,R]
//	dh = Scale * dy @ B    [M,R]
//	GA += dh^T @ xd        [R,I]
//	dx += dropout(dh @ A)  [M,I] (the forward's mask and scale)
func (a *LoRA) backward(p *Pass, name string, dx, dy, x T) error {
	xd, owned, err := a.input(p, name, x)
	if err != nil {
		return err
	}
	var h, dh, dxa T
	defer func() {
		_ = free(p.B, &h, &dh, &dxa)
		if owned {
			_ = free(p.B, &xd)
		}
	}()
	m, r := x.Dim(0), a.A.Dim(0)
	if !a.GB.IsNil() {
		if h, err = p.out(m, r); err != nil {
			return err
		}
		if err = p.B.GEMM(backend.GEMMArgs{A: xd, B: a.A, C: h, TransB: true, Alpha: 1}); err != nil {
			return err
		}
		if err = p.B.GEMM(backend.GEMMArgs{A: dy, B: h, C: a.GB, TransA: true, Alpha: a.Scale, Beta: 1}); err != nil {
			return err
		}
	}
	if a.GA.IsNil() && dx.IsNil() {
		return nil
	}
	if dh, err = p.out(m, r); err != nil {
		return err
	}
	if err = p.B.GEMM(backend.GEMMArgs{A: dy, B: a.B, C: dh, Alpha: a.Scale}); err != nil {
		return err
	}
	if !a.GA.IsNil() {
		if err = p.B.GEMM(backend.GEMMArgs{A: dh, B: xd, C: a.GA, TransA: true, Alpha: 1, Beta: 1}); err != nil {
			return err
		}
	}
	if dx.IsNil() {
		return nil
	}
	d, on := a.dropout(p, name)
	if !on {
		return p.B.GEMM(backend.GEMMArgs{A: dh, B: a.A, C: dx, Alpha: 1, Beta: 1})
	}
	if dxa, err = p.out(dx.Shape()...); err != nil {
		return err
	}
	if err = p.B.GEMM(backend.GEMMArgs{A: dh, B: a.A, C: dxa, Alpha: 1}); err != nil {
		return err
	}
	if err = applyDropout(p.B, d, dxa, dxa); err != nil {
		return err
	}
	return p.B.Add(dx, dx, dxa)
}
