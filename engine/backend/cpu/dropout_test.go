package cpu

import (
	"math"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestDropoutMatchesTheHostMask: the op equals x times backend.DropoutMask through ScaleRows
// (its documented fallback) bit for bit, in f32 and bf16, out of place and in place (a signed
// zero where a negative element is dropped); bad operands are refused.
func TestDropoutMatchesTheHostMask(t *testing.T) {
	b := newTestBackend(t)
	const n, p, seed, key = 3003, 0.3, 17, 4
	xs := make([]float32, n)
	for i := range xs {
		xs[i] = float32(math.Sin(float64(i)*0.7)) * 3
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		for _, inPlace := range []bool{false, true} {
			x, err := backend.FromFloat32(b, xs, dt, n)
			must(t, err)
			out := x
			if !inPlace {
				out, err = b.Alloc(dt, 3, 1000+1) // another shape of the same count
				must(t, err)
			}
			must(t, b.Dropout(backend.DropoutArgs{Out: out, X: x, P: p, Seed: seed, Key: key}))
			ref, err := backend.FromFloat32(b, xs, dt, n, 1)
			must(t, err)
			mask, err := backend.FromFloat32(b, backend.DropoutMask(seed, key, n, p), tensor.F32, n)
			must(t, err)
			must(t, b.ScaleRows(ref, mask))
			got, _ := backend.ToFloat32(b, out)
			want, _ := backend.ToFloat32(b, ref)
			dropped := 0
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%s in place %v: element %d = %v, the host mask gives %v", dt, inPlace, i, got[i], want[i])
				}
				if got[i] == 0 {
					dropped++
				}
			}
			if dropped < n/5 || dropped > n*2/5 {
				t.Errorf("%s: %d of %d dropped at P = %v", dt, dropped, n, p)
			}
		}
	}
	x, _ := b.Alloc(tensor.F32, 4)
	y, _ := b.Alloc(tensor.F32, 5)
	for _, a := range []backend.DropoutArgs{{Out: y, X: x, P: 0.1}, {Out: x, X: x, P: 1}, {Out: x, X: x, P: -0.1}} {
		if err := b.Dropout(a); err == nil {
			t.Errorf("Dropout(%v, P %v) accepted", a.Out, a.P)
		}
	}
}
