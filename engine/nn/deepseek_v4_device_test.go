package nn

import "testing"

// TestDevTapeReleasesValuesDuringBackward: once Backward has run, the tape holds none of the
// values and gradients its ops made (each released when its producer's backward ran), before
// Close; only what was handed to it with Own stays until Close.
func TestDevTapeReleasesValuesDuringBackward(t *testing.T) {
	e := newEnv(t)
	x := e.randn(1, 6, 8)
	w1, g1 := e.randn(0.3, 10, 8), e.zeros(10, 8)
	w2, g2 := e.randn(0.3, 4, 10), e.zeros(4, 10)
	base := e.b.MemStats().Allocated
	tape := NewDevTape(e.b, true)
	in := &DVar{V: x}
	h, err := tape.linear(in, tape.Leaf(w1, g1), nil)
	if err != nil {
		t.Fatal(err)
	}
	y, err := tape.linear(h, tape.Leaf(w2, g2), nil)
	if err != nil {
		t.Fatal(err)
	}
	gy, err := tape.Grad(y)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.b.Fill(gy, 1); err != nil {
		t.Fatal(err)
	}
	if held := e.b.MemStats().Allocated - base; held <= 0 {
		t.Fatalf("the forward holds %d bytes: nothing to release", held)
	}
	if err := tape.Backward(); err != nil {
		t.Fatal(err)
	}
	// The input's gradient is the only value left: x is not the tape's, its gradient is.
	if held, want := e.b.MemStats().Allocated-base, int64(in.G.Bytes()); held != want {
		t.Errorf("after Backward the tape holds %d bytes, want the input gradient's %d", held, want)
	}
	if err := tape.Close(); err != nil {
		t.Fatal(err)
	}
	if held := e.b.MemStats().Allocated - base; held != 0 {
		t.Errorf("after Close %d bytes are left", held)
	}
}
