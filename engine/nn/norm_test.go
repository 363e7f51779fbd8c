package nn

import (
	"slices"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// unfused drops a backend's optional fused ops, so that callers take their fallbacks.
type unfused struct{ backend.Backend }

func (unfused) Optional() backend.Optional { return backend.Optional{} }

// TestRMSNormAddForward checks that the fused residual add + norm (the CPU backend's optional
// AddRMSNorm) gives the values of its fallback, Add then Forward: the summed residual in
// place, the normed output and rstd, in f32 and bf16.
func TestRMSNormAddForward(t *testing.T) {
	const rows, C = 7, 48
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			e := newEnv(t)
			if e.b.Optional().AddRMSNorm == nil {
				t.Fatal("the CPU backend no longer fuses AddRMSNorm: this test compares nothing")
			}
			n := &RMSNorm{Name: "norm", W: e.ones(0.2, C), Eps: 1e-6}
			xs, rs := e.get(e.randn(1, rows, C)), e.get(e.randn(1, rows, C))
			run := func(be backend.Backend) (res, out, rstd []float32) {
				x, err := backend.FromFloat32(e.b, xs, dt, rows, C)
				if err != nil {
					t.Fatal(err)
				}
				r, err := backend.FromFloat32(e.b, rs, dt, rows, C)
				if err != nil {
					t.Fatal(err)
				}
				p := &Pass{B: be, DType: dt}
				o, s, err := n.AddForward(p, x, r)
				if err != nil {
					t.Fatal(err)
				}
				return e.get(r), e.get(o), e.get(s)
			}
			fr, fo, fs := run(e.b)
			ur, uo, us := run(unfused{e.b})
			for _, c := range []struct {
				name      string
				got, want []float32
			}{{"residual", fr, ur}, {"out", fo, uo}, {"rstd", fs, us}} {
				if !slices.Equal(c.got, c.want) {
					t.Errorf("%s: fused %v differs from Add then Forward %v", c.name, c.got[:4], c.want[:4])
				}
			}
			if slices.Equal(fr, rs) {
				t.Error("the residual was not updated in place")
			}
		})
	}
}
