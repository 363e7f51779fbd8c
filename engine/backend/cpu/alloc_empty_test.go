package cpu

import (
	"math"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestEmpty: Alloc is always zero, also when it reuses a freed tensor's storage; Empty reuses it
// as it is, and with PoisonEmpty starts every element as NaN (floats) or -2^31 (I32).
func TestEmpty(t *testing.T) {
	for _, c := range []struct {
		name   string
		poison bool
		dt     tensor.DType
	}{
		{"f32 plain", false, tensor.F32},
		{"f32 poisoned", true, tensor.F32},
		{"bf16 poisoned", true, tensor.BF16},
		{"i32 poisoned", true, tensor.I32},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := New(Options{Workers: 1, PoisonEmpty: c.poison})
			defer b.Close()
			x, err := b.Empty(c.dt, 3, 5)
			if err != nil {
				t.Fatal(err)
			}
			if c.poison {
				assertPoison(t, b, x)
			}
			if err := b.Fill(x, 7); err != nil && c.dt != tensor.I32 {
				t.Fatal(err)
			}
			if err := b.Free(x); err != nil {
				t.Fatal(err)
			}
			z, err := b.Alloc(c.dt, 3, 5) // reuses x's storage
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range values(t, b, z) {
				if v != 0 {
					t.Fatalf("Alloc after a freed tensor: element %d = %v, want 0", i, v)
				}
			}
			if c.poison {
				b.Free(z)
				e, _ := b.Empty(c.dt, 3, 5)
				assertPoison(t, b, e)
			}
		})
	}
}

func values(t *testing.T, b *Backend, x tensor.Tensor) []float64 {
	t.Helper()
	var out []float64
	if x.DType() == tensor.I32 {
		v, err := backend.ToInt32(b, x)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range v {
			out = append(out, float64(e))
		}
		return out
	}
	v, err := backend.ToFloat32(b, x)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range v {
		out = append(out, float64(e))
	}
	return out
}

func assertPoison(t *testing.T, b *Backend, x tensor.Tensor) {
	t.Helper()
	for i, v := range values(t, b, x) {
		bad := !math.IsNaN(v)
		if x.DType() == tensor.I32 {
			bad = v != math.MinInt32
		}
		if bad {
			t.Fatalf("poisoned Empty %s: element %d = %v", x.DType(), i, v)
		}
	}
}

// TestPoisonEmptySwitch: HALO_CPU_POISON_EMPTY=1 poisons Empty without the option.
func TestPoisonEmptySwitch(t *testing.T) {
	t.Setenv("HALO_CPU_POISON_EMPTY", "1")
	b := New(Options{Workers: 1})
	defer b.Close()
	x, err := b.Empty(tensor.F32, 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	assertPoison(t, b, x)
}
