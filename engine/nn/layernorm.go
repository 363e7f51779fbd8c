package nn

import (
	"github.com/halo-shell/halo-shell/engine/backend"
)

// LayerNorm is RMSNorm with Center and B (norm.go), composed of the backend's ops: the centred
// row c = x - mean(x) is a rank-one update of x (its row sums from a Linear against a row of
// ones), the norm is RMSNorm(c) with the gain, and the bias a rank-one GEMM update of the
// output. Centring is linear and symmetric, so the backward centres the RMSNorm backward's
// input gradient the same way; the bias gradient is the column sum of dy.

// ones returns an [r, c] tensor of ones of the pass dtype.
func (n *RMSNorm) ones(p *Pass, r, c int) (T, error) {
	t, err := p.out(r, c)
	if err != nil {
		return T{}, wrap(n.Name, err)
	}
	if err = p.B.Fill(t, 1); err != nil {
		_ = free(p.B, &t)
		return T{}, wrap(n.Name, err)
	}
	return t, nil
}

// center returns x - mean(x) row by row for x [rows, C], in a new tensor of the pass dtype.
func (n *RMSNorm) center(p *Pass, x T) (xc T, err error) {
	rows, c := x.Dim(0), x.Dim(1)
	var ones, sums T
	defer func() { _ = free(p.B, &ones, &sums) }()
	if ones, err = n.ones(p, 1, c); err != nil {
		return T{}, err
	}
	if sums, err = p.out(rows, 1); err != nil {
		return T{}, wrap(n.Name, err)
	}
	if err = p.B.Linear(sums, x, ones, T{}); err != nil {
		return T{}, wrap(n.Name+" row sums", err)
	}
	if xc, err = p.out(rows, c); err != nil {
		return T{}, wrap(n.Name, err)
	}
	if err = p.B.Copy(xc, x); err == nil {
		err = p.B.GEMM(backend.GEMMArgs{A: sums, B: ones, C: xc, Alpha: -1 / float32(c), Beta: 1})
	}
	if err != nil {
		_ = free(p.B, &xc)
		return T{}, wrap(n.Name+" centre", err)
	}
	return xc, nil
}

func (n *RMSNorm) layerNormForward(p *Pass, x T) (out, rstd T, err error) {
	v, out, rstd, err := n.outputs(p, x)
	if err != nil {
		return T{}, T{}, err
	}
	var xc, ones T
	defer func() {
		_ = free(p.B, &xc, &ones)
		if err != nil {
			_ = free(p.B, &out, &rstd)
		}
	}()
	src := v.x
	if n.Center {
		if xc, err = n.center(p, v.x); err != nil {
			return T{}, T{}, err
		}
		src = xc
	}
	w, done, err := n.gain(p)
	if err != nil {
		return T{}, T{}, err
	}
	defer done()
	if err = p.B.RMSNorm(v.out, rstd, src, w, n.Eps); err != nil {
		return T{}, T{}, wrap(n.Name, err)
	}
	if n.B.IsNil() {
		return out, rstd, nil
	}
	if ones, err = n.ones(p, v.x.Dim(0), 1); err != nil {
		return T{}, T{}, err
	}
	b, err := n.B.Reshape(1, n.B.Numel())
	if err == nil {
		err = p.B.GEMM(backend.GEMMArgs{A: ones, B: b, C: v.out, Alpha: 1, Beta: 1})
	}
	if err != nil {
		return T{}, T{}, wrap(n.Name+" bias", err)
	}
	return out, rstd, nil
}

func (n *RMSNorm) layerNormBackward(p *Pass, dx, dy, x, rstd T, accumulate bool) (err error) {
	c := n.W.Dim(0)
	rows := x.Numel() / c
	v := func(t T) T { r, _ := t.Reshape(rows, c); return r }
	var xc, dxc, dxcc, ones T
	defer func() { _ = free(p.B, &xc, &dxc, &dxcc, &ones) }()
	if !n.B.IsNil() && !n.GB.IsNil() {
		if ones, err = n.ones(p, rows, 1); err != nil {
			return err
		}
		gb, err := n.GB.Reshape(1, c)
		if err == nil {
			err = p.B.GEMM(backend.GEMMArgs{A: ones, B: v(dy), C: gb, TransA: true, Alpha: 1, Beta: 1})
		}
		if err != nil {
			return wrap(n.Name+" bias gradient", err)
		}
	}
	w, done, err := n.gain(p)
	if err != nil {
		return err
	}
	defer done()
	if !n.Center {
		return wrap(n.Name, p.B.RMSNormBackward(backend.RMSNormBackwardArgs{
			DX: v(dx), DW: n.GW, DY: v(dy), X: v(x), W: w, RStd: rstd, AccumulateDX: accumulate,
		}))
	}
	if xc, err = n.center(p, v(x)); err != nil {
		return err
	}
	if dxc, err = p.out(rows, c); err != nil {
		return wrap(n.Name, err)
	}
	if err = p.B.RMSNormBackward(backend.RMSNormBackwardArgs{DX: dxc, DW: n.GW, DY: v(dy), X: xc, W: w, RStd: rstd}); err != nil {
		return wrap(n.Name, err)
	}
	if dxcc, err = n.center(p, dxc); err != nil {
		return err
	}
	if accumulate {
		return wrap(n.Name, p.B.Axpy(v(dx), 1, dxcc))
	}
	return wrap(n.Name, p.B.Copy(v(dx), dxcc))
}
