package safetensors

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"
)

// littleEndianHost is true where the host's byte order is the format's, so that float32 and
// bfloat16 data can be reinterpreted instead of decoded byte by byte.
var littleEndianHost = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// ToFloat32 decodes a tensor's elements into a new []float32 with the values torch gives for
// tensor.float() on the CPU:
//
//   - F32 is copied; BF16 and F16 widen exactly (F16 NaNs become quiet NaNs with the payload
//     kept, as the x86 conversion does); F64 rounds to nearest even.
//   - F8_E4M3 is the "fn" variant (torch.float8_e4m3fn): no infinities, 0x7f and 0xff are NaN.
//   - F8_E5M2 is the top byte of an F16 (torch.float8_e5m2), with infinities and NaNs.
//   - F8_E8M0 (torch.float8_e8m0fnu) is 2^(e-127); 0xff is NaN; e = 0 gives 2^-127, a
//     subnormal float32.
//   - Integers convert to the nearest float32 (ties to even); BOOL gives 1 for any non-zero
//     byte, else 0.
//
// The packed MX types (F4, F6_E2M3, F6_E3M2) and C64 are refused with an error: they are not
// one real value per element.
func ToFloat32(t TensorInfo) ([]float32, error) {
	n := t.NumElements()
	if !t.DType.Valid() {
		return nil, fmt.Errorf("safetensors: %s: tensor %q: invalid dtype %v", t.File, t.Name, t.DType)
	}
	if size := t.DType.Size(); size == 0 || int64(len(t.Data)) != n*int64(size) {
		if err := checkDecodable(t.DType); err != nil {
			return nil, fmt.Errorf("safetensors: %s: tensor %q: %w", t.File, t.Name, err)
		}
		return nil, fmt.Errorf("safetensors: %s: tensor %q: shape %v of dtype %s needs %d bytes, data holds %d",
			t.File, t.Name, t.Shape, t.DType, n*int64(size), len(t.Data))
	}
	dst := make([]float32, n)
	if err := DecodeFloat32(dst, t.DType, t.Data); err != nil {
		return nil, fmt.Errorf("safetensors: %s: tensor %q: %w", t.File, t.Name, err)
	}
	return dst, nil
}

func checkDecodable(d DType) error {
	switch d {
	case F4, F6_E2M3, F6_E3M2:
		return fmt.Errorf("dtype %s is a packed microscaling format (%d bits per element) that needs its block scales; converting it to float32 is not supported", d, d.Bits())
	case C64:
		return fmt.Errorf("dtype C64 is complex; converting it to float32 is not supported")
	}
	if !d.Valid() {
		return fmt.Errorf("invalid dtype %v", d)
	}
	return nil
}

