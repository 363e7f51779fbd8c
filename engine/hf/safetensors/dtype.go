package safetensors

import (
	"fmt"
	"strings"
)

// DType is the element type of a tensor as the safetensors header names it.
//
// The constants are declared in the order of the reference implementation's enum, which is
// also the order of increasing alignment; the writer lays tensors out in decreasing DType
// order (then by name), exactly as the reference does, so the order here is part of the file
// format and must not change.
type DType uint8

// The element types safetensors defines. Invalid is the zero value and never appears in a file.
const (
	Invalid DType = iota
	BOOL          // one byte per element, 0 or 1
	F4            // OCP MX FP4 (E2M1), 4 bits per element, packed
	F6_E2M3       // OCP MX FP6 (E2M3), 6 bits per element, packed
	F6_E3M2       // OCP MX FP6 (E3M2), 6 bits per element, packed
	U8            // uint8
	I8            // int8
	F8_E5M2       // 8-bit float, 5 exponent bits, 2 mantissa bits, IEEE-like (inf and NaN)
	F8_E4M3       // 8-bit float, 4 exponent bits, 3 mantissa bits, "fn" variant: no inf, NaN = 0x7f/0xff
	F8_E8M0       // 8-bit power of two (OCP MX scale): 2^(e-127), 0xff = NaN
	I16           // int16
	U16           // uint16
	F16           // IEEE-754 binary16
	BF16          // bfloat16
	I32           // int32
	U32           // uint32
	F32           // IEEE-754 binary32
	C64           // complex64: two binary32 (real, imaginary)
	F64           // IEEE-754 binary64
	I64           // int64
	U64           // uint64
	numDTypes
)

var dtypeNames = [numDTypes]string{
	Invalid: "INVALID",
	BOOL:    "BOOL",
	F4:      "F4",
	F6_E2M3: "F6_E2M3",
	F6_E3M2: "F6_E3M2",
	U8:      "U8",
	I8:      "I8",
	F8_E5M2: "F8_E5M2",
	F8_E4M3: "F8_E4M3",
	F8_E8M0: "F8_E8M0",
	I16:     "I16",
	U16:     "U16",
	F16:     "F16",
	BF16:    "BF16",
	I32:     "I32",
	U32:     "U32",
	F32:     "F32",
	C64:     "C64",
	F64:     "F64",
	I64:     "I64",
	U64:     "U64",
}

var dtypeBits = [numDTypes]int{
	BOOL: 8, F4: 4, F6_E2M3: 6, F6_E3M2: 6, U8: 8, I8: 8, F8_E5M2: 8, F8_E4M3: 8, F8_E8M0: 8,
	I16: 16, U16: 16, F16: 16, BF16: 16, I32: 32, U32: 32, F32: 32, C64: 64, F64: 64, I64: 64, U64: 64,
}

// String returns the name used in safetensors headers ("BF16", "F8_E4M3", ...).
func (d DType) String() string {
	if d >= numDTypes {
		return fmt.Sprintf("DType(%d)", uint8(d))
	}
	return dtypeNames[d]
}

// Valid reports whether d is one of the element types safetensors defines.
func (d DType) Valid() bool { return d > Invalid && d < numDTypes }

// Bits is the size of one element in bits (4 and 6 for the packed MX types); 0 if d is not valid.
func (d DType) Bits() int {
	if !d.Valid() {
		return 0
	}
	return dtypeBits[d]
}

// Size is the size of one element in bytes, or 0 for the sub-byte types and invalid values.
func (d DType) Size() int {
	if b := d.Bits(); b%8 == 0 {
		return b / 8
	}
	return 0
}

// ParseDType returns the DType a header names. Names are case-sensitive, as in the format.
func ParseDType(name string) (DType, error) {
	for d := BOOL; d < numDTypes; d++ {
		if dtypeNames[d] == name {
			return d, nil
		}
	}
	return Invalid, fmt.Errorf("safetensors: unknown dtype %q (known: %s)", name, knownDTypes())
}

func knownDTypes() string {
	names := make([]string, 0, numDTypes-1)
	for d := BOOL; d < numDTypes; d++ {
		names = append(names, dtypeNames[d])
	}
	return strings.Join(names, ", ")
}

// MarshalText implements encoding.TextMarshaler with the header name.
func (d DType) MarshalText() ([]byte, error) {
	if !d.Valid() {
		return nil, fmt.Errorf("safetensors: cannot marshal invalid dtype %d", uint8(d))
	}
	return []byte(dtypeNames[d]), nil
}

// UnmarshalText implements encoding.TextUnmarshaler with the header name.
func (d *DType) UnmarshalText(b []byte) error {
	v, err := ParseDType(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}
