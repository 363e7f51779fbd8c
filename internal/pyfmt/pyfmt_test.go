package pyfmt

import (
	"math"
	"testing"
)

// TestFloatRepr checks values against what Python 3 prints for repr(float).
func TestFloatRepr(t *testing.T) {
	for _, tc := range []struct {
		f    float64
		want string
	}{
		{0, "0.0"}, {math.Copysign(0, -1), "-0.0"}, {1, "1.0"}, {-2.5, "-2.5"},
		{0.1, "0.1"}, {1e-4, "0.0001"}, {1e-5, "1e-05"}, {1.5e-7, "1.5e-07"},
		{1e15, "1000000000000000.0"}, {1e16, "1e+16"}, {123456789.125, "123456789.125"},
		{1e6, "1000000.0"}, {500000.0, "500000.0"}, {2.0 / 3, "0.6666666666666666"},
		{1.7976931348623157e308, "1.7976931348623157e+308"}, {5e-324, "5e-324"},
		{math.NaN(), "nan"}, {math.Inf(1), "inf"}, {math.Inf(-1), "-inf"},
	} {
		if got := FloatRepr(tc.f); got != tc.want {
			t.Errorf("FloatRepr(%v) = %q, want %q", tc.f, got, tc.want)
		}
	}
}
