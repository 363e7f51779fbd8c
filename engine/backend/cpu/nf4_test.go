package cpu

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/quant"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestDequantNF4MatchesHost: the op writes exactly the bits of quant.Weight.DequantizeBF16,
// for plain and double-quantised scales, odd counts and partial blocks.
func TestDequantNF4MatchesHost(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(3, 4))
	for _, tc := range []struct {
		shape  []int
		nested bool
	}{
		{[]int{7}, false},
		{[]int{3, 43}, true},
		{[]int{64, 64}, false},
		{[]int{300, 65}, true}, // 305 blocks: two nested blocks, the last partial
	} {
		n := tc.shape[0] * tc.shape[len(tc.shape)-1]
		if len(tc.shape) == 1 {
			n = tc.shape[0]
		}
		x := f32s(randn(r, n, 0.02))
		w, err := quant.QuantizeNF4(x, tc.shape, quant.Options{DoubleQuant: tc.nested})
		must(t, err)
		want := make([]uint16, n)
		must(t, w.DequantizeBF16(want))
		a, err := backend.UploadNF4(b, w)
		must(t, err)
		a.Out = zeros(t, b, tensor.BF16, tc.shape...)
		if a.Nested() != tc.nested {
			t.Fatalf("%v: Nested() = %v", tc.shape, a.Nested())
		}
		must(t, b.Optional().DequantNF4(a))
		raw := make([]byte, 2*n)
		must(t, b.Download(raw, a.Out))
		got := u16alias(raw)
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%v nested=%v: element %d = %#04x, host %#04x", tc.shape, tc.nested, i, got[i], want[i])
			}
		}
		// and the values are the weight's, to 4-bit accuracy: within half the widest code gap
		// (-1 to -0.696: 0.152) of the block's scale, plus bf16 rounding and, nested, the
		// scale's own 8-bit error.
		scale := w.BlockAbsmax()
		for i := range x {
			if e := math.Abs(float64(tensor.BF16ToF32(got[i]) - x[i])); e > 0.155*float64(scale[i/64]) {
				t.Fatalf("%v: element %d off by %v (block scale %v)", tc.shape, i, e, scale[i/64])
			}
		}
		backend.FreeNF4(b, a)
	}
}

func TestDequantNF4RefusesBadOperands(t *testing.T) {
	b := newTestBackend(t)
	w, err := quant.QuantizeNF4(make([]float32, 130), []int{130}, quant.Options{DoubleQuant: true})
	must(t, err)
	good, err := backend.UploadNF4(b, w)
	must(t, err)
	good.Out = zeros(t, b, tensor.BF16, 130)
	for _, tc := range []struct {
		name, want string
		edit       func(a *backend.DequantNF4Args)
	}{
		{"f32 out", "must be bf16", func(a *backend.DequantNF4Args) { a.Out = zeros(t, b, tensor.F32, 130) }},
		{"short packed", "need 65", func(a *backend.DequantNF4Args) { a.Packed = zeros(t, b, tensor.U8, 64) }},
		{"absmax count", "make 3 blocks", func(a *backend.DequantNF4Args) { a.Absmax = zeros(t, b, tensor.U8, 2) }},
		{"no nested map", "NestedMap [256]", func(a *backend.DequantNF4Args) { a.NestedMap = T{} }},
		{"nested with f32 absmax", "are for u8", func(a *backend.DequantNF4Args) { a.Absmax = zeros(t, b, tensor.F32, 3) }},
		{"bf16 absmax", "must be f32", func(a *backend.DequantNF4Args) { a.Absmax = zeros(t, b, tensor.BF16, 3) }},
	} {
		a := good
		tc.edit(&a)
		err := b.DequantNF4(a)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}
