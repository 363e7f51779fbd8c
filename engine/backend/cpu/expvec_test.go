package cpu

import (
	"math"
	"testing"
)

func TestExpVecAccuracy(t *testing.T) {
	for _, vec := range []bool{true, false} {
		saved := useAVX2
		useAVX2 = useAVX2 && vec
		testExpVecAccuracy(t)
		useAVX2 = saved
	}
}

func testExpVecAccuracy(t *testing.T) {
	var src []float32
	for x := -90.0; x <= 90; x += 0.00917 {
		src = append(src, float32(x))
	}
	src = append(src, 0, -0, float32(math.Inf(-1)), float32(math.Inf(1)))
	dst := make([]float32, len(src))
	expVec(dst, src)
	for i, x := range src {
		c := math.Min(math.Max(float64(x), expLo), expHi)
		want := math.Exp(c)
		if want < 0x1p-126 {
			if math.Abs(float64(dst[i])-want) > 0x1p-126 {
				t.Fatalf("exp(%v) = %v, want %v (subnormal range: within 2^-126)", x, dst[i], want)
			}
			continue
		}
		if rel := math.Abs(float64(dst[i])-want) / want; rel > 3e-7 {
			t.Fatalf("exp(%v) = %v, want %v (relative error %.3g)", x, dst[i], want, rel)
		}
	}
	// In place, with a tail that is not a multiple of 8.
	x := []float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, -1}
	expVec(x, x)
	for i, v := range []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, -1} {
		if rel := math.Abs(float64(x[i])-math.Exp(v)) / math.Exp(v); rel > 3e-7 {
			t.Fatalf("in place exp(%v) = %v", v, x[i])
		}
	}
}
