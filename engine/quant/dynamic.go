package quant

import (
	"math"
	"sort"
)

// DynamicMap returns bitsandbytes' signed 8-bit dynamic quantisation map,
// create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8), the code book of the
// nested absmax: for i in 0..6 the 2^i midpoints of linspace(0.1, 1, 2^i+1) scaled by 10^(i-6),
// with both signs, plus 0 and 1, sorted (256 values in [-0.99297, 1]). All arithmetic is fp32,
// as torch does it; linspace uses torch's scalar formula (the first half counted up from the
// start, the second half down from the end).
func DynamicMap() [256]float32 {
	data := make([]float32, 0, 256)
	for i := 0; i < 7; i++ {
		items := (1 << i) + 1
		b := linspace32(0.1, 1, items)
		scale := float32(math.Pow(10, float64(i-6)))
		for k := 0; k < items-1; k++ {
			m := float32(float32(b[k]+b[k+1]) / 2)
			data = append(data, float32(scale*m))
		}
		for k := 0; k < items-1; k++ {
			m := float32(float32(b[k]+b[k+1]) / 2)
			data = append(data, float32(-scale*m))
		}
	}
	data = append(data, 0, 1)
	sort.Slice(data, func(i, j int) bool { return data[i] < data[j] })
	var out [256]float32
	copy(out[:], data)
	return out
}

func linspace32(start, end float32, steps int) []float32 {
	step := float32(float32(end-start) / float32(steps-1))
	half := steps / 2
	out := make([]float32, steps)
	for i := range out {
		if i < half {
			out[i] = float32(start + float32(step*float32(i)))
		} else {
			out[i] = float32(end - float32(step*float32(steps-i-1)))
		}
	}
	return out
}

// QuantizeDynamicValue returns the 8-bit code of x (already divided by its block's absmax) in a
// sorted 256-entry code book, by bitsandbytes' binary search (dQuantize): seven halving steps
// from index 127, then the nearer of the final pivot and its neighbour on x's side by the fp32
// midpoint, the final pivot winning a tie. NaN lands on code 0.
func QuantizeDynamicValue(code *[256]float32, x float32) uint8 {
	pivot, upperPivot, lowerPivot := 127, 255, 0
	lower, upper := float32(-1), float32(1)
	val := code[pivot]
	for i := 64; i > 0; i >>= 1 {
		if x > val {
			lowerPivot, lower = pivot, val
			pivot += i
		} else {
			upperPivot, upper = pivot, val
			pivot -= i
		}
		val = code[pivot]
	}
	if upperPivot == 255 {
		upper = code[upperPivot]
	}
	if lowerPivot == 0 {
		lower = code[lowerPivot]
	}
	if x > val {
		if mid := float32(float32(upper+val) * 0.5); x > mid {
			return uint8(upperPivot)
		}
		return uint8(pivot)
	}
	if mid := float32(float32(lower+val) * 0.5); x < mid {
		return uint8(lowerPivot)
	}
	return uint8(pivot)
}

// QuantizeBlockwise8 quantises x in blocks of blocksize with an 8-bit code book, as
// bitsandbytes' quantize_blockwise does: per block the fp32 absmax, then each value times the
// absmax's fp32 reciprocal mapped by QuantizeDynamicValue.
func QuantizeBlockwise8(x []float32, code *[256]float32, blocksize int) (q []byte, absmax []float32) {
	blocks := (len(x) + blocksize - 1) / blocksize
	q = make([]byte, len(x))
	absmax = make([]float32, blocks)
	for b := 0; b < blocks; b++ {
		lo, hi := b*blocksize, min((b+1)*blocksize, len(x))
		var am float32
		for _, v := range x[lo:hi] {
			am = max32(am, abs32(v))
		}
		absmax[b] = am
		inv := recip(am)
		for i := lo; i < hi; i++ {
			q[i] = QuantizeDynamicValue(code, float32(x[i]*inv))
		}
	}
	return q, absmax
}
