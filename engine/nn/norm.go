package nn

import (
	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// RMSNorm is an HF LlamaRMSNorm over the last dimension: y = x * rstd * W. W [C]; GW [C]
// (optional). Used on [N,C] hidden states and, as q/k norm, on [N*H, HD] head rows.
//
// With Offset set the gain is Offset + W (Gemma's RMSNorm multiplies by 1 + w, its weights
// starting at zero): each call builds the gain once in F32 ([C], freed before it returns), so
// the backend ops see an ordinary weight; dW is unchanged, since d(Offset + W)/dW = 1.
//
// With Center set it is a LayerNorm with an affine weight and, when B is set, a bias (Phi-3.5-
// MoE's nn.LayerNorm): y = (x - mean(x)) * rstd * W + B, rstd = 1/sqrt(var(x) + eps), which is
// the RMSNorm of the centred row plus B (layernorm.go).
type RMSNorm struct {
	Name   string
	W      T
	GW     T
	Eps    float32
	Offset float32
	// Center subtracts each row's mean before the norm (LayerNorm); B [C] and GB [C] are the
	// optional bias and its gradient, added after the gain.
	Center bool
	B, GB  T
}

// gain returns the weight the backend ops multiply by: W, or Offset + W in a new F32 tensor
// that done frees.
func (n *RMSNorm) gain(p *Pass) (w T, done func(), err error) {
	if n.Offset == 0 {
		return n.W, func() {}, nil
	}
	if w, err = p.B.Empty(tensor.F32, n.W.Shape()...); err != nil {
		return T{}, nil, wrap(n.Name, err)
	}
	done = func() { _ = p.B.Free(w) }
	if err = p.B.Fill(w, n.Offset); err == nil {
		err = p.B.Axpy(w, 1, n.W)
	}
	if err != nil {
		done()
		return T{}, nil, wrap(n.Name+" gain", err)
	}
	return w, done, nil
}

// Forward returns out (same shape as x, rows = x.Numel()/C) and rstd [rows] F32 for backward.
func (n *RMSNorm) Forward(p *Pass, x T) (out, rstd T, err error) {
	if n.Center || !n.B.IsNil() {
		return n.layerNormForward(p, x)
	}
	v, out, rstd, err := n.outputs(p, x)
	if err != nil {
		return T{}, T{}, err
	}
	w, done, err := n.gain(p)
	if err != nil {
		_ = free(p.B, &out, &rstd)
		return T{}, T{}, err
	}
	defer done()
	if err := p.B.RMSNorm(v.out, rstd, v.x, w, n.Eps); err != nil {
		_ = free(p.B, &out, &rstd)
		return T{}, T{}, wrap(n.Name, err)
	}
	return out, rstd, nil
}

// AddForward is the residual add followed by Forward: residual = x + residual, in place, and
// out, rstd of RMSNorm(residual). On a backend with the optional AddRMSNorm it is one fused op;
// elsewhere Add and Forward (the same values).
func (n *RMSNorm) AddForward(p *Pass, x, residual T) (out, rstd T, err error) {
	fused := p.B.Optional().AddRMSNorm
	if fused == nil || n.Center || !n.B.IsNil() {
		if err := p.B.Add(residual, x, residual); err != nil {
			return T{}, T{}, wrap(n.Name+" residual", err)
		}
		return n.Forward(p, residual)
	}
	v, out, rstd, err := n.outputs(p, x)
	if err != nil {
		return T{}, T{}, err
	}
	w, done, err := n.gain(p)
	if err != nil {
		_ = free(p.B, &out, &rstd)
		return T{}, T{}, err
	}
	defer done()
	res, err := residual.Reshape(v.x.Shape()...)
	if err == nil {
		err = fused(res, v.out, rstd, v.x, res, w, n.Eps)
	}
	if err != nil {
		_ = free(p.B, &out, &rstd)
		return T{}, T{}, wrap(n.Name, err)
	}
	return out, rstd, nil
}

// normViews are x and out seen as [rows, C].
type normViews struct{ x, out T }

// outputs allocates Forward's out (x's shape) and rstd [rows] and returns them with the [rows, C]
// views of x and out.
func (n *RMSNorm) outputs(p *Pass, x T) (v normViews, out, rstd T, err error) {
	c := n.W.Dim(0)
	rows := x.Numel() / c
	if v.x, err = x.Reshape(rows, c); err != nil {
		return v, T{}, T{}, wrap(n.Name, err)
	}
	if out, err = p.out(x.Shape()...); err != nil {
		return v, T{}, T{}, wrap(n.Name, err)
	}
	if rstd, err = p.outF32(rows); err != nil {
		_ = free(p.B, &out)
		return v, T{}, T{}, wrap(n.Name, err)
	}
	v.out, _ = out.Reshape(rows, c)
	return v, out, rstd, nil
}

// Backward: dx (= or += with accumulate) from dy, the forward input x and rstd; GW +=.
// dx may not alias dy.
func (n *RMSNorm) Backward(p *Pass, dx, dy, x, rstd T, accumulate bool) error {
	if n.Center || !n.B.IsNil() {
		return n.layerNormBackward(p, dx, dy, x, rstd, accumulate)
	}
	c := n.W.Dim(0)
	rows := x.Numel() / c
	v := func(t T) T { r, _ := t.Reshape(rows, c); return r }
	w, done, err := n.gain(p)
	if err != nil {
		return err
	}
	defer done()
	return wrap(n.Name, p.B.RMSNormBackward(backend.RMSNormBackwardArgs{
		DX: v(dx), DW: n.GW, DY: v(dy), X: v(x), W: w, RStd: rstd, AccumulateDX: accumulate,
	}))
}
