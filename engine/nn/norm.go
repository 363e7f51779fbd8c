package nn

import "github.com/halo-shell/halo-shell/engine/backend"

// RMSNorm is an HF LlamaRMSNorm over the last dimension: y = x * rstd * W. W [C]; GW [C]
// (optional). Used on [N,C] hidden states and, as q/k norm, on [N*H, HD] head rows.
type RMSNorm struct {
	Name string
	W    T
	GW   T
	Eps  float32
}

// Forward returns out (same shape as x, rows = x.Numel()/C) and rstd [rows] F32 for backward.
func (n *RMSNorm) Forward(p *Pass, x T) (out, rstd T, err error) {
	v, out, rstd, err := n.outputs(p, x)
	if err != nil {
		return T{}, T{}, err
	}
	if err := p.B.RMSNorm(v.out, rstd, v.x, n.W, n.Eps); err != nil {
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
	if fused == nil {
		if err := p.B.Add(residual, x, residual); err != nil {
			return T{}, T{}, wrap(n.Name+" residual", err)
		}
		return n.Forward(p, residual)
	}
	v, out, rstd, err := n.outputs(p, x)
	if err != nil {
		return T{}, T{}, err
	}
	res, err := residual.Reshape(v.x.Shape()...)
	if err == nil {
		err = fused(res, v.out, rstd, v.x, res, n.W, n.Eps)
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
	c := n.W.Dim(0)
	rows := x.Numel() / c
	v := func(t T) T { r, _ := t.Reshape(rows, c); return r }
	return wrap(n.Name, p.B.RMSNormBackward(backend.RMSNormBackwardArgs{
		DX: v(dx), DW: n.GW, DY: v(dy), X: v(x), W: n.W, RStd: rstd, AccumulateDX: accumulate,
	}))
}
