package cpu

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// rowChunk is the number of rows per parallel chunk in row-wise ops.
const rowChunk = 16

func (b *Backend) rmsnormShapes(op string, out, rstd, x, w T) (n, c int, err error) {
	if w.IsNil() || x.IsNil() {
		return 0, 0, fmt.Errorf("cpu: %s: x and w are required", op)
	}
	c = w.Numel()
	if x.Shape().Last() != c {
		return 0, 0, fmt.Errorf("cpu: %s: x %v: last dimension must equal numel(w) = %d", op, x, c)
	}
	n = x.Shape().Rows()
	if err := numel(op, "out", out, n*c, "numel(x)"); err != nil {
		return 0, 0, err
	}
	if err := numel(op, "rstd", rstd, n, "rows(x)"); err != nil {
		return 0, 0, err
	}
	return n, c, nil
}

// RMSNorm computes out = x * rstd * w with rstd = 1/sqrt(mean(x^2) + eps) per row.
func (b *Backend) RMSNorm(out, rstd, x, w T, eps float32) error {
	const op = "rmsnorm"
	n, c, err := b.rmsnormShapes(op, out, rstd, x, w)
	if err != nil {
		return err
	}
	xs, err := b.in(op, "x", x)
	if err != nil {
		return err
	}
	ws, err := b.in(op, "w", w)
	if err != nil {
		return err
	}
	rs, err := f32only(op, "rstd", rstd)
	if err != nil {
		return err
	}
	os, flush, err := b.out(op, "out", out, false)
	if err != nil {
		return err
	}
	b.pool.rows(n, rowChunk, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			rmsRow(os[i*c:(i+1)*c], &rs[i], xs[i*c:(i+1)*c], ws, eps)
		}
	})
	flush()
	return nil
}

func rmsRow(out []float32, rstd *float32, x, w []float32, eps float32) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	r := float32(1 / math.Sqrt(ss/float64(len(x))+float64(eps)))
	*rstd = r
	for j, v := range x {
		out[j] = v * r * w[j]
	}
}

// AddRMSNorm computes residualOut = x + residual, then RMSNorm of it.
func (b *Backend) AddRMSNorm(residualOut, out, rstd, x, residual, w T, eps float32) error {
	const op = "add-rmsnorm"
	n, c, err := b.rmsnormShapes(op, out, rstd, x, w)
	if err != nil {
		return err
	}
	if err := numel(op, "residual", residual, n*c, "numel(x)"); err != nil {
		return err
	}
	if err := numel(op, "residualOut", residualOut, n*c, "numel(x)"); err != nil {
		return err
	}
	xs, err := b.in(op, "x", x)
	if err != nil {
		return err
	}
	res, err := b.in(op, "residual", residual)
	if err != nil {
		return err
	}
	ws, err := b.in(op, "w", w)
	if err != nil {
		return err
	}
	rs, err := f32only(op, "rstd", rstd)
	if err != nil {
		return err
	}
	ro, flushR, err := b.out(op, "residualOut", residualOut, false)
	if err != nil {
		return err
	}
	os, flush, err := b.out(op, "out", out, false)
	if err != nil {
		return err
	}
	b.pool.rows(n, rowChunk, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			r := ro[i*c : (i+1)*c]
			for j := range r {
				r[j] = xs[i*c+j] + res[i*c+j]
			}
		}
	})
	flushR()
	// Normalise the stored (rounded) residual so that the result equals the unfused fallback.
	if residualOut.DType() != tensor.F32 {
		if ro, err = b.in(op, "residualOut", residualOut); err != nil {
			return err
		}
	}
	b.pool.rows(n, rowChunk, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			rmsRow(os[i*c:(i+1)*c], &rs[i], ro[i*c:(i+1)*c], ws, eps)
		}
	})
	flush()
	return nil
}

// RMSNormBackward computes dX (= or +=) and dW (+=) from dY, x, w and rstd.
//
// With y = x*r*w and r = (mean(x^2)+eps)^-1/2:
// dx_j = r*w_j*dy_j - x_j * r^3/C * sum_k(w_k*dy_k*x_k); dw_j += sum_n dy_nj*x_nj*r_n.
func (b *Backend) RMSNormBackward(a backend.RMSNormBackwardArgs) error {
	const op = "rmsnorm-backward"
	n, c, err := b.rmsnormShapes(op, a.DY, a.RStd, a.X, a.W)
	if err != nil {
		return err
	}
	if err := numel(op, "dX", a.DX, n*c, "numel(x)"); err != nil {
		return err
	}
	if err := overlapErr(op, "dX", a.DX, "dY", a.DY); err != nil {
		return err
	}
	xs, err := b.in(op, "x", a.X)
	if err != nil {
		return err
	}
	ws, err := b.in(op, "w", a.W)
	if err != nil {
		return err
	}
	dys, err := b.in(op, "dY", a.DY)
	if err != nil {
		return err
	}
	rs, err := f32only(op, "rstd", a.RStd)
	if err != nil {
		return err
	}
	dxs, flush, err := b.out(op, "dX", a.DX, a.AccumulateDX)
	if err != nil {
		return err
	}
	chunks := (n + rowChunk - 1) / rowChunk
	var parts [][]float64
	if !a.DW.IsNil() {
		if err := numel(op, "dW", a.DW, c, "numel(w)"); err != nil {
			return err
		}
		parts = make([][]float64, chunks)
	}
	acc := a.AccumulateDX
	b.pool.run(chunks, func(ch int) {
		lo, hi := ch*rowChunk, min((ch+1)*rowChunk, n)
		var dw []float64
		if parts != nil {
			dw = make([]float64, c)
			parts[ch] = dw
		}
		for i := lo; i < hi; i++ {
			x := xs[i*c : (i+1)*c]
			dy := dys[i*c : (i+1)*c]
			dx := dxs[i*c : (i+1)*c]
			r := float64(rs[i])
			var dot float64
			for j := range x {
				dot += float64(ws[j]) * float64(dy[j]) * float64(x[j])
			}
			k := r * r * r * dot / float64(c)
			for j := range x {
				g := float32(r*float64(ws[j])*float64(dy[j]) - float64(x[j])*k)
				if acc {
					dx[j] += g
				} else {
					dx[j] = g
				}
			}
			if dw != nil {
				for j := range x {
					dw[j] += float64(dy[j]) * float64(x[j]) * r
				}
			}
		}
	})
	flush()
	if parts != nil {
		dws, flushW, err := b.out(op, "dW", a.DW, true)
		if err != nil {
			return err
		}
		b.pool.rows(c, 256, func(lo, hi int) {
			for j := lo; j < hi; j++ {
				var s float64
				for _, p := range parts {
					s += p[j]
				}
				dws[j] += float32(s)
			}
		})
		flushW()
	}
	return nil
}
