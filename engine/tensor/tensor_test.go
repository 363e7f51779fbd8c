package tensor

import (
	"math"
	"math/big"
	"strings"
	"testing"
)

// refRound rounds f to a float with the given significand bits (including the implicit one),
// minimum normal exponent and maximum finite value, ties to even, using exact arithmetic; it is
// the reference for F32ToBF16 and F32ToF16.
func refRound(f float32, sigBits uint, minExp int, maxFinite float64) float64 {
	x := float64(f)
	if math.IsNaN(x) || math.IsInf(x, 0) || x == 0 {
		return x
	}
	exp := math.Ilogb(x)
	if exp < minExp {
		exp = minExp // subnormal range: fixed quantum
	}
	quantum := math.Ldexp(1, exp-int(sigBits)+1)
	q := new(big.Float).SetPrec(200).Quo(big.NewFloat(x), big.NewFloat(quantum))
	fl, _ := q.Float64() // exact: x/quantum has at most 24+ bits
	r := math.RoundToEven(fl) * quantum
	if math.Abs(r) > maxFinite {
		// IEEE: overflow to Inf when the rounded magnitude exceeds the largest finite value.
		return math.Copysign(math.Inf(1), x)
	}
	return r
}

func TestF32ToBF16RoundsToNearestEven(t *testing.T) {
	maxBF16 := float64(math.Float32frombits(0x7f7f0000))
	for _, tc := range []struct {
		in   float32
		want uint16
	}{
		{1, 0x3f80},
		{math.Float32frombits(0x3f808000), 0x3f80}, // tie, even stays
		{math.Float32frombits(0x3f818000), 0x3f82}, // tie, odd rounds up
		{math.Float32frombits(0x3f808001), 0x3f81}, // above tie
		{float32(math.Inf(-1)), 0xff80},
		{math.MaxFloat32, 0x7f80}, // rounds up to Inf
		{float32(math.Copysign(0, -1)), 0x8000},
	} {
		if got := F32ToBF16(tc.in); got != tc.want {
			t.Errorf("F32ToBF16(%v) = %#04x, want %#04x", tc.in, got, tc.want)
		}
	}
	if got := F32ToBF16(float32(math.NaN())); BF16ToF32(got) == BF16ToF32(got) {
		t.Errorf("NaN converted to %#04x, not a NaN", got)
	}
	// Sweep: every 2^-7 step of the exponent range against the exact reference.
	for u := uint32(0); u < 0x7f800000; u += 0x3fff1 {
		f := math.Float32frombits(u)
		want := refRound(f, 8, -126, maxBF16)
		if got := float64(BF16ToF32(F32ToBF16(f))); got != want {
			t.Fatalf("bf16(%g = %#08x) = %g, want %g", f, u, got, want)
		}
	}
}

func TestF16RoundTripAndRounding(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := F16ToF32(uint16(h))
		if f != f {
			if back := F32ToF16(f); F16ToF32(back) == F16ToF32(back) {
				t.Fatalf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		}
		if back := F32ToF16(f); back != uint16(h) {
			t.Fatalf("f16 %#04x -> %g -> %#04x", h, f, back)
		}
	}
	for u := uint32(0); u < 0x7f800000; u += 0x1fff3 {
		f := math.Float32frombits(u)
		want := refRound(f, 11, -14, 65504)
		if got := float64(F16ToF32(F32ToF16(f))); got != want {
			t.Fatalf("f16(%g = %#08x) = %g, want %g", f, u, got, want)
		}
		if got := float64(F16ToF32(F32ToF16(-f))); got != -want {
			t.Fatalf("f16(%g) = %g, want %g", -f, got, -want)
		}
	}
}

func TestStochasticRoundingIsUnbiased(t *testing.T) {
	x := float32(1.0 + 3.0/1024) // between bf16 neighbours 1 and 1+1/128, 3/8 of the way up
	var sum float64
	const n = 1 << 16
	for i := uint32(0); i < n; i++ {
		r := i * 2654435761 // spreads the low 16 bits over [0, 2^16)
		v := F32ToBF16Stochastic(x, r)
		if v != 0x3f80 && v != 0x3f81 {
			t.Fatalf("rounded to %#04x, not a neighbour of %v", v, x)
		}
		sum += float64(BF16ToF32(v))
	}
	if d := math.Abs(sum/n - float64(x)); d > 1e-5 {
		t.Fatalf("mean of stochastic rounding %v, want %v", sum/n, x)
	}
	if F32ToBF16Stochastic(float32(math.Inf(1)), 0xffff) != 0x7f80 {
		t.Fatal("Inf does not stay Inf")
	}
	if F32ToBF16Stochastic(1, 0xffff) != 0x3f80 {
		t.Fatal("an exactly representable value moved")
	}
}

