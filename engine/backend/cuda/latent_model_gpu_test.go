package cuda

import (
	"fmt"
	"math"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// latentGPUCases are tiny latent-attention models at the real families' head widths, so the
// attention op runs at DeepSeek-V3's padded width 192 (128 + 64 query/key dims, 128 value dims)
// and GLM-4.7-Flash's 256 (192 + 64, and 256), with the sigmoid router over expert groups on
// the MoE device path.
var latentGPUCases = []struct {
	name, family string
	set          func(c *config.Config)
}{
	{"deepseek_v3_d192", "deepseek_v3", func(c *config.Config) {
		c.QLoRARank, c.KVLoRARank, c.QKNopeHeadDim, c.QKRopeHeadDim, c.VHeadDim = 48, 64, 128, 64, 128
	}},
	{"glm4_moe_lite_d256", "glm4_moe_lite", func(c *config.Config) {
		c.QLoRARank, c.KVLoRARank, c.QKNopeHeadDim, c.QKRopeHeadDim, c.VHeadDim = 0, 64, 192, 64, 256
		c.RopeInterleave = false
	}},
}

func latentModel(t *testing.T, be backend.Backend, family string, set func(*config.Config), dt tensor.DType) *models.Model {
	t.Helper()
	c, err := config.Preset(family, "tiny")
	if err != nil {
		t.Fatal(err)
	}
	c.VocabSize, c.HiddenSize, c.NumAttentionHeads, c.NumKeyValueHeads = 512, 128, 2, 2
	c.IntermediateSize, c.MoEIntermediateSize, c.NumExperts, c.NumExpertsPerTok = 256, 64, 8, 2
	c.InitializerRange = 0.05
	set(c)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	m, err := models.New(c, be, models.Options{DType: dt})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.InitRandom(3); err != nil {
		m.Close()
		t.Fatal(err)
	}
	return m
}

// TestGPULatentModelsMatchCPU runs the latent-attention families' forward and backward on the
// GPU and on the CPU backend from the same weights: in float32 the loss within 1e-5 relative
// and every gradient within 1e-3 relative (of the tensor's largest entry); in bfloat16 the loss
// within 2e-2 relative.
func TestGPULatentModelsMatchCPU(t *testing.T) {
	g := moeGPU(t)
	ref := cpu.New(cpu.Options{})
	defer ref.Close()
	batch := packedBatch(2, 64, 512)
	for _, tc := range latentGPUCases {
		for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
			t.Run(tc.name+"/"+dt.String(), func(t *testing.T) {
				run := func(be backend.Backend) (float64, map[string][]float32) {
					m := latentModel(t, be, tc.family, tc.set, dt)
					defer m.Close()
					if err := m.ZeroGrads(); err != nil {
						t.Fatal(err)
					}
					sum, n, err := m.ForwardBackward(batch, 1/float32(len(batch.Tokens)))
					if err != nil {
						t.Fatalf("%s: %v", be.Name(), err)
					}
					grads := map[string][]float32{}
					for _, s := range m.Specs {
						if grads[s.Name], err = m.GradFloat32(s.Name); err != nil {
							t.Fatal(err)
						}
					}
					return sum / float64(n), grads
				}
				wantLoss, wantGrads := run(ref)
				gotLoss, gotGrads := run(g)
				tol := 1e-5
				if dt == tensor.BF16 {
					tol = 2e-2
				}
				if math.Abs(gotLoss-wantLoss) > tol*math.Abs(wantLoss) || math.IsNaN(gotLoss) {
					t.Fatalf("loss %.7f on the GPU, %.7f on the CPU", gotLoss, wantLoss)
				}
				if dt != tensor.F32 {
					return
				}
				for name, w := range wantGrads {
					scale := 0.0
					for _, v := range w {
						scale = math.Max(scale, math.Abs(float64(v)))
					}
					for i, v := range gotGrads[name] {
						if d := math.Abs(float64(v - w[i])); d > 1e-3*scale || math.IsNaN(float64(v)) {
							t.Errorf("%s[%d] = %g on the GPU, %g on the CPU (scale %.3g)", name, i, v, w[i], scale)
							break
						}
					}
				}
				report.addCheck(fmt.Sprintf("latent attention %s f32 matches the CPU", tc.name), !t.Failed(),
					fmt.Sprintf("loss GPU %.7f, CPU %.7f", gotLoss, wantLoss))
			})
		}
	}
}
