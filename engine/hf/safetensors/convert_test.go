package safetensors

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"
)

// minifloat computes a binary float's value from its fields with float64 arithmetic, an
// implementation independent of the bit manipulation in convert.go.
func minifloat(sign, exp, mant, mantBits, bias int) float64 {
	var v float64
	if exp == 0 {
		v = math.Ldexp(float64(mant), 1-bias-mantBits)
	} else {
		v = math.Ldexp(1+float64(mant)/float64(int(1)<<mantBits), exp-bias)
	}
	if sign != 0 {
		v = -v
	}
	return v
}

func TestDecodeF16Exhaustive(t *testing.T) {
	src := make([]byte, 2*65536)
	for i := range 65536 {
		binary.LittleEndian.PutUint16(src[2*i:], uint16(i))
	}
	dst := make([]float32, 65536)
	if err := DecodeFloat32(dst, F16, src); err != nil {
		t.Fatal(err)
	}
	for i, got := range dst {
		sign, exp, mant := i>>15, (i>>10)&0x1f, i&0x3ff
		bits := math.Float32bits(got)
		switch {
		case exp == 0x1f && mant == 0:
			if !math.IsInf(float64(got), 1-2*sign) {
				t.Fatalf("F16 %#04x = %v, want infinity", i, got)
			}
		case exp == 0x1f:
			// A NaN: quiet, same sign, payload kept (what x86 and torch give).
			if want := uint32(sign)<<31 | 0x7fc00000 | uint32(mant)<<13; bits != want {
				t.Fatalf("F16 NaN %#04x = %#08x, want %#08x", i, bits, want)
			}
		default:
			if want := minifloat(sign, exp, mant, 10, 15); float64(got) != want || math.Signbit(float64(got)) != (sign == 1) {
				t.Fatalf("F16 %#04x = %v, want %v", i, got, want)
			}
		}
	}
}

func TestDecodeF8Exhaustive(t *testing.T) {
	for _, tt := range []struct {
		dtype          DType
		mantBits, bias int
		special        func(b int) (uint32, bool) // the exact bits of non-finite values
	}{
		{F8_E4M3, 3, 7, func(b int) (uint32, bool) {
			if b&0x7f == 0x7f { // "fn": only S.1111.111 is NaN; torch gives 0x7ff00000 | sign
				return uint32(b>>7)<<31 | 0x7ff00000, true
			}
			return 0, false
		}},
		{F8_E5M2, 2, 15, func(b int) (uint32, bool) {
			exp, mant := (b>>2)&0x1f, b&3
			switch {
			case exp == 0x1f && mant == 0:
				return uint32(b>>7)<<31 | 0x7f800000, true
			case exp == 0x1f:
				return uint32(b>>7)<<31 | 0x7fc00000 | uint32(mant)<<21, true
			}
			return 0, false
		}},
	} {
		src := make([]byte, 256)
		for i := range src {
			src[i] = byte(i)
		}
		dst := make([]float32, 256)
		if err := DecodeFloat32(dst, tt.dtype, src); err != nil {
			t.Fatal(err)
		}
		expBits := 7 - tt.mantBits
		for b, got := range dst {
			if want, ok := tt.special(b); ok {
				if math.Float32bits(got) != want {
					t.Errorf("%s %#02x = %#08x, want %#08x", tt.dtype, b, math.Float32bits(got), want)
				}
				continue
			}
			sign, exp, mant := b>>7, (b>>tt.mantBits)&(1<<expBits-1), b&(1<<tt.mantBits-1)
			want := minifloat(sign, exp, mant, tt.mantBits, tt.bias)
			if float64(got) != want || math.Signbit(float64(got)) != (sign == 1) {
				t.Errorf("%s %#02x = %v, want %v", tt.dtype, b, got, want)
			}
		}
	}
}