func TestDTypeNamesAndSizes(t *testing.T) {
	for _, tc := range []struct {
		d    DType
		name string
		size int
	}{{F32, "f32", 4}, {BF16, "bf16", 2}, {F16, "f16", 2}, {I32, "i32", 4}, {I64, "i64", 8}, {U8, "u8", 1}} {
		if tc.d.String() != tc.name || tc.d.Size() != tc.size {
			t.Errorf("%v: name %q size %d, want %q %d", tc.d, tc.d.String(), tc.d.Size(), tc.name, tc.size)
		}
		for _, s := range []string{tc.name, strings.ToUpper(tc.name)} {
			if got, err := ParseDType(s); err != nil || got != tc.d {
				t.Errorf("ParseDType(%q) = %v, %v", s, got, err)
			}
		}
	}
	if _, err := ParseDType("float8"); err == nil || !strings.Contains(err.Error(), "float8") {
		t.Errorf("ParseDType(float8) error = %v", err)
	}
	if Invalid.Valid() || DType(200).Size() != 0 {
		t.Error("invalid dtypes report as valid")
	}
}

type fakeBuf int64

func (f fakeBuf) Len() int64     { return int64(f) }
func (f fakeBuf) Device() string { return "fake" }

func TestTensorViews(t *testing.T) {
	x, err := New(fakeBuf(1000), 8, F32, 4, 6)
	if err != nil {
		t.Fatal(err)
	}
	r, err := x.Rows(1, 3)
	if err != nil || !r.Shape().Equal(Shape{2, 6}) || r.Offset() != 8+24 {
		t.Fatalf("Rows(1,3) = %v offset %d, %v", r, r.Offset(), err)
	}
	v, err := x.View(5, 3, 2)
	if err != nil || v.Offset() != 8+20 || v.Bytes() != 24 {
		t.Fatalf("View(5, 3, 2) = %v offset %d, %v", v, v.Offset(), err)
	}
	if !SameBuffer(r, v) {
		t.Fatal("overlapping views not detected")
	}
	if w, _ := x.View(20, 4); SameBuffer(w, r) {
		t.Fatal("disjoint views reported as overlapping")
	}
	y, err := x.Reshape(-1, 3)
	if err != nil || !y.Shape().Equal(Shape{8, 3}) {
		t.Fatalf("Reshape(-1, 3) = %v, %v", y, err)
	}
	for _, bad := range []func() error{
		func() error { _, err := x.Rows(3, 5); return err },
		func() error { _, err := x.View(20, 5); return err },
		func() error { _, err := x.Reshape(-1, 5); return err },
		func() error { _, err := x.Reshape(-1, -1); return err },
		func() error { _, err := New(fakeBuf(10), 0, F32, 3); return err },
		func() error { _, err := New(fakeBuf(10), 0, F32, -1); return err },
		func() error { _, err := New(fakeBuf(1<<62), 0, U8, 1<<30, 1<<30); return err },
	} {
		if bad() == nil {
			t.Error("an invalid view or shape was accepted")
		}
	}
	if (Tensor{}).IsNil() != true || x.IsNil() {
		t.Error("IsNil is wrong")
	}
}

func TestEncodeDecode(t *testing.T) {
	vals := []float32{0, 1, -2.5, 1e-3, 65504}
	for _, dt := range []DType{F32, BF16, F16} {
		raw, err := EncodeFloat32(dt, vals)
		if err != nil {
			t.Fatal(err)
		}
		back, err := DecodeFloat32(dt, raw)
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range vals {
			if math.Abs(float64(back[i]-v)) > 4e-3*math.Abs(float64(v)) {
				t.Errorf("%v: %v -> %v", dt, v, back[i])
			}
		}
	}
	if _, err := DecodeFloat32(F32, []byte{1, 2, 3}); err == nil {
		t.Error("3 bytes decoded as f32")
	}
	ints, err := DecodeInt32(EncodeInt32([]int32{-100, 7}))
	if err != nil || ints[0] != -100 || ints[1] != 7 {
		t.Errorf("int32 round trip: %v %v", ints, err)
	}
}
