package cuda

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Host launchers of kernels/elementwise.cu: Fill, Add, Axpy, Scale, ScaleRows, RowDot, SumSquares
// and the fp32 fold (foldF32) that split-K GEMMs and the LM head's weight gradient end with.

// Fill sets every element of t to v.
func (b *Backend) Fill(t T, v float32) error {
	arg := b.args("Fill")
	p := arg.ptr("t", t)
	if err := arg.err(); err != nil {
		return err
	}
	n := uint64(t.Numel())
	if n == 0 {
		return nil
	}
	b.i32.invalidate(p, uint64(t.Bytes()))
	return b.d.Post(func() error {
		drv := b.d.drv
		switch t.DType() {
		case tensor.F32:
			return drv.check("cuMemsetD32Async", drv.cuMemsetD32Async(p, math.Float32bits(v), n, b.d.stream))
		case tensor.I32:
			return drv.check("cuMemsetD32Async", drv.cuMemsetD32Async(p, uint32(int32(v)), n, b.d.stream))
		case tensor.BF16:
			return drv.check("cuMemsetD16Async", drv.cuMemsetD16Async(p, tensor.F32ToBF16(v), n, b.d.stream))
		case tensor.F16:
			return drv.check("cuMemsetD16Async", drv.cuMemsetD16Async(p, tensor.F32ToF16(v), n, b.d.stream))
		case tensor.U8:
			return drv.check("cuMemsetD8Async", drv.cuMemsetD8Async(p, uint8(v), n, b.d.stream))
		}
		return fmt.Errorf("cuda: Fill: dtype %s is not supported", t.DType())
	})
}

// Add computes out = a + b elementwise.
func (b *Backend) Add(out, x, y T) error {
	if out.Numel() != x.Numel() || out.Numel() != y.Numel() {
		return fmt.Errorf("cuda: Add: out %v, a %v, b %v differ in element count", out, x, y)
	}
	arg := b.args("Add")
	po, co := arg.float("out", out)
	pa, ca := arg.float("a", x)
	pb, cb := arg.float("b", y)
	if err := arg.err(); err != nil {
		return err
	}
	n := int64(out.Numel())
	if vec8(n, []int32{co, ca, cb}, po, pa, pb) {
		return b.launch1D("elementwise.cu", "ew_add_bf16x8", n/8, po, pa, pb, n/8)
	}
	return b.launch1D("elementwise.cu", "ew_add", n, po, co, pa, ca, pb, cb, n)
}

// Axpy computes y += alpha*x.
func (b *Backend) Axpy(y T, alpha float32, x T) error {
	if y.Numel() != x.Numel() {
		return fmt.Errorf("cuda: Axpy: y %v and x %v differ in element count", y, x)
	}
	arg := b.args("Axpy")
	py, cy := arg.float("y", y)
	px, cx := arg.float("x", x)
	if err := arg.err(); err != nil {
		return err
	}
	n := int64(y.Numel())
	return b.launch1D("elementwise.cu", "ew_axpy", n, py, cy, alpha, px, cx, n)
}

// Scale computes t *= alpha.
func (b *Backend) Scale(t T, alpha float32) error {
	arg := b.args("Scale")
	p, c := arg.float("t", t)
	if err := arg.err(); err != nil {
		return err
	}
	n := int64(t.Numel())
	return b.launch1D("elementwise.cu", "ew_scale", n, p, c, alpha, n)
}

// ScaleRows computes t[r,:] *= w[r] (w [R] F32).
func (b *Backend) ScaleRows(t, w T) error {
	const op = "ScaleRows"
	arg := b.args(op)
	p, c := arg.float("t", t)
	if err := arg.err(); err != nil {
		return err
	}
	cols := int64(t.Shape().Last())
	if cols <= 0 {
		return fmt.Errorf("cuda: %s: t %v has no columns", op, t)
	}
	n := int64(t.Numel())
	if w.DType() != tensor.F32 || int64(w.Numel()) != n/cols {
		return fmt.Errorf("cuda: %s: w %v must be f32 with one element per row of t %v (%d)", op, w, t, n/cols)
	}
	wp := arg.ptr("w", w)
	if err := arg.err(); err != nil {
		return err
	}
	return b.launch1D("elementwise.cu", "ew_scale_rows", n, p, c, wp, cols, n)
}

