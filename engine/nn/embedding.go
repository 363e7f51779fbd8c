package nn

// Embedding is an HF nn.Embedding: out[n] = W[ids[n]]. W [V,C]; GW [V,C] (optional).
type Embedding struct {
	Name string
	W    T
	GW   T
}

// Forward returns a new [N,C] gather of ids [N] I32.
func (e *Embedding) Forward(p *Pass, ids T) (T, error) {
	out, err := p.out(ids.Numel(), e.W.Dim(1))
	if err != nil {
		return T{}, wrap(e.Name, err)
	}
	if err := p.B.Embedding(out, e.W, ids); err != nil {
		_ = free(p.B, &out)
		return T{}, wrap(e.Name, err)
	}
	return out, nil
}

// Backward scatter-adds dy [N,C] into GW (+=). A nil GW (frozen) is a no-op.
func (e *Embedding) Backward(p *Pass, dy, ids T) error {
	if e.GW.IsNil() {
		return nil
	}
	return wrap(e.Name, p.B.EmbeddingBackward(e.GW, dy, ids))
}
