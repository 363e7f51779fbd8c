package cpu

import (
	"fmt"
	"unsafe"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// convChunk is the element count per parallel chunk of conversions and elementwise ops.
const convChunk = 1 << 15

func f32alias(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

func u16alias(b []byte) []uint16 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), len(b)/2)
}

func i32alias(b []byte) []int32 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*int32)(unsafe.Pointer(&b[0])), len(b)/4)
}

func i64alias(b []byte) []int64 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*int64)(unsafe.Pointer(&b[0])), len(b)/8)
}

// in returns t's values as float32: the tensor's own memory for F32, a converted copy for BF16
// and F16. Callers must not write to the result.
func (b *Backend) in(op, name string, t T) ([]float32, error) {
	raw, err := hostBytes(op, name, t)
	if err != nil {
		return nil, err
	}
	switch t.DType() {
	case tensor.F32:
		return f32alias(raw), nil
	case tensor.BF16, tensor.F16:
		out := make([]float32, t.Numel())
		b.decode(out, t.DType(), u16alias(raw))
		return out, nil
	}
	return nil, fmt.Errorf("cpu: %s: %s %v: want a float tensor (f32, bf16 or f16)", op, name, t)
}

func (b *Backend) decode(out []float32, dt tensor.DType, src []uint16) {
	b.pool.rows(len(out), convChunk, func(lo, hi int) {
		if dt == tensor.BF16 {
			for i := lo; i < hi; i++ {
				out[i] = tensor.BF16ToF32(src[i])
			}
		} else {
			for i := lo; i < hi; i++ {
				out[i] = tensor.F16ToF32(src[i])
			}
		}
	})
}

func (b *Backend) encode(dst []uint16, dt tensor.DType, src []float32) {
	b.pool.rows(len(src), convChunk, func(lo, hi int) {
		if dt == tensor.BF16 {
			for i := lo; i < hi; i++ {
				dst[i] = tensor.F32ToBF16(src[i])
			}
		} else {
			for i := lo; i < hi; i++ {
				dst[i] = tensor.F32ToF16(src[i])
			}
		}
	})
}

// out returns a float32 slice for writing t and a flush that stores it into t (a no-op for
// F32, whose memory the slice is). With load, the slice starts with t's current values (for
// accumulating outputs); otherwise its contents are unspecified and must be overwritten.
func (b *Backend) out(op, name string, t T, load bool) ([]float32, func(), error) {
	raw, err := hostBytes(op, name, t)
	if err != nil {
		return nil, nil, err
	}
	switch t.DType() {
	case tensor.F32:
		return f32alias(raw), func() {}, nil
	case tensor.BF16, tensor.F16:
		dt := t.DType()
		buf := make([]float32, t.Numel())
		if load {
			b.decode(buf, dt, u16alias(raw))
		}
		return buf, func() { b.encode(u16alias(raw), dt, buf) }, nil
	}
	return nil, nil, fmt.Errorf("cpu: %s: %s %v: want a float tensor (f32, bf16 or f16)", op, name, t)
}

// ints returns an I32 tensor's values (its own memory).
func ints(op, name string, t T) ([]int32, error) {
	raw, err := hostBytes(op, name, t)
	if err != nil {
		return nil, err
	}
	if t.DType() != tensor.I32 {
		return nil, fmt.Errorf("cpu: %s: %s %v: want i32", op, name, t)
	}
	return i32alias(raw), nil
}

// docBounds returns the document boundaries cu [docs+1] I32 of n packed rows, checked to run
// from 0 to n without decreasing.
func docBounds(op string, cu T, docs, n int) ([]int32, error) {
	v, err := ints(op, "CuSeqlens", cu)
	if err != nil {
		return nil, err
	}
	if len(v) != docs+1 || v[0] != 0 || int(v[docs]) != n {
		return nil, fmt.Errorf("cpu: %s: CuSeqlens %v must run from 0 to N = %d", op, v, n)
	}
	for i := 1; i <= docs; i++ {
		if v[i] < v[i-1] {
			return nil, fmt.Errorf("cpu: %s: CuSeqlens %v must not decrease", op, v)
		}
	}
	return v, nil
}

// gradSum is a parameter gradient's sums in float64, to be added to its tensor.
type gradSum struct {
	name string
	t    T
	g    []float64
}

// addGrads adds each sum to its gradient tensor (+=, rounded once to the tensor's dtype); a
// zero tensor is skipped.
func (b *Backend) addGrads(op string, sums ...gradSum) error {
	for _, acc := range sums {
		if acc.t.IsNil() {
			continue
		}
		cur, flush, err := b.out(op, acc.name, acc.t, true)
		if err != nil {
			return err
		}
		for i := range cur {
			cur[i] += float32(acc.g[i])
		}
		flush()
	}
	return nil
}

// f32only returns an F32 tensor's memory (for per-row statistics that must be F32).
func f32only(op, name string, t T) ([]float32, error) {
	raw, err := hostBytes(op, name, t)
	if err != nil {
		return nil, err
	}
	if t.DType() != tensor.F32 {
		return nil, fmt.Errorf("cpu: %s: %s %v: want f32", op, name, t)
	}
	return f32alias(raw), nil
}

// numel checks that t has n elements.
func numel(op, name string, t T, n int, desc string) error {
	if t.IsNil() {
		return fmt.Errorf("cpu: %s: %s is missing (want %s)", op, name, desc)
	}
	if t.Numel() != n {
		return fmt.Errorf("cpu: %s: %s %v has %d elements, want %s = %d", op, name, t, t.Numel(), desc, n)
	}
	return nil
}

// overlapErr reports aliasing the op does not allow.
func overlapErr(op string, an string, a T, bn string, bt T) error {
	if !a.IsNil() && !bt.IsNil() && tensor.SameBuffer(a, bt) {
		return fmt.Errorf("cpu: %s: %s and %s overlap; use separate tensors", op, an, bn)
	}
	return nil
}
