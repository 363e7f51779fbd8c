package nn

// Linear is an HF nn.Linear: y = x @ W^T + b, plus an optional LoRA adapter. W [O,I], B [O]
// (optional); GW, GB are the gradient views (optional: nil gradients mean the weight is
// frozen, as the base of a LoRA model always is).
//
// The base weight is read only through Weight, the seam for a base stored in another form:
// a layer with Quant set (a QLoRA base in NF4, W unset) dequantises it into the pass's
// WeightScratch, the buffer shared by the layers of a model; everything else in the layer
// works on the tensor Weight returns.
type Linear struct {
	Name    string // HF prefix, e.g. "model.layers.0.self_attn.q_proj"
	W, B    T
	GW, GB  T
	Adapter *LoRA        // optional low-rank adapter (nil: none)
	Quant   *QuantWeight // optional 4-bit base (frozen: GW must be unset)
}

// Weight returns the base weight [O,I] to multiply with in this pass, in the activation dtype.
// The tensor is valid until the next call of Weight on any layer of the pass and is not to be
// freed by the caller.
func (l *Linear) Weight(p *Pass) (T, error) {
	if l.Quant != nil {
		return l.quantWeight(p)
	}
	return l.W, nil
}

// Shape is the base weight's [O, I], whether it is stored in W or quantised.
func (l *Linear) Shape() (o, i int) {
	if l.Quant != nil {
		return l.Quant.O, l.Quant.I
	}
	return l.W.Dim(0), l.W.Dim(1)
}

// adapted reports whether the adapter runs in this pass.
func (l *Linear) adapted(p *Pass) bool { return l.Adapter != nil && !p.NoAdapters }

// Forward returns a new out [M,O] = x [M,I] @ W^T + B (+ the adapter's term). Nothing is
// cached: backward re-reads x.
func (l *Linear) Forward(p *Pass, x T) (T, error) {
	w, err := l.Weight(p)
	if err != nil {
		return T{}, wrap(l.Name, err)
	}
	out, err := p.out(x.Dim(0), w.Dim(0))
	if err != nil {
		return T{}, wrap(l.Name, err)
	}
	err = p.B.Linear(out, x, w, l.B)
	if err == nil && l.adapted(p) {
		err = l.Adapter.forward(p, l.Name, out, x)
	}
	if err != nil {
		_ = free(p.B, &out)
		return T{}, wrap(l.Name, err)
	}
	return out, nil
}

// Backward: dx (= or += with accumulate; skipped when dx is the zero tensor) = dy @ W (+ the
// adapter's term); GW += dy^T @ x; GB += sum(dy); the adapter's gradients +=.
func (l *Linear) Backward(p *Pass, dx, dy, x T, accumulate bool) error {
	w, err := l.Weight(p)
	if err != nil {
		return wrap(l.Name, err)
	}
	if err := p.B.LinearBackward(backendLinearArgs(dx, l.GW, l.GB, dy, x, w, accumulate)); err != nil {
		return wrap(l.Name, err)
	}
	if l.adapted(p) {
		return wrap(l.Name+" lora", l.Adapter.backward(p, l.Name, dx, dy, x))
	}
	return nil
}
