package nn

import (
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestFreshGrads: a marked tensor is taken once (the first write of the step), views of one
// buffer are told apart by offset and size, Zero fills only a fresh tensor, and Settle zeroes
// what no write took and empties the set; a nil set has nothing fresh.
func TestFreshGrads(t *testing.T) {
	e := newEnv(t)
	flat, err := e.b.Alloc(tensor.F32, 12)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.b.Fill(flat, 5); err != nil {
		t.Fatal(err)
	}
	a, _ := flat.View(0, 4)
	b, _ := flat.View(4, 4)
	c, _ := flat.View(8, 4)
	wide, _ := flat.View(0, 8) // same offset as a, another size
	var f FreshGrads
	f.Mark(a, b, c, T{})
	if f.Len() != 3 {
		t.Fatalf("Len %d after marking three tensors and a zero one, want 3", f.Len())
	}
	for _, tc := range []struct {
		name string
		t    T
		want bool
	}{{"a", a, true}, {"a again", a, false}, {"wide view at a's offset", wide, false}, {"zero tensor", T{}, false}} {
		if got := f.Take(tc.t); got != tc.want {
			t.Errorf("Take(%s) = %v, want %v", tc.name, got, tc.want)
		}
	}
	if err := f.Zero(e.b, b); err != nil {
		t.Fatal(err)
	}
	if err := f.Zero(e.b, a); err != nil { // already taken: left as it is
		t.Fatal(err)
	}
	if err := f.Settle(e.b); err != nil {
		t.Fatal(err)
	}
	if f.Len() != 0 {
		t.Errorf("Len %d after Settle, want 0", f.Len())
	}
	got, err := backend.ToFloat32(e.b, flat)
	if err != nil {
		t.Fatal(err)
	}
	want := []float32{5, 5, 5, 5, 0, 0, 0, 0, 0, 0, 0, 0}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("buffer after Zero(b), Settle (c still fresh): %v, want %v", got, want)
		}
	}
	var none *FreshGrads
	if none.Take(a) || none.Len() != 0 || none.Settle(e.b) != nil {
		t.Error("a nil FreshGrads must hold nothing and settle without error")
	}
}
