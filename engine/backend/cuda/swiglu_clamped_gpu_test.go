package cuda

import (
	"fmt"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestGPUSwiGLUClamped compares gpt-oss's clamped SwiGLU, forward and in-place backward, with
// the CPU backend, on inputs wide enough to hit both clamps.
func TestGPUSwiGLUClamped(t *testing.T) {
	g := gpu(t)
	for _, s := range []struct {
		R, I int
		dt   tensor.DType
	}{{64, 2880, tensor.BF16}, {37, 99, tensor.F32}} {
		rel := 2 * bf16Eps
		if s.dt == tensor.F32 {
			rel = 1e-5
		}
		fwd := opCase{
			Name: fmt.Sprintf("swiglu_clamped/%s/R%d_I%d", s.dt, s.R, s.I),
			Tensors: []tspec{
				{Name: "gu", DType: s.dt, Shape: []int{s.R, 2 * s.I}, Gen: gen{Scale: 6}},
				{Name: "out", DType: s.dt, Shape: []int{s.R, s.I}, Out: true, AbsFrac: 1e-4, Rel: rel},
			},
			Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
				return be.SwiGLUClamped(ts["out"], ts["gu"], 1.702, 7)
			},
		}
		t.Run(fwd.Name, func(t *testing.T) { runCase(t, g, fwd) })
		bwd := opCase{
			Name: fmt.Sprintf("swiglu_clamped_backward/%s/R%d_I%d", s.dt, s.R, s.I),
			Tensors: []tspec{
				{Name: "gu", DType: s.dt, Shape: []int{s.R, 2 * s.I}, Gen: gen{Scale: 6}, Out: true, AbsFrac: 1e-4, Rel: rel},
				{Name: "dout", DType: s.dt, Shape: []int{s.R, s.I}, Gen: gen{Scale: 1}},
			},
			Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
				return be.SwiGLUClampedBackward(ts["gu"], ts["dout"], ts["gu"], 1.702, 7)
			},
		}
		t.Run(bwd.Name, func(t *testing.T) { runCase(t, g, bwd) })
	}
}
