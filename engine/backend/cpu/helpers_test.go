package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// newTestBackend uses 3 workers so chunk scheduling is exercised even on small machines.
func newTestBackend(t testing.TB) *Backend {
	b := New(Options{Workers: 3})
	t.Cleanup(func() { b.Close() })
	return b
}

func randn(r *rand.Rand, n int, scale float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = r.NormFloat64() * scale
	}
	return out
}

func f32s(x []float64) []float32 {
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = float32(v)
	}
	return out
}

// rounded returns x as stored in dt (so references see exactly the tensor's values).
func rounded(x []float64, dt tensor.DType) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		switch dt {
		case tensor.BF16:
			out[i] = float64(tensor.BF16ToF32(tensor.F32ToBF16(float32(v))))
		case tensor.F16:
			out[i] = float64(tensor.F16ToF32(tensor.F32ToF16(float32(v))))
		default:
			out[i] = float64(float32(v))
		}
	}
	return out
}

func up(t testing.TB, b *Backend, x []float64, dt tensor.DType, shape ...int) T {
	t.Helper()
	ts, err := backend.FromFloat32(b, f32s(x), dt, shape...)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

func upInts(t testing.TB, b *Backend, x []int32, shape ...int) T {
	t.Helper()
	ts, err := backend.FromInt32(b, x, shape...)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

func zeros(t testing.TB, b *Backend, dt tensor.DType, shape ...int) T {
	t.Helper()
	ts, err := b.Alloc(dt, shape...)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

func down(t testing.TB, b *Backend, x T) []float64 {
	t.Helper()
	v, err := backend.ToFloat32(b, x)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float64, len(v))
	for i, f := range v {
		out[i] = float64(f)
	}
	return out
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// close checks |got-want| <= atol + rtol*|want| elementwise and reports the worst element.
func approx(t testing.TB, name string, got, want []float64, atol, rtol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", name, len(got), len(want))
	}
	worst, wi := -1.0, -1
	for i := range got {
		d := math.Abs(got[i] - want[i])
		if math.IsNaN(got[i]) || math.IsNaN(d) {
			t.Fatalf("%s[%d] = NaN, want %g", name, i, want[i])
		}
		if ex := d - (atol + rtol*math.Abs(want[i])); ex > 0 && ex > worst {
			worst, wi = ex, i
		}
	}
	if wi >= 0 {
		t.Fatalf("%s[%d] = %.8g, want %.8g (diff %.3g > atol %g + rtol %g*|want|)", name, wi, got[wi], want[wi],
			math.Abs(got[wi]-want[wi]), atol, rtol)
	}
}

// relErr returns |got-want| / |want| over whole vectors.
func relErr(got, want []float64) float64 {
	var num, den float64
	for i := range got {
		num += (got[i] - want[i]) * (got[i] - want[i])
		den += want[i] * want[i]
	}
	return math.Sqrt(num / math.Max(den, 1e-300))
}

// fdGrad returns the central finite-difference gradient of L(x) = sum(g * f(inputs)) with respect
// to inputs[k], in float64, for the reference forward f.
func fdGrad(f func(in [][]float64) []float64, inputs [][]float64, g []float64, k int) []float64 {
	const h = 1e-6
	grad := make([]float64, len(inputs[k]))
	loss := func() float64 {
		out := f(inputs)
		var s float64
		for i := range out {
			s += g[i] * out[i]
		}
		return s
	}
	for i := range inputs[k] {
		old := inputs[k][i]
		inputs[k][i] = old + h
		lp := loss()
		inputs[k][i] = old - h
		lm := loss()
		inputs[k][i] = old
		grad[i] = (lp - lm) / (2 * h)
	}
	return grad
}