func TestDecodeKnownValues(t *testing.T) {
	nan := func(bits uint32) float32 { return math.Float32frombits(bits) }
	le16 := func(v ...uint16) []byte {
		var b []byte
		for _, x := range v {
			b = binary.LittleEndian.AppendUint16(b, x)
		}
		return b
	}
	le32 := func(v ...uint32) []byte {
		var b []byte
		for _, x := range v {
			b = binary.LittleEndian.AppendUint32(b, x)
		}
		return b
	}
	le64 := func(v ...uint64) []byte {
		var b []byte
		for _, x := range v {
			b = binary.LittleEndian.AppendUint64(b, x)
		}
		return b
	}
	tests := []struct {
		dtype DType
		data  []byte
		want  []float32
	}{
		{F32, le32(0x3f800000, 0xc0490fdb, 0x7f800001), []float32{1, -math.Pi, nan(0x7f800001)}},
		{BF16, le16(0x3f80, 0xc049, 0x7fc1, 0x0001), []float32{1, -3.140625, nan(0x7fc10000), nan(0x00010000)}},
		{F16, le16(0x3c00, 0x7bff, 0x0001, 0xfc00, 0x8000), []float32{1, 65504, 0x1p-24, float32(math.Inf(-1)), float32(math.Copysign(0, -1))}},
		// 1+2^-24 is a tie between 1 and 1+2^-23: to even gives 1. 1+3*2^-24 rounds up.
		{F64, le64(math.Float64bits(1+0x1p-24), math.Float64bits(1+3*0x1p-24), math.Float64bits(1e300)), []float32{1, 1 + 0x1p-22, float32(math.Inf(1))}},
		{F8_E4M3, []byte{0x38, 0x7e, 0x01, 0x80, 0xfe, 0x7f}, []float32{1, 448, 0x1p-9, float32(math.Copysign(0, -1)), -448, nan(0x7ff00000)}},
		{F8_E5M2, []byte{0x3c, 0x7b, 0x01, 0x7c, 0xfc, 0x7e}, []float32{1, 57344, 0x1p-16, float32(math.Inf(1)), float32(math.Inf(-1)), nan(0x7fc00000)}},
		{F8_E8M0, []byte{127, 128, 0, 1, 254, 255}, []float32{1, 2, 0x1p-127, 0x1p-126, 0x1p127, nan(0x7fc00000)}},
		{BOOL, []byte{0, 1, 2}, []float32{0, 1, 1}},
		{U8, []byte{0, 255}, []float32{0, 255}},
		{I8, []byte{0x80, 0xff, 0x7f}, []float32{-128, -1, 127}},
		{I16, le16(0x8000, 0xffff), []float32{-32768, -1}},
		{U16, le16(0xffff), []float32{65535}},
		{I32, le32(0x80000000, 16777217), []float32{-2147483648, 16777216}},
		{U32, le32(0xffffffff), []float32{4294967296}},
		// 2^24+1 ties to 2^24 (even); 2^24+3 ties to 2^24+4 (even).
		{I64, le64(16777217, 16777219, 1<<63), []float32{16777216, 16777220, -0x1p63}},
		{U64, le64(^uint64(0)), []float32{0x1p64}},
	}
	for _, tt := range tests {
		t.Run(tt.dtype.String(), func(t *testing.T) {
			ti := TensorInfo{Name: "t", DType: tt.dtype, Shape: []int{len(tt.want)}, Data: tt.data, File: "f"}
			got, err := ToFloat32(ti)
			if err != nil {
				t.Fatal(err)
			}
			for i := range tt.want {
				if math.Float32bits(got[i]) != math.Float32bits(tt.want[i]) {
					t.Errorf("element %d = %v (%#08x), want %v (%#08x)", i, got[i], math.Float32bits(got[i]), tt.want[i], math.Float32bits(tt.want[i]))
				}
			}
		})
	}
}

