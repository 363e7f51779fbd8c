package nn

import (
	"hash/fnv"
	"math/rand/v2"

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
// active only in passes with Pass.Train set. Its keep mask is drawn on the host from a stream
// keyed by (Seed, Pass.DropoutKey, layer name), so the same micro-batch draws the same mask in
// its forward, in a recomputed forward and in the backward: dropout is deterministic, and
// recomputation stays bit-identical. The mask is uploaded as [M*I] F32 scales (0 or 1/(1-p))
// and applied with ScaleRows over x viewed as [M*I, 1]; it lives only for the op that uses it.
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

// input returns the adapter input: x itself, or (training with dropout) a new masked copy and
// the mask, which the caller frees.
func (a *LoRA) input(p *Pass, name string, x T) (xd, mask T, err error) {
	if !p.Train || a.Dropout <= 0 {
		return x, T{}, nil
	}
	mask, err = a.mask(p, name, x.Numel())
	if err != nil {
		return T{}, T{}, err
	}
	if xd, err = p.out(x.Shape()...); err == nil {
		if err = p.B.Copy(xd, x); err == nil {
			err = scaleElems(p.B, xd, mask)
		}
	}
	if err != nil {
		_ = free(p.B, &xd, &mask)
		return T{}, T{}, err
	}
	return xd, mask, nil
}

// mask draws the keep mask of this layer and pass: n F32 values, 0 with probability Dropout,
// else 1/(1-Dropout) (inverted dropout, as torch.nn.Dropout).
func (a *LoRA) mask(p *Pass, name string, n int) (T, error) {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	rng := rand.New(rand.NewPCG(a.Seed^h.Sum64(), p.DropoutKey))
	keep := 1 / (1 - a.Dropout)
	vals := make([]float32, n)
	for i := range vals {
		if rng.Float32() >= a.Dropout {
			vals[i] = keep
		}
	}
	raw, err := tensor.EncodeFloat32(tensor.F32, vals)
	if err != nil {
		return T{}, err
	}
	m, err := p.B.Empty(tensor.F32, n)
	if err != nil {
		return T{}, err
	}
	if err := p.B.Upload(m, raw); err != nil {
		_ = p.B.Free(m)
		return T{}, err
	}
	return m, nil
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
	xd, mask, err := a.input(p, name, x)
	if err != nil {
		return err
	}
	defer func() {
		if !mask.IsNil() {
			_ = free(p.B, &xd, &mask)
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
//	dx += mask * (dh @ A)  [M,I]
func (a *LoRA) backward(p *Pass, name string, dx, dy, x T) error {
	xd, mask, err := a.input(p, name, x)
	if err != nil {
		return err
	}
	var h, dh, dxa T
	defer func() {
		_ = free(p.B, &h, &dh, &dxa)
		if !mask.IsNil() {
			_ = free(p.B, &xd, &mask)
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
	if mask.IsNil() {
		return p.B.GEMM(backend.GEMMArgs{A: dh, B: a.A, C: dx, Alpha: 1, Beta: 1})
	}
	if dxa, err = p.out(dx.Shape()...); err != nil {
		return err
	}
	if err = p.B.GEMM(backend.GEMMArgs{A: dh, B: a.A, C: dxa, Alpha: 1}); err != nil {
		return err
	}
	if err = scaleElems(p.B, dxa, mask); err != nil {
		return err
	}
	return p.B.Add(dx, dx, dxa)
}
