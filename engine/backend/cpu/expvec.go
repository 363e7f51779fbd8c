package cpu

import "math"

// Clamp limits of expVec: exp(88) is finite in float32, and below -88.37 the result is under
// the smallest normal float32, where expVec returns 0 (between about -87.3 and -88.37 results
// are subnormal and may be rounded coarsely).
const (
	expHi = 88.0
	expLo = -88.3762626647949
)

// expScalar is the scalar form of expVec.
func expScalar(x float32) float32 {
	switch {
	case x != x:
		return x
	case x > expHi:
		x = expHi
	case x < expLo:
		return 0
	}
	return float32(math.Exp(float64(x)))
}