func TestToFloat32Refuses(t *testing.T) {
	tests := []struct {
		ti   TensorInfo
		want string
	}{
		{TensorInfo{Name: "w", File: "m.safetensors", DType: F4, Shape: []int{2}, Data: []byte{0}}, `safetensors: m.safetensors: tensor "w": dtype F4 is a packed microscaling format`},
		{TensorInfo{Name: "w", DType: F6_E3M2, Shape: []int{4}, Data: []byte{0, 0, 0}}, "dtype F6_E3M2 is a packed"},
		{TensorInfo{Name: "w", DType: C64, Shape: []int{1}, Data: make([]byte, 8)}, "C64 is complex"},
		{TensorInfo{Name: "w", DType: Invalid, Shape: []int{1}, Data: []byte{0}}, "invalid dtype"},
		{TensorInfo{Name: "w", DType: F32, Shape: []int{2}, Data: []byte{0, 0, 0, 0}}, "shape [2] of dtype F32 needs 8 bytes, data holds 4"},
	}
	for _, tt := range tests {
		if _, err := ToFloat32(tt.ti); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ToFloat32(%v) error = %v, want %q", tt.ti.DType, err, tt.want)
		}
	}
	if err := DecodeFloat32(make([]float32, 2), BF16, make([]byte, 3)); err == nil {
		t.Error("DecodeFloat32 accepted 3 bytes for 2 BF16 elements")
	}
}

func TestDTypes(t *testing.T) {
	sizes := map[DType]int{BOOL: 1, U8: 1, I8: 1, F8_E5M2: 1, F8_E4M3: 1, F8_E8M0: 1, I16: 2, U16: 2, F16: 2, BF16: 2,
		I32: 4, U32: 4, F32: 4, C64: 8, F64: 8, I64: 8, U64: 8, F4: 0, F6_E2M3: 0, F6_E3M2: 0}
	if len(sizes) != int(numDTypes)-1 {
		t.Fatalf("test covers %d dtypes, package has %d", len(sizes), numDTypes-1)
	}
	for d, size := range sizes {
		back, err := ParseDType(d.String())
		if err != nil || back != d {
			t.Errorf("ParseDType(%q) = %v, %v", d.String(), back, err)
		}
		if d.Size() != size {
			t.Errorf("%s.Size() = %d, want %d", d, d.Size(), size)
		}
		text, err := d.MarshalText()
		var u DType
		if err != nil || u.UnmarshalText(text) != nil || u != d {
			t.Errorf("%s text round trip: %q %v -> %v", d, text, err, u)
		}
	}
	if _, err := ParseDType("float32"); err == nil || !strings.Contains(err.Error(), "known: BOOL, F4") {
		t.Errorf(`ParseDType("float32") error = %v`, err)
	}
	if Invalid.Valid() || DType(200).Valid() || DType(200).String() != "DType(200)" {
		t.Error("invalid DTypes are reported valid or misnamed")
	}
}

// TestDecodePortablePath checks that the byte-by-byte decoding used on big-endian hosts gives
// the same results as the reinterpreting fast path used on little-endian ones.
func TestDecodePortablePath(t *testing.T) {
	src := make([]byte, 4096)
	for i := range src {
		src[i] = byte(i*7 + i>>8)
	}
	for _, dt := range []DType{F32, BF16} {
		n := len(src) / dt.Size()
		fast, slow := make([]float32, n), make([]float32, n)
		if err := DecodeFloat32(fast, dt, src); err != nil {
			t.Fatal(err)
		}
		saved := littleEndianHost
		littleEndianHost = false
		err := DecodeFloat32(slow, dt, src)
		littleEndianHost = saved
		if err != nil {
			t.Fatal(err)
		}
		for i := range fast {
			if math.Float32bits(fast[i]) != math.Float32bits(slow[i]) {
				t.Fatalf("%s element %d: %#08x vs portable %#08x", dt, i, math.Float32bits(fast[i]), math.Float32bits(slow[i]))
			}
		}
	}
	if err := DecodeFloat32(nil, BF16, nil); err != nil {
		t.Errorf("decoding nothing: %v", err)
	}
}
