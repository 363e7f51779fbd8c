package nn

// The decoder-layer variants of Block: norms on the branch outputs and residual scaling.
//
// Cached for backward (keep): x (not owned), the pre-norm outputs h1, h2 and their rstd (when
// the pre-norms apply), each branch's raw output a, f and the rstd of its post-norm (when it
// has one), and mid. The branch outputs after post-norm and scaling are folded into mid and y
// and not kept.

// variantCache holds what the variants add to Block's cache.
type variantCache struct {
	a, ra, f, rf T
}

func (v *variantCache) release(p *Pass) { _ = free(p.B, &v.a, &v.ra, &v.f, &v.rf) }

// variant reports whether the block departs from the plain pre-norm layer.
func (b *Block) variant() bool {
	return b.NoPreNorms || b.FFNOnResidual || b.PostAttnNorm != nil || b.PostFFNNorm != nil ||
		(b.ResidualScale != 0 && b.ResidualScale != 1)
}

func (b *Block) scaled() bool { return b.ResidualScale != 0 && b.ResidualScale != 1 }

// branchOut turns a branch's raw output out into what is added to the residual: post-normed
// (out kept in *raw with its rstd in *rs) and scaled. It returns the tensor to add, owned by
// the caller.
func (b *Block) branchOut(p *Pass, out T, post *RMSNorm, raw, rs *T) (T, error) {
	if post != nil {
		n, r, err := post.Forward(p, out)
		if err != nil {
			_ = free(p.B, &out)
			return T{}, err
		}
		*raw, *rs = out, r
		out = n
	}
	if b.scaled() {
		if err := p.B.Scale(out, b.ResidualScale); err != nil {
			_ = free(p.B, &out)
			return T{}, wrap(b.Name, err)
		}
	}
	return out, nil
}

func (b *Block) forwardVariant(p *Pass, x T, keep bool) (y T, err error) {
	b.x = x
	defer func() {
		if err != nil || !keep {
			b.release(p)
		}
	}()
	in := x
	if !b.NoPreNorms {
		if b.h1, b.r1, err = b.Norm1.Forward(p, x); err != nil {
			return T{}, err
		}
		in = b.h1
	}
	attn, err := b.Attn.Forward(p, in, keep)
	if err != nil {
		return T{}, err
	}
	if b.mid, err = b.branchOut(p, attn, b.PostAttnNorm, &b.v.a, &b.v.ra); err != nil {
		return T{}, err
	}
	if err = p.B.Add(b.mid, x, b.mid); err != nil {
		return T{}, wrap(b.Name+" residual", err)
	}
	in = b.mid
	if !b.NoPreNorms && !b.FFNOnResidual {
		if b.h2, b.r2, err = b.Norm2.Forward(p, b.mid); err != nil {
			return T{}, err
		}
		in = b.h2
	}
	f, err := b.FFN.Forward(p, in, keep)
	if err != nil {
		return T{}, err
	}
	if y, err = b.branchOut(p, f, b.PostFFNNorm, &b.v.f, &b.v.rf); err != nil {
		return T{}, err
	}
	if err = p.B.Add(y, b.mid, y); err != nil {
		_ = free(p.B, &y)
		return T{}, wrap(b.Name+" residual", err)
	}
	return y, nil
}

// branchGrad returns the gradient of a branch's raw output from dy, the gradient of the
// residual sum it was added to: scaled and taken through the post-norm. The result is owned by
// the caller, or is dy itself (owned reports which).
func (b *Block) branchGrad(p *Pass, dy T, post *RMSNorm, raw, rs T) (g T, owned bool, err error) {
	g = dy
	if b.scaled() {
		if g, err = p.out(dy.Shape()...); err != nil {
			return T{}, false, wrap(b.Name, err)
		}
		owned = true
		if err = p.B.Copy(g, dy); err == nil {
			err = p.B.Scale(g, b.ResidualScale)
		}
		if err != nil {
			_ = free(p.B, &g)
			return T{}, false, wrap(b.Name, err)
		}
	}
	if post == nil {
		return g, owned, nil
	}
	d, err := p.out(raw.Shape()...)
	if err == nil {
		err = post.Backward(p, d, g, raw, rs, false)
	}
	if owned {
		_ = free(p.B, &g)
	}
	if err != nil {
		_ = free(p.B, &d)
		return T{}, false, err
	}
	return d, true, nil
}

// backwardVariant is Backward for the variants: dy becomes the input gradient in place.
func (b *Block) backwardVariant(p *Pass, dy T) (T, error) {
	g, owned, err := b.branchGrad(p, dy, b.PostFFNNorm, b.v.f, b.v.rf)
	if err != nil {
		return T{}, err
	}
	dh2, err := b.FFN.Backward(p, g)
	if owned {
		_ = free(p.B, &g)
	}
	if err != nil {
		return T{}, err
	}
	if b.NoPreNorms || b.FFNOnResidual {
		err = wrap(b.Name, p.B.Add(dy, dy, dh2))
	} else {
		err = b.Norm2.Backward(p, dy, dh2, b.mid, b.r2, true)
	}
	_ = free(p.B, &dh2)
	if err != nil {
		return T{}, err
	}
	if g, owned, err = b.branchGrad(p, dy, b.PostAttnNorm, b.v.a, b.v.ra); err != nil {
		return T{}, err
	}
	dh1, err := b.Attn.Backward(p, g)
	if owned {
		_ = free(p.B, &g)
	}
	if err != nil {
		return T{}, err
	}
	if b.NoPreNorms {
		err = wrap(b.Name, p.B.Add(dy, dy, dh1))
	} else {
		err = b.Norm1.Backward(p, dy, dh1, b.x, b.r1, true)
	}
	_ = free(p.B, &dh1)
	if err != nil {
		return T{}, err
	}
	return dy, nil
}
