package tensor

import "fmt"

// Buffer is a block of device memory created by a backend. Only the backend that created it
// reads, writes or frees it; everyone else handles it through Tensor values.
type Buffer interface {
	// Len is the buffer's size in bytes.
	Len() int64
	// Device names where the memory lives ("cpu", "cuda:0").
	Device() string
}

// HostBuffer is implemented by buffers whose bytes are ordinary host memory (the CPU backend).
// Host returns the whole buffer; callers honour Tensor.Offset and Tensor.Bytes.
type HostBuffer interface {
	Buffer
	Host() []byte
}

// Tensor is a dense, row-major view of Numel elements of dtype DType starting Offset bytes into
// Buf. The zero Tensor is "no tensor" (IsNil): ops use it for optional arguments.
type Tensor struct {
	shape  Shape
	dtype  DType
	buf    Buffer
	offset int64
}

// New makes a Tensor over buf at byte offset off. It checks that the shape is valid and the
// view fits inside the buffer. Backends call this; model code gets tensors from Backend.Alloc.
func New(buf Buffer, off int64, dt DType, shape ...int) (Tensor, error) {
	s := Shape(shape).Clone()
	if buf == nil {
		return Tensor{}, fmt.Errorf("tensor: New %s%v: nil buffer", dt, s)
	}
	if !dt.Valid() {
		return Tensor{}, fmt.Errorf("tensor: New %v: invalid dtype %s", s, dt)
	}
	if err := s.Check(); err != nil {
		return Tensor{}, err
	}
	need := int64(s.Numel()) * int64(dt.Size())
	if off < 0 || off+need > buf.Len() {
		return Tensor{}, fmt.Errorf("tensor: %s%v at byte %d needs %d bytes; buffer on %s has %d",
			dt, s, off, need, buf.Device(), buf.Len())
	}
	return Tensor{shape: s, dtype: dt, buf: buf, offset: off}, nil
}

// IsNil reports whether t is the zero Tensor (no buffer).
func (t Tensor) IsNil() bool { return t.buf == nil }

// Shape returns the dimensions (do not modify the result).
func (t Tensor) Shape() Shape { return t.shape }

// DType returns the element type.
func (t Tensor) DType() DType { return t.dtype }

// Buffer returns the underlying buffer (nil for the zero Tensor).
func (t Tensor) Buffer() Buffer { return t.buf }

// Offset returns the byte offset of element 0 within the buffer.
func (t Tensor) Offset() int64 { return t.offset }

// Numel returns the element count.
func (t Tensor) Numel() int { return t.shape.Numel() }

// Bytes returns the size of the view in bytes.
func (t Tensor) Bytes() int64 { return int64(t.Numel()) * int64(t.dtype.Size()) }

// Dim returns dimension i; negative i counts from the end (-1 is the last).
func (t Tensor) Dim(i int) int {
	if i < 0 {
		i += len(t.shape)
	}
	return t.shape[i]
}

// Rank returns the number of dimensions.
func (t Tensor) Rank() int { return len(t.shape) }

// String describes the tensor, e.g. "bf16[8 64]@cpu".
func (t Tensor) String() string {
	if t.IsNil() {
		return "<nil tensor>"
	}
	return fmt.Sprintf("%s%v@%s", t.dtype, t.shape, t.buf.Device())
}

// Reshape returns a view with the same elements and a new shape (one dimension may be -1).
func (t Tensor) Reshape(shape ...int) (Tensor, error) {
	s, err := Shape(shape).Infer(t.Numel())
	if err != nil {
		return Tensor{}, fmt.Errorf("tensor: reshape %v: %w", t, err)
	}
	return Tensor{shape: s, dtype: t.dtype, buf: t.buf, offset: t.offset}, nil
}

// View returns a contiguous view of n = numel(shape) elements starting at element start of t
// (t seen as flat). Parameter arenas use it to hand out named per-parameter views.
func (t Tensor) View(start int, shape ...int) (Tensor, error) {
	s := Shape(shape).Clone()
	if err := s.Check(); err != nil {
		return Tensor{}, err
	}
	n := s.Numel()
	if start < 0 || start+n > t.Numel() {
		return Tensor{}, fmt.Errorf("tensor: view of %d elements at %d is outside %v", n, start, t)
	}
	return Tensor{shape: s, dtype: t.dtype, buf: t.buf, offset: t.offset + int64(start)*int64(t.dtype.Size())}, nil
}

// Rows returns rows [lo, hi) of the outermost dimension as a view.
func (t Tensor) Rows(lo, hi int) (Tensor, error) {
	if len(t.shape) == 0 {
		return Tensor{}, fmt.Errorf("tensor: rows of scalar %v", t)
	}
	if lo < 0 || hi < lo || hi > t.shape[0] {
		return Tensor{}, fmt.Errorf("tensor: rows [%d,%d) outside %v", lo, hi, t)
	}
	inner := Shape(t.shape[1:]).Numel()
	s := t.shape.Clone()
	s[0] = hi - lo
	return Tensor{shape: s, dtype: t.dtype, buf: t.buf, offset: t.offset + int64(lo*inner)*int64(t.dtype.Size())}, nil
}

// SameBuffer reports whether a and b view overlapping bytes of the same buffer.
func SameBuffer(a, b Tensor) bool {
	if a.buf == nil || a.buf != b.buf {
		return false
	}
	return a.offset < b.offset+b.Bytes() && b.offset < a.offset+a.Bytes()
}
