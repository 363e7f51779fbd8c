package cuda

import (
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestOpArgsReturnsAddressesAndCodes checks what a launcher gets for good arguments: the address
// of a view's first element, the kernel code of each float dtype, and zeros for absent optional
// tensors, with no error.
func TestOpArgsReturnsAddressesAndCodes(t *testing.T) {
	b := fakeBackend(t)
	x := ft(b, tensor.BF16, 8, 16)
	view, err := x.Rows(2, 4)
	if err != nil {
		t.Fatal(err)
	}
	f := ft(b, tensor.F32, 4)
	ids := ft(b, tensor.I32, 4)
	base := x.Buffer().(*Buffer).ptr

	arg := b.args("Op")
	pv := arg.ptr("view", view)
	pf, cf := arg.float("f", f)
	pb, cb := arg.float("x", x)
	pi := arg.i32("ids", ids)
	po := arg.opt("none", T{})
	pn, cn := arg.optFloat("none", T{})
	cx := arg.code("x", x)
	if err := arg.err(); err != nil {
		t.Fatalf("good arguments: %v", err)
	}
	if want := base + 2*16*2; pv != want {
		t.Errorf("ptr(view of rows 2..4) = %#x, want %#x (the buffer plus 64 bytes)", pv, want)
	}
	if pb != base || pf != f.Buffer().(*Buffer).ptr || pi != ids.Buffer().(*Buffer).ptr {
		t.Errorf("addresses %#x %#x %#x, want the buffers' own", pb, pf, pi)
	}
	if cf != int32(tensor.F32) || cb != int32(tensor.BF16) || cx != int32(tensor.BF16) {
		t.Errorf("codes f32 %d, bf16 %d and %d, want %d and %d", cf, cb, cx, tensor.F32, tensor.BF16)
	}
	if po != 0 || pn != 0 || cn != 0 {
		t.Errorf("absent optional tensors gave %#x and %#x, %d; want zeros", po, pn, cn)
	}
}

// TestOpArgsRefusesBadArguments checks each method's refusals; the error names the op, the
// argument and what is wrong.
func TestOpArgsRefusesBadArguments(t *testing.T) {
	b := fakeBackend(t)
	other := fakeBackend(t)
	other.d.info.Ordinal = 1
	freed, err := tensor.New(&Buffer{dev: b.d, bytes: 16}, 0, tensor.F32, 4)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		call func(a *opArgs)
		want string
	}{
		{"ptr missing", func(a *opArgs) { a.ptr("w", T{}) }, "cuda: Op: w is required"},
		{"ptr other device", func(a *opArgs) { a.ptr("w", ft(other, tensor.F32, 4)) }, "cuda: Op: w f32[4]@cuda:1 is not on cuda:0"},
		{"ptr freed", func(a *opArgs) { a.ptr("w", freed) }, "w f32[4]@cuda:0 was freed"},
		{"float missing", func(a *opArgs) { a.float("x", T{}) }, "cuda: Op: x is required"},
		{"float f16", func(a *opArgs) { a.float("x", ft(b, tensor.F16, 4)) }, "x f16[4]@cuda:0: dtype f16 is not supported (use f32 or bf16)"},
		{"float i32", func(a *opArgs) { a.float("x", ft(b, tensor.I32, 4)) }, "dtype i32 is not supported"},
		{"optFloat f16", func(a *opArgs) { a.optFloat("dW", ft(b, tensor.F16, 4)) }, "cuda: Op: dW f16[4]@cuda:0: dtype f16"},
		{"opt other device", func(a *opArgs) { a.opt("lse", ft(other, tensor.F32, 4)) }, "cuda: Op: lse f32[4]@cuda:1 is not on cuda:0"},
		{"code u8", func(a *opArgs) { a.code("src", ft(b, tensor.U8, 4)) }, "cuda: Op: src u8[4]@cuda:0: dtype u8 is not supported"},
		{"i32 given f32", func(a *opArgs) { a.i32("ids", ft(b, tensor.F32, 4)) }, "cuda: Op: ids f32[4]@cuda:0 must be i32"},
		{"i32 missing", func(a *opArgs) { a.i32("ids", T{}) }, "cuda: Op: ids is required"},
		{"i32 freed", func(a *opArgs) {
			f, _ := tensor.New(&Buffer{dev: b.d, bytes: 16}, 0, tensor.I32, 4)
			a.i32("ids", f)
		}, "ids i32[4]@cuda:0 was freed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			arg := b.args("Op")
			tc.call(&arg)
			if err := arg.err(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestOpArgsKeepsTheFirstError checks the sticky error: after a failure every later call returns
// zeros, good or bad argument alike, and err still reports the first failure.
func TestOpArgsKeepsTheFirstError(t *testing.T) {
	b := fakeBackend(t)
	good := ft(b, tensor.BF16, 4)
	arg := b.args("RMSNorm")
	if p, c := arg.float("out", good); p == 0 || c != int32(tensor.BF16) {
		t.Fatalf("first, good argument: %#x, %d", p, c)
	}
	arg.ptr("rstd", T{})
	arg.float("x", ft(b, tensor.F16, 4))
	p, c := arg.float("w", good)
	pi := arg.i32("ids", ft(b, tensor.I32, 4))
	if p != 0 || c != 0 || pi != 0 {
		t.Errorf("calls after a failure returned %#x, %d, %#x; want zeros", p, c, pi)
	}
	err := arg.err()
	if err == nil || err.Error() != "cuda: RMSNorm: rstd is required" {
		t.Errorf("err() = %v, want the first failure, cuda: RMSNorm: rstd is required", err)
	}
}
