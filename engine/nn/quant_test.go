package nn

import (
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/quant"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// unfusedNF4 is a CPU backend without DequantNF4, to exercise the host fallback.
type unfusedNF4 struct{ backend.Backend }

func (u unfusedNF4) Optional() backend.Optional {
	o := u.Backend.Optional()
	o.DequantNF4 = nil
	return o
}

// TestQuantizedLinear: a Linear with an NF4 base gives exactly the forward output and input
// gradient of a Linear whose W holds the dequantised weight, through the device op and through
// the host fallback, at f32 and bf16; two layers of different sizes share one scratch, which
// grows to the larger weight.
func TestQuantizedLinear(t *testing.T) {
	e := newEnv(t)
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		for _, b := range []backend.Backend{e.b, unfusedNF4{e.b}} {
			scratch := &WeightScratch{}
			p := &Pass{B: b, DType: dt, N: 5, Scratch: scratch}
			shapes := [][2]int{{48, 32}, {16, 48}}
			for _, sh := range shapes {
				o, i := sh[0], sh[1]
				vals := make([]float32, o*i)
				for k := range vals {
					vals[k] = float32(0.05 * e.rng.NormFloat64())
				}
				w, err := quant.QuantizeNF4(vals, []int{o, i}, quant.Options{DoubleQuant: o > 20})
				if err != nil {
					t.Fatal(err)
				}
				bits := make([]uint16, o*i)
				if err := w.DequantizeBF16(bits); err != nil {
					t.Fatal(err)
				}
				deq := make([]float32, o*i)
				for k, v := range bits {
					deq[k] = tensor.BF16ToF32(v)
				}
				qw, err := NewQuantWeight(b, w)
				if err != nil {
					t.Fatal(err)
				}
				ref, err := backend.FromFloat32(b, deq, dt, o, i)
				if err != nil {
					t.Fatal(err)
				}
				plain := &Linear{Name: "plain", W: ref}
				quantised := &Linear{Name: "q", Quant: qw}
				x := toDType(t, b, e.randn(1, p.N, i), dt)
				y1, err := plain.Forward(p, x)
				if err != nil {
					t.Fatal(err)
				}
				y2, err := quantised.Forward(p, x)
				if err != nil {
					t.Fatal(err)
				}
				same(t, b, y1, y2, "forward")
				dy := toDType(t, b, e.randn(1, p.N, o), dt)
				dx1, _ := b.Alloc(dt, p.N, i)
				dx2, _ := b.Alloc(dt, p.N, i)
				if err := plain.Backward(p, dx1, dy, x, false); err != nil {
					t.Fatal(err)
				}
				if err := quantised.Backward(p, dx2, dy, x, false); err != nil {
					t.Fatal(err)
				}
				same(t, b, dx1, dx2, "input gradient")
				quantised.GW = dx1
				if _, err := quantised.Weight(p); err == nil || !strings.Contains(err.Error(), "frozen") {
					t.Errorf("a quantised layer with a gradient: %v", err)
				}
				qw.Free(b)
			}
			want := int64(48 * 32 * 2)
			if dt == tensor.F32 {
				want += 48 * 32 * 4
			}
			if got := scratch.Bytes(); got != want {
				t.Errorf("%s: scratch holds %d bytes, want %d (the larger weight only)", dt, got, want)
			}
			if err := scratch.Free(b); err != nil {
				t.Fatal(err)
			}
		}
	}
	l := &Linear{Name: "q", Quant: &QuantWeight{O: 2, I: 2}}
	if _, err := l.Weight(&Pass{B: e.b, DType: tensor.F32}); err == nil || !strings.Contains(err.Error(), "no WeightScratch") {
		t.Errorf("a pass without scratch: %v", err)
	}
}

func toDType(t *testing.T, b backend.Backend, x T, dt tensor.DType) T {
	t.Helper()
	if dt == x.DType() {
		return x
	}
	y, err := b.Alloc(dt, x.Shape()...)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Copy(y, x); err != nil {
		t.Fatal(err)
	}
	return y
}

func same(t *testing.T, b backend.Backend, a, c T, what string) {
	t.Helper()
	x, err := backend.ToFloat32(b, a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := backend.ToFloat32(b, c)
	if err != nil {
		t.Fatal(err)
	}
	for i := range x {
		if x[i] != y[i] {
			t.Fatalf("%s differs at %d: %v vs %v", what, i, x[i], y[i])
		}
	}
}
