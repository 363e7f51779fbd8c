package cuda

import (
	"fmt"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestGPUGeGLU compares GeGLU, forward and in-place backward, with the CPU backend at an even
// and an odd width, in bf16 and f32.
func TestGPUGeGLU(t *testing.T) {
	g := gpu(t)
	for _, s := range []struct {
		N, F int
		dt   tensor.DType
	}{{64, 256, tensor.BF16}, {37, 3001, tensor.F32}, {5, 1153, tensor.BF16}} {
		rel := 2 * bf16Eps
		if s.dt == tensor.F32 {
			rel = 1e-5
		}
		fwd := opCase{
			Name: fmt.Sprintf("geglu/%s/N%d_F%d", s.dt, s.N, s.F),
			Tensors: []tspec{
				{Name: "gate", DType: s.dt, Shape: []int{s.N, s.F}, Gen: gen{Scale: 3}},
				{Name: "up", DType: s.dt, Shape: []int{s.N, s.F}, Gen: gen{Scale: 1}},
				{Name: "out", DType: s.dt, Shape: []int{s.N, s.F}, Out: true, AbsFrac: 1e-4, Rel: rel},
			},
			Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
				return be.GeGLU(ts["out"], ts["gate"], ts["up"])
			},
		}
		t.Run(fwd.Name, func(t *testing.T) { runCase(t, g, fwd) })
		bwd := opCase{
			Name: fmt.Sprintf("geglu_backward/%s/N%d_F%d", s.dt, s.N, s.F),
			Tensors: []tspec{
				{Name: "gate", DType: s.dt, Shape: []int{s.N, s.F}, Gen: gen{Scale: 3}, Out: true, AbsFrac: 1e-4, Rel: rel},
				{Name: "up", DType: s.dt, Shape: []int{s.N, s.F}, Gen: gen{Scale: 1}, Out: true, AbsFrac: 1e-4, Rel: rel},
				{Name: "dout", DType: s.dt, Shape: []int{s.N, s.F}, Gen: gen{Scale: 1}},
			},
			Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
				return be.GeGLUBackward(ts["gate"], ts["up"], ts["dout"], ts["gate"], ts["up"])
			},
		}
		t.Run(bwd.Name, func(t *testing.T) { runCase(t, g, bwd) })
	}
}

// TestGPUCrossEntropySoftcap compares the fused LM head and loss with final-logit softcapping
// (a cap small enough to bend the logits, and Gemma's 30) with the CPU backend, at a vocabulary
// that is a multiple of 4 (vector path) and one that is not.
func TestGPUCrossEntropySoftcap(t *testing.T) {
	g := gpu(t)
	for _, s := range []struct {
		N, C, V, chunk int
		softcap        float32
	}{{40, 64, 1000, 16, 2}, {33, 96, 3001, 0, 30}} {
		targets := ints(s.N, func(i int) int32 {
			if i%5 == 2 {
				return backend.IgnoreIndex
			}
			return int32((i * 131) % s.V)
		})
		// With bf16 chunk logits (HALO_CE_LOGITS=bf16) each logit carries a rounding of up to
		// 2^-9 of its size before the cap (logits near 15 here: 0.03), as transformers' bf16
		// head does; the loss moves by up to two of those and the softmax's probabilities,
		// so dlogits, by that much relative. The CPU reference keeps fp32 logits.
		lossTol, gradTol := 1e-3, 1e-2
		if backend.CrossEntropyBF16Logits() {
			lossTol, gradTol = 4e-3, 4e-2
		}
		c := opCase{
			Name: fmt.Sprintf("cross_entropy_softcap/bf16/N%d_C%d_V%d_cap%g", s.N, s.C, s.V, s.softcap),
			Tensors: []tspec{
				{Name: "h", DType: tensor.BF16, Shape: []int{s.N, s.C}, Gen: gen{Scale: 1}},
				{Name: "w", DType: tensor.BF16, Shape: []int{s.V, s.C}, Gen: gen{Scale: 0.5}},
				{Name: "targets", DType: tensor.I32, Shape: []int{s.N}, Gen: gen{Ints: targets}},
				{Name: "loss", DType: tensor.F32, Shape: []int{s.N}, Out: true, AbsFrac: lossTol, Rel: 1e-3},
				{Name: "logprob", DType: tensor.F32, Shape: []int{s.N}, Out: true, AbsFrac: lossTol, Rel: 1e-3},
				{Name: "dh", DType: tensor.BF16, Shape: []int{s.N, s.C}, Out: true, AbsFrac: gradTol, Rel: 2 * bf16Eps},
				{Name: "dw", DType: tensor.F32, Shape: []int{s.V, s.C}, Gen: gen{Scale: 0.01}, Out: true, AbsFrac: gradTol, Rel: 2 * bf16Eps},
			},
			Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
				return be.CrossEntropy(backend.CrossEntropyArgs{Hidden: ts["h"], Weight: ts["w"], Targets: ts["targets"], Loss: ts["loss"], LogProb: ts["logprob"],
					DHidden: ts["dh"], DWeight: ts["dw"], GradScale: 1.0 / float32(s.N), ChunkRows: s.chunk, Softcap: s.softcap})
			},
		}
		t.Run(c.Name, func(t *testing.T) { runCase(t, g, c) })
	}
}
