package nn

// Linear is an HF nn.Linear: y = x @ W^T + b. W [O,I], B [O] (optional); GW, GB are the
// gradient views (optional: nil gradients mean the weight is frozen).
type Linear struct {
	Name   string // HF prefix, e.g. "model.layers.0.self_attn.q_proj"
	W, B   T
	GW, GB T
}

// Forward returns a new out [M,O] = x [M,I] @ W^T + B. Nothing is cached: backward re-reads x.
func (l *Linear) Forward(p *Pass, x T) (T, error) {
	out, err := p.out(x.Dim(0), l.W.Dim(0))
	if err != nil {
		return T{}, wrap(l.Name, err)
	}
	if err := p.B.Linear(out, x, l.W, l.B); err != nil {
		_ = free(p.B, &out)
		return T{}, wrap(l.Name, err)
	}
	return out, nil
}

// Backward: dx (= or += with accumulate; skipped when dx is the zero tensor) = dy @ W;
// GW += dy^T @ x; GB += sum(dy).
func (l *Linear) Backward(p *Pass, dx, dy, x T, accumulate bool) error {
	return wrap(l.Name, p.B.LinearBackward(backendLinearArgs(dx, l.GW, l.GB, dy, x, l.W, accumulate)))
}
