package tensor

import (
	"fmt"
	"strings"
)

// DType is the element type of a Tensor.
type DType uint8

// The element types. The zero value is Invalid so that an unset DType is caught.
const (
	Invalid DType = iota
	F32           // IEEE-754 binary32
	BF16          // bfloat16: the top 16 bits of an f32
	F16           // IEEE-754 binary16
	I32           // int32 (token ids, positions, targets, cu_seqlens)
	I64           // int64
	U8            // uint8 (raw bytes, masks)
)

var dtypeInfo = [...]struct {
	name string
	size int
}{
	Invalid: {"invalid", 0},
	F32:     {"f32", 4},
	BF16:    {"bf16", 2},
	F16:     {"f16", 2},
	I32:     {"i32", 4},
	I64:     {"i64", 8},
	U8:      {"u8", 1},
}

// Size is the number of bytes of one element; 0 for Invalid or an unknown value.
func (d DType) Size() int {
	if int(d) >= len(dtypeInfo) {
		return 0
	}
	return dtypeInfo[d].size
}

// String returns the short lower-case name ("f32", "bf16", ...).
func (d DType) String() string {
	if int(d) >= len(dtypeInfo) {
		return fmt.Sprintf("dtype(%d)", uint8(d))
	}
	return dtypeInfo[d].name
}

// Valid reports whether d is one of the defined element types.
func (d DType) Valid() bool { return d != Invalid && int(d) < len(dtypeInfo) }

// IsFloat reports whether d is a floating-point type (F32, BF16, F16).
func (d DType) IsFloat() bool { return d == F32 || d == BF16 || d == F16 }

// ParseDType accepts the short names and the usual long spellings ("float32", "bfloat16",
// "float16", "fp32", "int32", "int64", "uint8", and safetensors' "F32", "BF16", ...).
func ParseDType(s string) (DType, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "f32", "float32", "fp32", "float":
		return F32, nil
	case "bf16", "bfloat16":
		return BF16, nil
	case "f16", "float16", "fp16", "half":
		return F16, nil
	case "i32", "int32":
		return I32, nil
	case "i64", "int64":
		return I64, nil
	case "u8", "uint8":
		return U8, nil
	}
	return Invalid, fmt.Errorf("tensor: unknown dtype %q (want one of f32, bf16, f16, i32, i64, u8)", s)
}
