package nn

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// Block is one pre-norm decoder layer:
//
//	mid = x + Attn(Norm1(x))
//	y   = mid + FFN(Norm2(mid))
//
// With Recompute set, Forward keeps only its input x (which the caller keeps alive anyway) and
// Backward re-runs the forward of the layer before differentiating it: the same ops on the same
// inputs, so gradients are bit-identical to the stored-activation path while activation memory
// drops to one [N,C] tensor per layer.
//
// With Parallel set the layer is Cohere's (block_parallel.go): one norm feeds both branches,
// y = x + Attn(Norm1(x)) + FFN(Norm1(x)).
//
// Variants (block_variants.go) put RMSNorms on the outputs of the attention and feed-forward
// blocks (PostAttnNorm, PostFFNNorm: GLM-4's sandwich with the pre-norms kept, OLMo 2's with
// NoPreNorms), and scale both branches before their residual adds (ResidualScale: Granite):
//
//	mid = x + s * PostAttnNorm(Attn(Norm1(x)))
//	y   = mid + s * PostFFNNorm(FFN(Norm2(mid)))
type Block struct {
	Name      string
	Norm1     RMSNorm
	Attn      *Attention
	Norm2     RMSNorm
	FFN       FFN
	Recompute bool

	// Parallel: the attention and the feed-forward block both read Norm1(x) and both add to
	// the residual (block_parallel.go); Norm2 is unused.
	Parallel bool
	// NoPreNorms: Norm1 and Norm2 are not applied (the blocks see x and mid themselves).
	NoPreNorms bool
	// PostAttnNorm and PostFFNNorm, when set, normalise each branch's output.
	PostAttnNorm, PostFFNNorm *RMSNorm
	// ResidualScale multiplies each branch before its residual add; 0 means 1.
	ResidualScale float32
	// OutScale, when set, is a [1] tensor that multiplies the block's output y (Gemma 4's
	// layer_scalar, a checkpoint buffer: it gets no gradient). It is read once per Forward.
	OutScale T
	outScale float32
	// FFNOnResidual hands the FFN mid itself instead of Norm2(mid) (Norm2 unused): an FFN
	// that normalises its own inputs (MoEBesideMLP).
	FFNOnResidual bool
	// PerLayer, when set, runs after the feed-forward residual add and before OutScale
	// (Gemma 4's per-layer input embeddings).
	PerLayer *PerLayerInput

	x, h1, r1, mid, h2, r2 T
	v                      variantCache
	state                  blockState
}

type blockState uint8

const (
	blockIdle blockState = iota
	blockCached
	blockInputOnly // recompute: only x is kept
)

// Forward returns a new y [N,C] for x [N,C]. With train false nothing is cached. x must stay
// alive until Backward or Release.
func (b *Block) Forward(p *Pass, x T, train bool) (y T, err error) {
	if b.state != blockIdle {
		return T{}, fmt.Errorf("nn: %s: Forward called twice without Backward or Release", b.Name)
	}
	keep := train && !b.Recompute
	if y, err = b.forwardAll(p, x, keep); err != nil {
		return T{}, err
	}
	if !b.OutScale.IsNil() {
		s, err := backend.ToFloat32(p.B, b.OutScale)
		if err == nil && len(s) != 1 {
			err = fmt.Errorf("output scale %v must hold one value", b.OutScale)
		}
		if err == nil {
			b.outScale = s[0]
			err = p.B.Scale(y, s[0])
		}
		if err != nil {
			b.Release(p)
			_ = free(p.B, &y)
			return T{}, wrap(b.Name+" layer scalar", err)
		}
	}
	switch {
	case keep:
		b.state = blockCached
	case train:
		b.x, b.state = x, blockInputOnly
	}
	return y, nil
}

// forwardAll is forward followed by the per-layer input stage.
func (b *Block) forwardAll(p *Pass, x T, keep bool) (y T, err error) {
	if y, err = b.forward(p, x, keep); err != nil || b.PerLayer == nil {
		return y, err
	}
	if y, err = b.PerLayer.Forward(p, y, keep); err != nil {
		b.release(p)
		b.Attn.Release(p)
		b.FFN.Release(p)
	}
	return y, err
}

func (b *Block) forward(p *Pass, x T, keep bool) (y T, err error) {
	if b.Parallel {
		return b.forwardParallel(p, x, keep)
	}
	if b.variant() {
		return b.forwardVariant(p, x, keep)
	}
	b.x = x
	defer func() {
		if err != nil || !keep {
			b.release(p)
		}
	}()
	if b.h1, b.r1, err = b.Norm1.Forward(p, x); err != nil {
		return T{}, err
	}
	attn, err := b.Attn.Forward(p, b.h1, keep)
	if err != nil {
		return T{}, err
	}
	// mid = x + attn, computed in attn's buffer, with Norm2 in the same op where the backend
	// fuses them.
	b.mid = attn
	if b.h2, b.r2, err = b.Norm2.AddForward(p, x, b.mid); err != nil {
		return T{}, err
	}
	if y, err = b.FFN.Forward(p, b.h2, keep); err != nil {
		return T{}, err
	}
	if err = p.B.Add(y, b.mid, y); err != nil {
		_ = free(p.B, &y)
		return T{}, wrap(b.Name, err)
	}
	return y, nil
}

// Backward turns dy [N,C] (the gradient of the block output) into the gradient of its input,
// in place: the returned tensor is dy's buffer. Parameter gradients accumulate (+=).
func (b *Block) Backward(p *Pass, dy T) (T, error) {
	switch b.state {
	case blockIdle:
		return T{}, fmt.Errorf("nn: %s: Backward without a training Forward", b.Name)
	case blockInputOnly:
		b.state = blockIdle
		y, err := b.forwardAll(p, b.x, true)
		if err != nil {
			return T{}, fmt.Errorf("nn: %s: recompute: %w", b.Name, err)
		}
		_ = free(p.B, &y)
	}
	b.state = blockIdle
	defer b.release(p)
	if !b.OutScale.IsNil() {
		if err := p.B.Scale(dy, b.outScale); err != nil {
			return T{}, wrap(b.Name+" layer scalar", err)
		}
	}
	if b.PerLayer != nil {
		if err := b.PerLayer.Backward(p, dy); err != nil {
			return T{}, err
		}
	}
	if b.Parallel {
		return b.backwardParallel(p, dy)
	}
	if b.variant() {
		return b.backwardVariant(p, dy)
	}
	dh2, err := b.FFN.Backward(p, dy)
	if err != nil {
		return T{}, err
	}
	err = b.Norm2.Backward(p, dy, dh2, b.mid, b.r2, true)
	_ = free(p.B, &dh2)
	if err != nil {
		return T{}, err
	}
	dh1, err := b.Attn.Backward(p, dy)
	if err != nil {
		return T{}, err
	}
	err = b.Norm1.Backward(p, dy, dh1, b.x, b.r1, true)
	_ = free(p.B, &dh1)
	if err != nil {
		return T{}, err
	}
	return dy, nil
}

// Release drops whatever Forward cached, without a backward.
func (b *Block) Release(p *Pass) {
	if b.PerLayer != nil {
		b.PerLayer.Release(p)
	}
	b.Attn.Release(p)
	b.FFN.Release(p)
	b.release(p)
	b.state = blockIdle
}

func (b *Block) release(p *Pass) {
	_ = free(p.B, &b.h1, &b.r1, &b.mid, &b.h2, &b.r2)
	b.v.release(p)
	b.x = T{}
}
