package cpu

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Fill sets every element of t to v.
func (b *Backend) Fill(t T, v float32) error {
	const op = "fill"
	switch t.DType() {
	case tensor.I32, tensor.I64, tensor.U8:
		raw, err := hostBytes(op, "t", t)
		if err != nil {
			return err
		}
		if v != float32(math.Trunc(float64(v))) {
			return fmt.Errorf("cpu: fill %v with %v: integer tensors need an integer value", t, v)
		}
		switch t.DType() {
		case tensor.I32:
			s := i32alias(raw)
			for i := range s {
				s[i] = int32(v)
			}
		case tensor.I64:
			s := i64alias(raw)
			for i := range s {
				s[i] = int64(v)
			}
		default:
			for i := range raw {
				raw[i] = uint8(v)
			}
		}
		return nil
	}
	o, flush, err := b.out(op, "t", t, false)
	if err != nil {
		return err
	}
	b.pool.rows(len(o), convChunk, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			o[i] = v
		}
	})
	flush()
	return nil
}

// Add computes out = a + b.
func (b *Backend) Add(out, x, y T) error {
	const op = "add"
	n := out.Numel()
	if err := numel(op, "a", x, n, "numel(out)"); err != nil {
		return err
	}
	if err := numel(op, "b", y, n, "numel(out)"); err != nil {
		return err
	}
	xs, err := b.in(op, "a", x)
	if err != nil {
		return err
	}
	ys, err := b.in(op, "b", y)
	if err != nil {
		return err
	}
	o, flush, err := b.out(op, "out", out, false)
	if err != nil {
		return err
	}
	b.pool.rows(n, convChunk, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			o[i] = xs[i] + ys[i]
		}
	})
	flush()
	return nil
}

// Axpy computes y += alpha * x.
func (b *Backend) Axpy(y T, alpha float32, x T) error {
	const op = "axpy"
	if err := numel(op, "x", x, y.Numel(), "numel(y)"); err != nil {
		return err
	}
	xs, err := b.in(op, "x", x)
	if err != nil {
		return err
	}
	ys, flush, err := b.out(op, "y", y, true)
	if err != nil {
		return err
	}
	b.pool.rows(len(ys), convChunk, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			ys[i] += alpha * xs[i]
		}
	})
	flush()
	return nil
}

// Scale computes t *= alpha.
func (b *Backend) Scale(t T, alpha float32) error {
	ts, flush, err := b.out("scale", "t", t, true)
	if err != nil {
		return err
	}
	b.pool.rows(len(ts), convChunk, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			ts[i] *= alpha
		}
	})
	flush()
	return nil
}

// SumSquares returns the sum of squares of each tensor, accumulated in float64 over fixed-size
// chunks combined in order (deterministic for any worker count).
func (b *Backend) SumSquares(ts []T) ([]float64, error) {
	res := make([]float64, len(ts))
	for k, t := range ts {
		xs, err := b.in("sum-squares", fmt.Sprintf("tensor %d", k), t)
		if err != nil {
			return nil, err
		}
		chunks := (len(xs) + convChunk - 1) / convChunk
		part := make([]float64, chunks)
		b.pool.run(chunks, func(c int) {
			lo := c * convChunk
			hi := min(lo+convChunk, len(xs))
			var s float64
			for _, v := range xs[lo:hi] {
				s += float64(v) * float64(v)
			}
			part[c] = s
		})
		var s float64
		for _, p := range part {
			s += p
		}
		res[k] = s
	}
	return res, nil
}

// Copy copies src into dst, converting between float dtypes or between integer dtypes.
func (b *Backend) Copy(dst, src T) error {
	const op = "copy"
	if err := numel(op, "src", src, dst.Numel(), "numel(dst)"); err != nil {
		return err
	}
	d, err := hostBytes(op, "dst", dst)
	if err != nil {
		return err
	}
	s, err := hostBytes(op, "src", src)
	if err != nil {
		return err
	}
	if dst.DType() == src.DType() {
		copy(d, s)
		return nil
	}
	if tensor.SameBuffer(dst, src) {
		return fmt.Errorf("cpu: copy %v to %v: a converting copy may not overlap its source", src, dst)
	}
	switch {
	case dst.DType().IsFloat() && src.DType().IsFloat():
		xs, err := b.in(op, "src", src)
		if err != nil {
			return err
		}
		o, flush, err := b.out(op, "dst", dst, false)
		if err != nil {
			return err
		}
		copy(o, xs)
		flush()
		return nil
	case dst.DType() == tensor.I64 && src.DType() == tensor.I32:
		di, si := i64alias(d), i32alias(s)
		for i := range si {
			di[i] = int64(si[i])
		}
		return nil
	case dst.DType() == tensor.I32 && src.DType() == tensor.I64:
		di, si := i32alias(d), i64alias(s)
		for i := range si {
			if si[i] < math.MinInt32 || si[i] > math.MaxInt32 {
				return fmt.Errorf("cpu: copy %v to %v: element %d = %d does not fit in i32", src, dst, i, si[i])
			}
			di[i] = int32(si[i])
		}
		return nil
	}
	return fmt.Errorf("cpu: copy %v to %v: no conversion between %s and %s", src, dst, src.DType(), dst.DType())
}

// rowsOf checks that t is float rows of the last dimension and returns (rows, columns).
func rowsOf(op, name string, t T) (int, int, error) {
	if t.IsNil() {
		return 0, 0, fmt.Errorf("cpu: %s: %s is missing", op, name)
	}
	c := t.Shape().Last()
	if c <= 0 {
		return 0, 0, fmt.Errorf("cpu: %s: %s %v has no columns", op, name, t)
	}
	return t.Numel() / c, c, nil
}

// ScaleRows computes t[r,:] *= w[r].
func (b *Backend) ScaleRows(t, w T) error {
	const op = "scale_rows"
	r, c, err := rowsOf(op, "t", t)
	if err != nil {
		return err
	}
	if err := numel(op, "w", w, r, "rows(t)"); err != nil {
		return err
	}
	ws, err := f32only(op, "w", w)
	if err != nil {
		return err
	}
	ts, flush, err := b.out(op, "t", t, true)
	if err != nil {
		return err
	}
	b.pool.rows(r, rowChunk, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			a := ws[i]
			row := ts[i*c : (i+1)*c]
			for j := range row {
				row[j] *= a
			}
		}
	})
	flush()
	return nil
}

// RowDot computes out[r] = sum_c a[r,c]*b[r,c] with fp32 accumulation.
func (b *Backend) RowDot(out, x, y T) error {
	const op = "row_dot"
	r, c, err := rowsOf(op, "a", x)
	if err != nil {
		return err
	}
	if !x.Shape().Equal(y.Shape()) {
		return fmt.Errorf("cpu: %s: a %v and b %v differ in shape", op, x, y)
	}
	if err := numel(op, "out", out, r, "rows(a)"); err != nil {
		return err
	}
	xs, err := b.in(op, "a", x)
	if err != nil {
		return err
	}
	ys, err := b.in(op, "b", y)
	if err != nil {
		return err
	}
	os, err := f32only(op, "out", out)
	if err != nil {
		return err
	}
	b.pool.rows(r, rowChunk, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			var s float32
			for j, v := range xs[i*c : (i+1)*c] {
				s += v * ys[i*c+j]
			}
			os[i] = s
		}
	})
	return nil
}
