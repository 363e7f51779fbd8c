package cuda

import (
	"fmt"
	"math"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/optim"
	"github.com/halo-shell/halo-shell/engine/profile"
)

// tinyGemma4MoE is a two-layer gemma4_text model with the MoE block beside every MLP (16 GeGLU
// experts of width 64, top-4) in bf16 on be, with weights drawn from seed.
func tinyGemma4MoE(t *testing.T, be backend.Backend, seed uint64) *models.Model {
	t.Helper()
	c, err := config.Preset("gemma4_text", "tiny")
	if err != nil {
		t.Fatal(err)
	}
	c.VocabSize = 512
	c.EnableMoEBlock, c.NumExperts, c.TopKExperts, c.MoEIntermediateSize = true, 16, 4, 64
	return seededBF16(t, c, be, seed)
}

// TestGPUGemma4MoETrainingMatchesCPU trains a tiny gemma4_text model with the MoE block for a
// few AdamW steps on the GPU, where the block takes its device path (routing with the
// per-expert scale, sort, grouped GEMMs around the packed GeGLU and combine on the device),
// and on the CPU backend, from the same weights and batches, with the experts' outputs kept
// and not kept: the losses must agree within 2e-2 relative at every step (bf16 on both), the
// GPU steps must wait on the host only for downloads, and the profile must show the router,
// permute, combine and expert GEMM classes.
func TestGPUGemma4MoETrainingMatchesCPU(t *testing.T) {
	g := moeGPU(t)
	for _, outputs := range []string{"recompute", "keep"} {
		t.Run(outputs, func(t *testing.T) {
			t.Setenv("HALO_MOE_EXPERT_OUTPUTS", outputs)
			gemma4MoETrainingMatchesCPU(t, g)
		})
	}
}

func gemma4MoETrainingMatchesCPU(t *testing.T, g *Backend) {
	ref := cpu.New(cpu.Options{})
	defer ref.Close()
	rec := profile.NewRecorder()
	pg := profile.Wrap(g, rec)
	const steps, B, T = 4, 4, 128
	batch := packedBatch(B, T, 512)
	train := func(be backend.Backend, onGPU bool) []float64 {
		m := tinyGemma4MoE(t, be, 11)
		defer m.Close()
		if err := m.EnableGrads(); err != nil {
			t.Fatal(err)
		}
		var params []optim.Param
		for i, s := range m.Specs {
			params = append(params, optim.Param{Name: s.Name, Value: m.Params.Views[i], Grad: m.Grads.Views[i], NoDecay: !s.Decay})
		}
		opt, err := optim.NewAdamW(be, params, optim.Config{Mode: optim.MasterF32})
		if err != nil {
			t.Fatal(err)
		}
		defer opt.Free()
		losses, _ := trainMoESteps(t, g, rec, be, m, opt, batch, steps, B*T, onGPU, "MoE blocks", nil)
		return losses
	}
	want := train(ref, false)
	got := train(pg, true)
	for i := range want {
		if math.Abs(got[i]-want[i]) > 2e-2*math.Abs(want[i]) || math.IsNaN(got[i]) {
			t.Errorf("step %d: loss %.5f on the GPU, %.5f on the CPU", i, got[i], want[i])
		}
	}
	if want[steps-1] >= want[0] {
		t.Errorf("CPU losses %v do not decrease: the comparison says nothing about training", want)
	}
	report.addCheck("tiny gemma4_text MoE "+t.Name()+" trains on the GPU device path like on the CPU", !t.Failed(),
		fmt.Sprintf("losses GPU %v, CPU %v", got, want))
}
