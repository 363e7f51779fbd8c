package cuda

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// ptr returns the device address of t's first element after checking that t lives on this GPU.
func (b *Backend) ptr(op, arg string, t T) (uintptr, error) {
	if t.IsNil() {
		return 0, fmt.Errorf("cuda: %s: %s is required", op, arg)
	}
	buf, ok := t.Buffer().(*Buffer)
	if !ok || buf.dev != b.d {
		return 0, fmt.Errorf("cuda: %s: %s %v is not on %s", op, arg, t, b.Name())
	}
	if buf.ptr == 0 {
		return 0, fmt.Errorf("cuda: %s: %s %v was freed", op, arg, t)
	}
	return buf.ptr + uintptr(t.Offset()), nil
}

// optPtr is ptr for optional arguments: 0 for the zero tensor.
func (b *Backend) optPtr(op, arg string, t T) (uintptr, error) {
	if t.IsNil() {
		return 0, nil
	}
	return b.ptr(op, arg, t)
}

// fcode is the kernel dtype code of a float tensor.
func fcode(op, arg string, t T) (int32, error) {
	switch t.DType() {
	case tensor.F32, tensor.BF16:
		return int32(t.DType()), nil
	}
	return 0, fmt.Errorf("cuda: %s: %s %v: dtype %s is not supported (use f32 or bf16)", op, arg, t, t.DType())
}

// fptr is ptr plus the float dtype code.
func (b *Backend) fptr(op, arg string, t T) (uintptr, int32, error) {
	p, err := b.ptr(op, arg, t)
	if err != nil {
		return 0, 0, err
	}
	c, err := fcode(op, arg, t)
	return p, c, err
}

// optFptr is fptr for optional arguments.
func (b *Backend) optFptr(op, arg string, t T) (uintptr, int32, error) {
	if t.IsNil() {
		return 0, 0, nil
	}
	return b.fptr(op, arg, t)
}

func i32ptr(b *Backend, op, arg string, t T) (uintptr, error) {
	if !t.IsNil() && t.DType() != tensor.I32 {
		return 0, fmt.Errorf("cuda: %s: %s %v must be i32", op, arg, t)
	}
	return b.ptr(op, arg, t)
}

// rows2D views t as [rows, cols] with cols = its last dimension.
func rows2D(t T) (rows, cols int) {
	if t.Rank() == 0 {
		return 1, 1
	}
	cols = t.Dim(-1)
	if cols == 0 {
		return 0, 0
	}
	return t.Numel() / cols, cols
}
