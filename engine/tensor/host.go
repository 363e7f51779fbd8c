package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
)

// EncodeFloat32 converts host float32 values to the little-endian bytes of dtype dt (F32, BF16
// or F16, rounding to nearest even).
func EncodeFloat32(dt DType, src []float32) ([]byte, error) {
	out := make([]byte, len(src)*dt.Size())
	switch dt {
	case F32:
		for i, v := range src {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
		}
	case BF16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(out[2*i:], F32ToBF16(v))
		}
	case F16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(out[2*i:], F32ToF16(v))
		}
	default:
		return nil, fmt.Errorf("tensor: cannot encode float32 values as %s", dt)
	}
	return out, nil
}

// DecodeFloat32 converts little-endian bytes of float dtype dt (F32, BF16, F16) or integer dtype
// (I32, I64, U8, converted by value) to float32.
func DecodeFloat32(dt DType, src []byte) ([]float32, error) {
	sz := dt.Size()
	if sz == 0 || len(src)%sz != 0 {
		return nil, fmt.Errorf("tensor: %d bytes is not a whole number of %s elements", len(src), dt)
	}
	n := len(src) / sz
	out := make([]float32, n)
	switch dt {
	case F32:
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case BF16:
		for i := range out {
			out[i] = BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case F16:
		for i := range out {
			out[i] = F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case I32:
		for i := range out {
			out[i] = float32(int32(binary.LittleEndian.Uint32(src[4*i:])))
		}
	case I64:
		for i := range out {
			out[i] = float32(int64(binary.LittleEndian.Uint64(src[8*i:])))
		}
	case U8:
		for i := range out {
			out[i] = float32(src[i])
		}
	default:
		return nil, fmt.Errorf("tensor: cannot decode %s", dt)
	}
	return out, nil
}

// EncodeInt32 returns the little-endian bytes of src as I32 elements.
func EncodeInt32(src []int32) []byte {
	out := make([]byte, 4*len(src))
	for i, v := range src {
		binary.LittleEndian.PutUint32(out[4*i:], uint32(v))
	}
	return out
}

// DecodeInt32 reads little-endian I32 elements.
func DecodeInt32(src []byte) ([]int32, error) {
	if len(src)%4 != 0 {
		return nil, fmt.Errorf("tensor: %d bytes is not a whole number of i32 elements", len(src))
	}
	out := make([]int32, len(src)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(src[4*i:]))
	}
	return out, nil
}
