package nn

import "fmt"

// FFN is the feed-forward half of a decoder block: the dense SwiGLU MLP here, a mixture of
// experts in MoE families. x is the normed hidden state [N,C]; the caller keeps it alive until
// Backward or Release.
type FFN interface {
	// Forward returns a new out [N,C]; keep caches activations for Backward.
	Forward(p *Pass, x T, keep bool) (T, error)
	// Backward returns a new dx [N,C] (=), accumulates parameter gradients (+=) and releases
	// the cache.
	Backward(p *Pass, dy T) (T, error)
	// Release frees the cache without a backward.
	Release(p *Pass)
}

// Activation is the gate of a gated MLP.
type Activation uint8

const (
	// SiLU gates with silu (SwiGLU: Llama, Qwen, Mistral, ...).
	SiLU Activation = iota
	// GELUTanh gates with the tanh approximation of GELU (GeGLU: Gemma's gelu_pytorch_tanh).
	GELUTanh
)

// MLP is the gated feed-forward of Llama-style decoders: down(act(gate(x)) * up(x)), SwiGLU
// (act = silu, the zero value) or GeGLU (Act GELUTanh).
// Cached for backward: x (not owned), gate [N,F], up [N,F] and their product [N,F].
type MLP struct {
	Name           string
	Gate, Up, Down Linear
	Act            Activation

	x, g, u, a T
	live       bool
}

var _ FFN = (*MLP)(nil)

// Forward implements FFN.
func (m *MLP) Forward(p *Pass, x T, keep bool) (y T, err error) {
	if m.live {
		return T{}, fmt.Errorf("nn: %s: Forward called twice without Backward or Release", m.Name)
	}
	m.x, m.live = x, true
	defer func() {
		if err != nil || !keep {
			m.Release(p)
		}
	}()
	if m.g, err = m.Gate.Forward(p, x); err != nil {
		return T{}, err
	}
	if m.u, err = m.Up.Forward(p, x); err != nil {
		return T{}, err
	}
	if m.a, err = p.out(m.g.Shape()...); err != nil {
		return T{}, wrap(m.Name, err)
	}
	if m.Act == GELUTanh {
		err = p.B.GeGLU(m.a, m.g, m.u)
	} else {
		err = p.B.SwiGLU(m.a, m.g, m.u)
	}
	if err != nil {
		return T{}, wrap(m.Name, err)
	}
	return m.Down.Forward(p, m.a)
}

// Backward implements FFN.
func (m *MLP) Backward(p *Pass, dy T) (dx T, err error) {
	if !m.live {
		return T{}, fmt.Errorf("nn: %s: Backward without a cached Forward", m.Name)
	}
	defer m.Release(p)
	da, err := p.out(m.a.Shape()...)
	if err != nil {
		return T{}, wrap(m.Name, err)
	}
	defer func() { _ = free(p.B, &da) }()
	if err = m.Down.Backward(p, da, dy, m.a, false); err != nil {
		return T{}, err
	}
	// dGate and dUp overwrite the cached gate and up (allowed by the op contract).
	if m.Act == GELUTanh {
		err = p.B.GeGLUBackward(m.g, m.u, da, m.g, m.u)
	} else {
		err = p.B.SwiGLUBackward(m.g, m.u, da, m.g, m.u)
	}
	if err != nil {
		return T{}, wrap(m.Name, err)
	}
	if dx, err = p.out(m.x.Shape()...); err != nil {
		return T{}, wrap(m.Name, err)
	}
	if err = m.Gate.Backward(p, dx, m.g, m.x, false); err == nil {
		err = m.Up.Backward(p, dx, m.u, m.x, true)
	}
	if err != nil {
		_ = free(p.B, &dx)
		return T{}, err
	}
	return dx, nil
}

// Release implements FFN.
func (m *MLP) Release(p *Pass) {
	_ = free(p.B, &m.g, &m.u, &m.a)
	m.x, m.live = T{}, false
}
