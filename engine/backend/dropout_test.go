package backend

import (
	"math"
	"testing"
)

// TestDropoutStream pins the stream's first values (any change breaks the reproducibility of
// every run with LoRA dropout), checks that it depends on seed, key and element, and that
// DropoutMask drops close to P of the elements and scales the rest by 1/(1-P).
func TestDropoutStream(t *testing.T) {
	h := mix64(mix64(mix64(7)^3) ^ 5)
	if got, want := DropoutBits(7, 3, 5), uint32(h>>32); got != want {
		t.Fatalf("DropoutBits(7, 3, 5) = %#x, want %#x from its definition", got, want)
	}
	if DropoutBits(7, 3, 5) == DropoutBits(8, 3, 5) || DropoutBits(7, 3, 5) == DropoutBits(7, 4, 5) || DropoutBits(7, 3, 5) == DropoutBits(7, 3, 6) {
		t.Fatal("the stream does not depend on each of seed, key and element")
	}
	if DropoutThreshold(0) != 0 || DropoutThreshold(0.5) != 1<<23 || DropoutThreshold(0.05) != 838860 {
		t.Fatalf("thresholds %d %d %d", DropoutThreshold(0), DropoutThreshold(0.5), DropoutThreshold(0.05))
	}
	const n, p = 200000, 0.1
	m := DropoutMask(11, 2, n, p)
	dropped := 0
	for _, v := range m {
		switch v {
		case 0:
			dropped++
		case DropoutScale(p):
		default:
			t.Fatalf("mask value %v: want 0 or %v", v, DropoutScale(p))
		}
	}
	if f := float64(dropped) / n; math.Abs(f-p) > 0.005 {
		t.Errorf("dropped %.4f of the elements, want about %v", f, p)
	}
	for _, v := range DropoutMask(11, 2, 1000, 0) {
		if v != 1 {
			t.Fatalf("P = 0 dropped or scaled an element: %v", v)
		}
	}
}
