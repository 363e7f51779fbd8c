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
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// tinyMoE is a two-layer MoE model of family (qwen3_moe, mixtral or olmoe: 16 experts, top-4,
// qwen3_moe's renormalised) in bf16 on be, with weights drawn from seed, so that two backends
// start from the same model.
func tinyMoE(t *testing.T, be backend.Backend, family string, seed uint64) *models.Model {
	t.Helper()
	c, err := config.Preset(family, "tiny")
	if err != nil {
		t.Fatal(err)
	}
	c.VocabSize, c.HiddenSize, c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim = 512, 128, 4, 2, 32
	c.IntermediateSize, c.NumExperts, c.NumExpertsPerTok, c.NumHiddenLayers = 256, 16, 4, 2
	if family == "qwen3_moe" {
		c.MoEIntermediateSize, c.NormTopKProb = 64, true
	} else {
		c.IntermediateSize = 64 // mixtral's and olmoe's experts are intermediate_size wide
	}
	return seededBF16(t, c, be, seed)
}

// TestGPUMoETrainingMatchesCPU trains tiny qwen3_moe, mixtral and olmoe models for a few AdamW
// steps (with the aux loss in the gradient) on the GPU, where every MoE layer takes the device
// path (MoE kernels and grouped GEMMs), and on the CPU backend, from the same weights and
// batches, each with the experts' outputs kept and not kept (HALO_MOE_EXPERT_OUTPUTS): the
// losses must agree within 2e-2 relative at every step (bf16 weights and activations on both,
// different summation orders, routing near-ties allowed to flip), the aux losses within 5e-2
// relative. The GPU steps must wait on the host only for downloads (the loss and the routing
// statistics, after the backward), and the profile must show the router, permute, combine and
// expert GEMM classes.
func TestGPUMoETrainingMatchesCPU(t *testing.T) {
	g := moeGPU(t) // the device path under test
	for _, family := range []string{"qwen3_moe", "mixtral", "olmoe"} {
		for _, outputs := range []string{"recompute", "keep"} {
			t.Run(family+"/"+outputs, func(t *testing.T) {
				t.Setenv("HALO_MOE_EXPERT_OUTPUTS", outputs)
				moeTrainingMatchesCPU(t, g, family)
			})
		}
	}
}

func moeTrainingMatchesCPU(t *testing.T, g *Backend, family string) {
	ref := cpu.New(cpu.Options{})
	defer ref.Close()
	rec := profile.NewRecorder()
	pg := profile.Wrap(g, rec)
	const steps, B, T = 4, 4, 128
	batch := packedBatch(B, T, 512) // each target a fixed function of its token: learnable
	type run struct {
		loss, aux []float64
	}
	train := func(be backend.Backend, onGPU bool) run {
		m := tinyMoE(t, be, family, 7)
		defer m.Close()
		m.SetAuxLossScale(0.01)
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
		var r run
		r.loss, r.aux = trainMoESteps(t, g, rec, be, m, opt, batch, steps, B*T, onGPU, "MoE layers", func() {
			for _, l := range m.MoELayers() {
				if l.GateUp.W.IsNil() || l.Composed {
					t.Fatalf("%s: no stacked expert weights, the device path cannot run", l.Name)
				}
			}
		})
		return r
	}
	want := train(ref, false)
	got := train(pg, true)
	for i := range want.loss {
		if math.Abs(got.loss[i]-want.loss[i]) > 2e-2*math.Abs(want.loss[i]) || math.IsNaN(got.loss[i]) {
			t.Errorf("step %d: loss %.5f on the GPU, %.5f on the CPU", i, got.loss[i], want.loss[i])
		}
		if math.Abs(got.aux[i]-want.aux[i]) > 5e-2*math.Abs(want.aux[i]) {
			t.Errorf("step %d: aux loss %.5f on the GPU, %.5f on the CPU", i, got.aux[i], want.aux[i])
		}
	}
	if want.loss[steps-1] >= want.loss[0] {
		t.Errorf("CPU losses %v do not decrease: the comparison says nothing about training", want.loss)
	}
	report.addCheck("tiny "+t.Name()+" trains on the GPU device path like on the CPU", !t.Failed(),
		fmt.Sprintf("losses GPU %v, CPU %v; aux GPU %v, CPU %v", got.loss, want.loss, got.aux, want.aux))
}

// trainMoESteps runs steps AdamW steps of m on be over batch (tokens target tokens) and returns
// each step's loss and aux loss; check runs before each step's forward. On the GPU (onGPU: be
// is g wrapped with the recorder rec) the steps between the first and the last may make the
// host wait only for downloads, and the last step's profile must show the MoE device path's
// classes (router, permute, combine, expert GEMM); what names the blocks in that error.
func trainMoESteps(t *testing.T, g *Backend, rec *profile.Recorder, be backend.Backend, m *models.Model, opt *optim.AdamW,
	batch models.Batch, steps, tokens int, onGPU bool, what string, check func()) (loss, aux []float64) {
	t.Helper()
	for step := range steps {
		if err := m.ZeroGrads(); err != nil {
			t.Fatal(err)
		}
		if check != nil {
			check()
		}
		var before SyncStats
		if onGPU {
			if step == steps-1 {
				rec.Enable(true, true)
				rec.BeginStep(step)
			}
			before = g.Syncs()
		}
		sum, n, err := m.ForwardBackward(batch, 1/float32(tokens))
		if err != nil {
			t.Fatalf("step %d on %s: %v", step, be.Name(), err)
		}
		if onGPU && step > 0 && step < steps-1 {
			for op, k := range syncDelta(before, g.Syncs()) {
				if op != "Download" {
					t.Fatalf("step %d: the GPU made the host wait in %s (x%d); only downloads after the backward may", step, op, k)
				}
			}
		}
		if err := opt.Step(1e-3, 1); err != nil {
			t.Fatal(err)
		}
		if onGPU && step == steps-1 {
			st, _ := rec.EndStep()
			rec.Enable(false, false)
			seen := map[string]bool{}
			for _, sp := range st.Spans {
				seen[sp.Class] = true
			}
			for _, c := range []string{profile.ClassRouter, profile.ClassPermute, profile.ClassCombine, profile.ClassExpertGEMM} {
				if !seen[c] {
					t.Errorf("the profiled step has no %s span: the %s did not take the device path", c, what)
				}
			}
		}
		loss = append(loss, sum/float64(n))
		aux = append(aux, m.AuxLoss())
	}
	return loss, aux
}

// seededBF16 is c's model in bf16 on be with weights drawn from seed, so that two backends
// start from the same model; the caller closes it.
func seededBF16(t *testing.T, c *config.Config, be backend.Backend, seed uint64) *models.Model {
	t.Helper()
	m, err := models.New(c, be, models.Options{DType: tensor.BF16})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.InitRandom(seed); err != nil {
		m.Close()
		t.Fatal(err)
	}
	return m
}
