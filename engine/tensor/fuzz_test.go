package tensor

import (
	"math"
	"testing"
)

// FuzzShapeInfer: any dimension list either resolves to a shape with n elements or yields an
// error; never a panic.
func FuzzShapeInfer(f *testing.F) {
	f.Add(int64(12), int64(-1), int64(3), int64(4))
	f.Add(int64(0), int64(0), int64(-1), int64(1))
	f.Add(int64(1<<40), int64(1<<30), int64(1<<30), int64(-1))
	f.Fuzz(func(t *testing.T, n, a, b, c int64) {
		if n < 0 || n > 1<<40 {
			return
		}
		s, err := Shape{int(a), int(b), int(c)}.Infer(int(n))
		if err == nil && s.Numel() != int(n) {
			t.Fatalf("Infer(%d, %d, %d; %d) = %v with %d elements", a, b, c, n, s, s.Numel())
		}
	})
}

// FuzzDecodeFloat32: arbitrary bytes for any dtype decode or fail cleanly, and float encodings
// round-trip through F32.
func FuzzDecodeFloat32(f *testing.F) {
	f.Add(uint8(1), []byte{0, 0, 128, 63})
	f.Add(uint8(2), []byte{0x80, 0x3f, 0xff, 0x7f})
	f.Add(uint8(3), []byte{0, 0x7c})
	f.Fuzz(func(t *testing.T, d uint8, raw []byte) {
		dt := DType(d % 8)
		vals, err := DecodeFloat32(dt, raw)
		if err != nil {
			return
		}
		if !dt.IsFloat() {
			return
		}
		again, err := EncodeFloat32(dt, vals)
		if err != nil {
			t.Fatal(err)
		}
		back, _ := DecodeFloat32(dt, again)
		for i := range vals {
			if math.Float32bits(back[i]) != math.Float32bits(vals[i]) && !(vals[i] != vals[i] && back[i] != back[i]) {
				t.Fatalf("%v element %d: %v re-encoded as %v", dt, i, vals[i], back[i])
			}
		}
	})
}
