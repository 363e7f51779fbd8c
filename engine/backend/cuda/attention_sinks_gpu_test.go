package cuda

import (
	"fmt"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestGPUAttentionSinks compares the sink fold (in place on Out and LSE) and the sinks'
// gradient (+=) with the CPU backend, at gpt-oss's head width and at an odd one, in bf16 and
// f32.
func TestGPUAttentionSinks(t *testing.T) {
	g := gpu(t)
	for _, s := range []struct {
		N, NH, HD int
		dt        tensor.DType
	}{{300, 8, 64, tensor.BF16}, {37, 3, 24, tensor.F32}} {
		rel := 2 * bf16Eps
		if s.dt == tensor.F32 {
			rel = 1e-5
		}
		fwd := opCase{
			Name: fmt.Sprintf("attention_sinks/%s/N%d_NH%d_HD%d", s.dt, s.N, s.NH, s.HD),
			Tensors: []tspec{
				{Name: "out", DType: s.dt, Shape: []int{s.N, s.NH * s.HD}, Gen: gen{Scale: 1}, Out: true, AbsFrac: 1e-4, Rel: rel},
				{Name: "lse", DType: tensor.F32, Shape: []int{s.N, s.NH}, Gen: gen{Scale: 2}, Out: true, AbsFrac: 1e-5, Rel: 1e-5},
				{Name: "sinks", DType: s.dt, Shape: []int{s.NH}, Gen: gen{Scale: 2}},
			},
			Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
				return be.AttentionSinks(ts["out"], ts["lse"], ts["sinks"])
			},
		}
		t.Run(fwd.Name, func(t *testing.T) { runCase(t, g, fwd) })
		bwd := opCase{
			Name: fmt.Sprintf("attention_sinks_backward/%s/N%d_NH%d_HD%d", s.dt, s.N, s.NH, s.HD),
			Tensors: []tspec{
				{Name: "dsinks", DType: s.dt, Shape: []int{s.NH}, Gen: gen{Scale: 1}, Out: true, AbsFrac: 1e-3, Rel: rel},
				{Name: "dout", DType: s.dt, Shape: []int{s.N, s.NH * s.HD}, Gen: gen{Scale: 1}},
				{Name: "out", DType: s.dt, Shape: []int{s.N, s.NH * s.HD}, Gen: gen{Scale: 1}},
				{Name: "lse", DType: tensor.F32, Shape: []int{s.N, s.NH}, Gen: gen{Scale: 2}},
				{Name: "sinks", DType: s.dt, Shape: []int{s.NH}, Gen: gen{Scale: 2}},
			},
			Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
				return be.AttentionSinksBackward(ts["dsinks"], ts["dout"], ts["out"], ts["lse"], ts["sinks"])
			},
		}
		t.Run(bwd.Name, func(t *testing.T) { runCase(t, g, bwd) })
	}
}
