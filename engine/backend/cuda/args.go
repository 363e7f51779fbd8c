package cuda

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Tensor arguments of the host launchers.
//
// A launcher turns each tensor it is given into a device address, and each float tensor also into
// the dtype code its kernel branches on, refusing a missing tensor, one of another device, a freed
// one and a dtype the kernel does not take. opArgs does this for one op: every call returns the
// address (and code), or zero once a call has failed; the first failure is kept, named after the
// op and the argument, and err returns it. The launcher asks err once, before it uses the values:
//
//	arg := b.args("RMSNorm")
//	po, co := arg.float("out", out)
//	pr := arg.ptr("rstd", rstd)
//	pdw, cdw := arg.optFloat("dW", dW)
//	if err := arg.err(); err != nil {
//		return err
//	}
//
// Calls run in the order written, so the error reported is that of the first bad argument, as if
// each had been checked and returned on its own.
type opArgs struct {
	b     *Backend
	op    string
	first error
}

// args starts the argument checks of op.
func (b *Backend) args(op string) opArgs { return opArgs{b: b, op: op} }

// err is the first failure, or nil.
func (a *opArgs) err() error { return a.first }

// ptr is the device address of t's first element: t is required and must live on this GPU.
func (a *opArgs) ptr(name string, t T) uintptr {
	if a.first != nil {
		return 0
	}
	p, err := a.b.ptr(a.op, name, t)
	a.first = err
	return p
}

// opt is ptr for an optional tensor: 0 for the zero tensor.
func (a *opArgs) opt(name string, t T) uintptr {
	if t.IsNil() {
		return 0
	}
	return a.ptr(name, t)
}

// float is ptr and the kernel dtype code of a float tensor (F32 or BF16).
func (a *opArgs) float(name string, t T) (uintptr, int32) {
	p := a.ptr(name, t)
	return p, a.code(name, t)
}

// optFloat is float for an optional tensor: 0, 0 for the zero tensor.
func (a *opArgs) optFloat(name string, t T) (uintptr, int32) {
	if t.IsNil() {
		return 0, 0
	}
	return a.float(name, t)
}

// code is the kernel dtype code of float tensor t, without its address.
func (a *opArgs) code(name string, t T) int32 {
	if a.first != nil {
		return 0
	}
	c, err := fcode(a.op, name, t)
	a.first = err
	return c
}

// i32 is ptr for an index tensor, which must be I32.
func (a *opArgs) i32(name string, t T) uintptr {
	if a.first != nil {
		return 0
	}
	if !t.IsNil() && t.DType() != tensor.I32 {
		a.first = fmt.Errorf("cuda: %s: %s %v must be i32", a.op, name, t)
		return 0
	}
	return a.ptr(name, t)
}

// ptr returns the device address of t's first element after checking that t lives on this GPU.
func (b *Backend) ptr(op, name string, t T) (uintptr, error) {
	if t.IsNil() {
		return 0, fmt.Errorf("cuda: %s: %s is required", op, name)
	}
	buf, ok := t.Buffer().(*Buffer)
	if !ok || buf.dev != b.d {
		return 0, fmt.Errorf("cuda: %s: %s %v is not on %s", op, name, t, b.Name())
	}
	if buf.ptr == 0 {
		return 0, fmt.Errorf("cuda: %s: %s %v was freed", op, name, t)
	}
	return buf.ptr + uintptr(t.Offset()), nil
}

// fcode is the kernel dtype code of a float tensor.
func fcode(op, name string, t T) (int32, error) {
	switch t.DType() {
	case tensor.F32, tensor.BF16:
		return int32(t.DType()), nil
	}
	return 0, fmt.Errorf("cuda: %s: %s %v: dtype %s is not supported (use f32 or bf16)", op, name, t, t.DType())
}
