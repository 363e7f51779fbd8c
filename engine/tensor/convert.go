package tensor

import "math"

// BF16ToF32 widens a bfloat16 bit pattern to float32 (exact).
func BF16ToF32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// F32ToBF16 rounds f to the nearest bfloat16, ties to even. NaN stays NaN (quiet, sign kept);
// values beyond the bf16 range round to ±Inf as IEEE rounding requires.
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 { // NaN: keep sign, force a quiet payload bit
		return uint16(u>>16) | 0x40
	}
	lsb := (u >> 16) & 1
	u += 0x7fff + lsb
	return uint16(u >> 16)
}

// F32ToBF16Stochastic rounds f to bfloat16 up or down with probability proportional to the
// distance, using the low 16 bits of r as the random source, so E[result] = f for uniform r.
// NaN and ±Inf map as in F32ToBF16; a finite value may round up to ±Inf only if it lies above
// the largest finite bf16.
func F32ToBF16Stochastic(f float32, r uint32) uint16 {
	u := math.Float32bits(f)
	if u&0x7f800000 == 0x7f800000 { // Inf or NaN
		return F32ToBF16(f)
	}
	u += r & 0xffff
	return uint16(u >> 16)
}

// F16ToF32 widens an IEEE binary16 bit pattern to float32 (exact, subnormals included).
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf/NaN
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0:
		if man == 0 {
			return math.Float32frombits(sign)
		}
		// subnormal: value = man * 2^-24
		f := float32(man) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
}

// F32ToF16 rounds f to the nearest IEEE binary16, ties to even, with subnormals; overflow gives
// ±Inf and NaN stays NaN.
func F32ToF16(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	exp := int32(u>>23) & 0xff
	man := u & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		if e < -10 {
			return sign // underflows to zero (even the halfway case rounds to 0: it is < half of min subnormal)
		}
		m := man | 0x800000 // implicit bit
		shift := uint32(14 - e)
		half := uint32(1) << (shift - 1)
		rem := m & (1<<shift - 1)
		q := m >> shift
		if rem > half || (rem == half && q&1 == 1) {
			q++
		}
		return sign | uint16(q) // a carry into bit 10 correctly yields the smallest normal
	}
	q := uint32(e)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && q&1 == 1) {
		q++ // may carry into the exponent, up to Inf: correct
	}
	return sign | uint16(q)
}