// RowDot computes out[r] = sum_c a[r,c]*b[r,c] in fp32 (out [R] F32), one warp per row.
func (b *Backend) RowDot(out, x, y T) error {
	const op = "RowDot"
	arg := b.args(op)
	xp, xc := arg.float("a", x)
	yp, yc := arg.float("b", y)
	if err := arg.err(); err != nil {
		return err
	}
	if !x.Shape().Equal(y.Shape()) {
		return fmt.Errorf("cuda: %s: a %v and b %v differ in shape", op, x, y)
	}
	cols := int64(x.Shape().Last())
	if cols <= 0 {
		return fmt.Errorf("cuda: %s: a %v has no columns", op, x)
	}
	rows := int64(x.Numel()) / cols
	if out.DType() != tensor.F32 || int64(out.Numel()) != rows {
		return fmt.Errorf("cuda: %s: out %v must be f32 with one element per row of a %v (%d)", op, out, x, rows)
	}
	po := arg.ptr("out", out)
	if err := arg.err(); err != nil {
		return err
	}
	return b.launch1D("elementwise.cu", "row_dot", rows*32, po, xp, xc, yp, yc, rows, cols)
}

// SumSquares returns each tensor's sum of squares, accumulated in fp64 on the device.
func (b *Backend) SumSquares(ts []T) ([]float64, error) {
	out := make([]float64, len(ts))
	if len(ts) == 0 {
		return out, nil
	}
	type job struct {
		p uintptr
		c int32
		n int64
	}
	jobs := make([]job, len(ts))
	arg := b.args("SumSquares")
	for i, t := range ts {
		p, c := arg.float(fmt.Sprintf("ts[%d]", i), t)
		jobs[i] = job{p, c, int64(t.Numel())}
	}
	if err := arg.err(); err != nil {
		return nil, err
	}
	var acc *Buffer
	err := b.d.Do(func() error {
		var err error
		if acc, err = b.d.allocOnThread(uint64(8 * len(ts))); err != nil {
			return err
		}
		defer b.d.alloc.Free(acc.ptr)
		drv := b.d.drv
		if err := drv.check("cuMemsetD8Async", drv.cuMemsetD8Async(acc.ptr, 0, uint64(8*len(ts)), b.d.stream)); err != nil {
			return err
		}
		for i, j := range jobs {
			if j.n == 0 {
				continue
			}
			if vec8(j.n, []int32{j.c}, j.p) {
				args := packArgs(acc.ptr+uintptr(8*i), j.p, j.n/8)
				if err := b.d.launchOnThread("elementwise.cu", "sum_squares_bf16x8", grid1D(j.n/8, b.d.info.SMs), [3]uint32{256, 1, 1}, 0, args...); err != nil {
					return err
				}
				continue
			}
			args := packArgs(acc.ptr+uintptr(8*i), j.p, j.c, j.n)
			if err := b.d.launchOnThread("elementwise.cu", "sum_squares", grid1D(j.n, b.d.info.SMs), [3]uint32{256, 1, 1}, 0, args...); err != nil {
				return err
			}
		}
		if err := b.d.syncOnThread(); err != nil {
			return err
		}
		return drv.check("cuMemcpyDtoH_v2", drv.cuMemcpyDtoH(unsafe.Pointer(&out[0]), acc.ptr, uint64(8*len(ts))))
	})
	return out, err
}

// foldF32 posts y = beta·y + the sum of parts fp32 slices of y's size at pparts, rounded once
// to y's dtype (ew_fold_parts, vectorised when y, its pointer py and the slices allow).
func (b *Backend) foldF32(y T, py uintptr, cy int32, beta float32, pparts uintptr, parts int) error {
	n := int64(y.Numel())
	if n == 0 {
		return nil
	}
	name, items := "ew_fold_parts", n
	if yAlign := uintptr(4 * y.DType().Size()); n%4 == 0 && pparts%16 == 0 && py%yAlign == 0 {
		name, items = "ew_fold_parts4", n/4
	}
	args := packArgs(py, cy, beta, pparts, int32(parts), n)
	return b.d.Post(func() error {
		return b.d.launchOnThread("elementwise.cu", name, grid1D(items, b.d.info.SMs), [3]uint32{256, 1, 1}, 0, args...)
	})
}
