package nn

// Embedding is an HF nn.Embedding: out[n] = W[ids[n]], times Scale when set (granite's
// embedding_multiplier). W [V,C]; GW [V,C] (optional).
type Embedding struct {
	Name  string
	W     T
	GW    T
	Scale float32 // 0 means 1
}

// Forward returns a new [N,C] gather of ids [N] I32.
func (e *Embedding) Forward(p *Pass, ids T) (T, error) {
	out, err := p.out(ids.Numel(), e.W.Dim(1))
	if err != nil {
		return T{}, wrap(e.Name, err)
	}
	err = p.B.Embedding(out, e.W, ids)
	if err == nil && e.Scale != 0 && e.Scale != 1 {
		err = p.B.Scale(out, e.Scale)
	}
	if err != nil {
		_ = free(p.B, &out)
		return T{}, wrap(e.Name, err)
	}
	return out, nil
}

// Backward scatter-adds dy [N,C] (times Scale) into GW (+=); with a Scale, dy is scaled in
// place. A nil GW (frozen) is a no-op.
func (e *Embedding) Backward(p *Pass, dy, ids T) error {
	if e.GW.IsNil() {
		return nil
	}
	if e.Scale != 0 && e.Scale != 1 {
		if err := p.B.Scale(dy, e.Scale); err != nil {
			return wrap(e.Name, err)
		}
	}
	return wrap(e.Name, p.B.EmbeddingBackward(e.GW, dy, ids))
}
