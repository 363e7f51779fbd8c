package nn

import "fmt"

// The parallel decoder layer (Block.Parallel): one norm whose output feeds both the attention
// and the feed-forward block, and both branches added to the residual (Cohere's Command-R and
// Command-A layers, transformers' Cohere2DecoderLayer and Cohere2MoeDecoderLayer):
//
//	h = Norm1(x)
//	y = x + s * Attn(h) + s * FFN(h)
//
// s is ResidualScale (0 means 1); Norm2 is not used. Backward sums the two branches' input
// gradients before the one norm backward:
//
//	dh = Attn'(s * dy) + FFN'(s * dy)
//	dx = dy + Norm1'(dh)
//
// Cached for backward (keep): x (not owned), h and its rstd; the attention and the
// feed-forward block cache their own activations, both over h. Only the ops every backend has
// are used (Add, Scale, Copy), so the layer runs wherever its branches do.

// parallelCheck refuses the variants that do not combine with the parallel layer: norms on the
// branch outputs, no pre-norm, and a feed-forward block on the raw residual describe the
// sequential layer.
func (b *Block) parallelCheck() error {
	if b.NoPreNorms || b.FFNOnResidual || b.PostAttnNorm != nil || b.PostFFNNorm != nil {
		return fmt.Errorf("nn: %s: a parallel layer has one pre-norm shared by both branches; NoPreNorms, FFNOnResidual and branch-output norms do not apply to it", b.Name)
	}
	return nil
}

// forwardParallel is forward for the parallel layer: y is a new [N,C] tensor.
func (b *Block) forwardParallel(p *Pass, x T, keep bool) (y T, err error) {
	if err = b.parallelCheck(); err != nil {
		return T{}, err
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
	if attn, err = b.branchOut(p, attn, nil, nil, nil); err != nil {
		b.Attn.Release(p)
		return T{}, err
	}
	f, err := b.FFN.Forward(p, b.h1, keep)
	if err == nil {
		if f, err = b.branchOut(p, f, nil, nil, nil); err != nil {
			b.FFN.Release(p)
		}
	}
	if err != nil {
		_ = free(p.B, &attn)
		b.Attn.Release(p)
		return T{}, err
	}
	// y = (f + attn) + x in f's buffer.
	err = p.B.Add(f, f, attn)
	_ = free(p.B, &attn)
	if err == nil {
		err = p.B.Add(f, f, x)
	}
	if err != nil {
		_ = free(p.B, &f)
		b.Attn.Release(p)
		b.FFN.Release(p)
		return T{}, wrap(b.Name+" residual", err)
	}
	return f, nil
}

// backwardParallel is Backward for the parallel layer: dy becomes the input gradient in place.
func (b *Block) backwardParallel(p *Pass, dy T) (T, error) {
	g, owned, err := b.branchGrad(p, dy, nil, T{}, T{})
	if err != nil {
		return T{}, err
	}
	release := func() {
		if owned {
			_ = free(p.B, &g)
		}
	}
	dh, err := b.FFN.Backward(p, g)
	if err != nil {
		release()
		b.Attn.Release(p)
		return T{}, err
	}
	dha, err := b.Attn.Backward(p, g)
	release()
	if err == nil {
		err = wrap(b.Name+" branch gradients", p.B.Add(dh, dh, dha))
		_ = free(p.B, &dha)
	}
	if err == nil {
		err = b.Norm1.Backward(p, dy, dh, b.x, b.r1, true)
	}
	_ = free(p.B, &dh)
	if err != nil {
		return T{}, err
	}
	return dy, nil
}