// DecodeFloat32 decodes src, little-endian elements of dtype, into dst, which must hold exactly
// len(src)/dtype.Size() elements. The conversions are those of ToFloat32.
func DecodeFloat32(dst []float32, dtype DType, src []byte) error {
	if err := checkDecodable(dtype); err != nil {
		return err
	}
	size := dtype.Size()
	if len(src) != len(dst)*size {
		return fmt.Errorf("decoding %s: %d bytes for %d elements, want %d bytes", dtype, len(src), len(dst), len(dst)*size)
	}
	if len(dst) == 0 {
		return nil
	}
	le := binary.LittleEndian
	switch dtype {
	case F32:
		if littleEndianHost {
			// The bytes already are the host's float32s.
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), len(src)), src)
			return nil
		}
		for i := range dst {
			dst[i] = math.Float32frombits(le.Uint32(src[4*i:]))
		}
	case BF16:
		if littleEndianHost {
			// Unaligned 16-bit loads are fine on every little-endian platform Go supports.
			in := unsafe.Slice((*uint16)(unsafe.Pointer(&src[0])), len(dst))
			out := unsafe.Slice((*uint32)(unsafe.Pointer(&dst[0])), len(dst))
			for i, v := range in {
				out[i] = uint32(v) << 16
			}
			return nil
		}
		for i := range dst {
			dst[i] = math.Float32frombits(uint32(le.Uint16(src[2*i:])) << 16)
		}
	case F16:
		for i := range dst {
			dst[i] = math.Float32frombits(f16Bits(le.Uint16(src[2*i:])))
		}
	case F64:
		for i := range dst {
			dst[i] = float32(math.Float64frombits(le.Uint64(src[8*i:])))
		}
	case F8_E4M3:
		decodeTable(dst, src, &e4m3Table)
	case F8_E5M2:
		decodeTable(dst, src, &e5m2Table)
	case F8_E8M0:
		decodeTable(dst, src, &e8m0Table)
	case BOOL:
		for i, b := range src {
			if b != 0 {
				dst[i] = 1
			} else {
				dst[i] = 0
			}
		}
	case U8:
		for i, b := range src {
			dst[i] = float32(b)
		}
	case I8:
		for i, b := range src {
			dst[i] = float32(int8(b))
		}
	case I16:
		for i := range dst {
			dst[i] = float32(int16(le.Uint16(src[2*i:])))
		}
	case U16:
		for i := range dst {
			dst[i] = float32(le.Uint16(src[2*i:]))
		}
	case I32:
		for i := range dst {
			dst[i] = float32(int32(le.Uint32(src[4*i:])))
		}
	case U32:
		for i := range dst {
			dst[i] = float32(le.Uint32(src[4*i:]))
		}
	case I64:
		for i := range dst {
			dst[i] = float32(int64(le.Uint64(src[8*i:])))
		}
	case U64:
		for i := range dst {
			dst[i] = float32(le.Uint64(src[8*i:]))
		}
	default:
		return fmt.Errorf("no float32 conversion for dtype %s", dtype)
	}
	return nil
}

func decodeTable(dst []float32, src []byte, table *[256]float32) {
	for i, b := range src {
		dst[i] = table[b]
	}
}

// f16Bits returns the float32 bit pattern of the binary16 value h: exact for every finite value
// and infinity; a NaN keeps its sign and payload and becomes quiet.
func f16Bits(h uint16) uint32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		if mant == 0 {
			return sign | 0x7f800000
		}
		return sign | 0x7fc00000 | mant<<13
	case exp != 0:
		return sign | (exp+127-15)<<23 | mant<<13
	case mant == 0:
		return sign
	}
	// Subnormal: shift the mantissa up until its leading one reaches the implicit bit.
	e := uint32(127 - 15 + 1)
	for mant&0x400 == 0 {
		mant <<= 1
		e--
	}
	return sign | e<<23 | (mant&0x3ff)<<13
}

var e4m3Table, e5m2Table, e8m0Table [256]float32

func init() {
	for i := range 256 {
		b := uint8(i)
		e4m3Table[i] = math.Float32frombits(e4m3Bits(b))
		e5m2Table[i] = math.Float32frombits(f16Bits(uint16(b) << 8))
		e8m0Table[i] = math.Float32frombits(e8m0Bits(b))
	}
}

// e4m3Bits returns the float32 bit pattern of an F8_E4M3 ("fn") value: bias 7, no infinities;
// 0x7f and 0xff are NaN, encoded as torch encodes them (0x7ff00000 with the sign).
func e4m3Bits(b uint8) uint32 {
	sign := uint32(b&0x80) << 24
	exp := uint32(b>>3) & 0xf
	mant := uint32(b & 0x7)
	switch {
	case exp == 0xf && mant == 0x7:
		return sign | 0x7ff00000
	case exp != 0:
		return sign | (exp+127-7)<<23 | mant<<20
	case mant == 0:
		return sign
	}
	e := uint32(127 - 7 + 1)
	for mant&0x8 == 0 {
		mant <<= 1
		e--
	}
	return sign | e<<23 | (mant&0x7)<<20
}

// e8m0Bits returns the float32 bit pattern of an F8_E8M0 scale: 2^(b-127), NaN for 0xff.
func e8m0Bits(b uint8) uint32 {
	switch b {
	case 0xff:
		return 0x7fc00000
	case 0:
		return 0x00400000 // 2^-127 is subnormal in float32
	}
	return uint32(b) << 23
}
