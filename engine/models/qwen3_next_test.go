package models

import (
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// tinyLinearModel builds the tiny preset of a gated delta-net family on the CPU with every
// parameter random and non-trivial, and the aux loss off (so the loss is the cross-entropy
// alone). Every token uses every expert, so the loss is smooth in the parameters (no routing
// decision to flip under a finite difference).
func tinyLinearModel(t *testing.T, family string, edit func(*config.Config)) *Model {
	t.Helper()
	c, err := config.Preset(family, "tiny")
	if err != nil {
		t.Fatal(err)
	}
	c.VocabSize, c.HiddenSize, c.HeadDim = 41, 24, 8
	c.NumAttentionHeads, c.NumKeyValueHeads = 2, 1
	c.LinearKeyHeadDim, c.LinearValueHeadDim = 5, 3
	c.NumExperts, c.NumExpertsPerTok, c.MoEIntermediateSize, c.SharedExpertIntermediateSize = 4, 4, 8, 10
	c.Rope.PartialRotaryFactor = 0.5
	c.LinearConvKernelDim = 3
	c.InitializerRange = 0.1
	if edit != nil {
		edit(c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	m, err := New(c, newCPU(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if err := m.InitRandom(3); err != nil {
		t.Fatal(err)
	}
	perturb(t, m, 3)
	m.SetAuxLossScale(0)
	return m
}

func batchLoss(t *testing.T, m *Model, b Batch) float64 {
	t.Helper()
	lp, err := m.TokenLogprobs(b)
	if err != nil {
		t.Fatal(err)
	}
	l := 0.0
	for i, v := range lp {
		if b.Targets[i] >= 0 {
			l -= float64(v)
		}
	}
	return l
}

// TestGatedDeltaNetGradientsMatchFiniteDifferences checks the backward of both gated
// delta-net families, parameter by parameter: the gradient along a random direction equals
// the central finite difference of the summed loss over two packed documents longer than the
// conv kernel. Each parameter of a linear layer and of a gated attention layer is checked.
func TestGatedDeltaNetGradientsMatchFiniteDifferences(t *testing.T) {
	for _, family := range []string{"qwen3_next", "qwen3_5_moe_text"} {
		t.Run(family, func(t *testing.T) {
			m := tinyLinearModel(t, family, nil)
			batch := packedBatch(m.Arch.Vocab, []int{7, 9}, 5)
			if err := m.ZeroGrads(); err != nil {
				t.Fatal(err)
			}
			if _, _, err := m.ForwardBackward(batch, 1); err != nil {
				t.Fatal(err)
			}
			grads := allGrads(t, m)
			rng := rand.New(rand.NewPCG(11, 12))
			checked := 0
			for _, s := range m.Specs {
				if !strings.Contains(s.Name, "layers.0.") && !strings.Contains(s.Name, "layers.1.self_attn") {
					continue
				}
				if strings.Contains(s.Name, "mlp.") {
					continue // the experts have their own tests
				}
				theta, err := m.ParamFloat32(s.Name)
				if err != nil {
					t.Fatal(err)
				}
				// A unit direction: a small step, so that no routing decision flips.
				dir := make([]float32, len(theta))
				norm := 0.0
				for i := range dir {
					dir[i] = float32(rng.NormFloat64())
					norm += float64(dir[i]) * float64(dir[i])
				}
				dot := 0.0
				for i := range dir {
					dir[i] /= float32(math.Sqrt(norm))
					dot += float64(dir[i]) * float64(grads[s.Name][i])
				}
				const h = 1e-2
				loss := func(sign float64) float64 {
					v := make([]float32, len(theta))
					for i := range v {
						v[i] = theta[i] + float32(sign*h)*dir[i]
					}
					if err := m.SetParam(s.Name, v); err != nil {
						t.Fatal(err)
					}
					return batchLoss(t, m, batch)
				}
				fd := (loss(1) - loss(-1)) / (2 * h)
				if err := m.SetParam(s.Name, theta); err != nil {
					t.Fatal(err)
				}
				if math.Abs(fd-dot) > 0.02*math.Abs(dot)+2e-3 {
					t.Errorf("%s: gradient along a random direction %.6g, finite difference %.6g", s.Name, dot, fd)
				}
				checked++
			}
			if checked < 10 {
				t.Fatalf("only %d parameters checked", checked)
			}
		})
	}
}

// TestGatedDeltaNetDocumentsAreIndependent checks that neither the conv nor the recurrence
// reaches across a document boundary: a packed batch's logprobs equal each document's alone.
func TestGatedDeltaNetDocumentsAreIndependent(t *testing.T) {
	for _, family := range []string{"qwen3_next", "qwen3_5_moe_text"} {
		t.Run(family, func(t *testing.T) {
			m := tinyLinearModel(t, family, nil)
			packed := packedBatch(m.Arch.Vocab, []int{6, 8}, 9)
			all, err := m.TokenLogprobs(packed)
			if err != nil {
				t.Fatal(err)
			}
			for d := 0; d+1 < len(packed.DocStarts); d++ {
				lo, hi := packed.DocStarts[d], packed.DocStarts[d+1]
				one := Batch{Tokens: packed.Tokens[lo:hi], Positions: packed.Positions[lo:hi], Targets: packed.Targets[lo:hi], DocStarts: []int32{0, hi - lo}}
				lp, err := m.TokenLogprobs(one)
				if err != nil {
					t.Fatal(err)
				}
				if diff := maxAbsDiff(lp, all[lo:hi]); diff > 1e-5 {
					t.Errorf("document %d: logprobs alone differ from packed by %.3g", d, diff)
				}
			}
		})
	}
}

// TestGatedDeltaNetLayersAreBuilt checks the model's structure against config.json: linear
// layers where layer_types says so, q_proj twice the query width, and the parameter count that
// config.Shape (transformers' count) gives.
func TestGatedDeltaNetLayersAreBuilt(t *testing.T) {
	for _, family := range []string{"qwen3_next", "qwen3_5_moe_text"} {
		m := tinyLinearModel(t, family, func(c *config.Config) {
			c.LayerTypes = []string{config.FullAttention, config.LinearAttention, config.LinearAttention, config.FullAttention}
		})
		for i, b := range m.blocks {
			if linear := b.Attn.Linear != nil; linear != (i == 1 || i == 2) {
				t.Errorf("%s layer %d: linear attention %v", family, i, linear)
			}
		}
		q, ok := m.Params.Get("model.layers.0.self_attn.q_proj.weight")
		if !ok || q.Dim(0) != 2*m.Arch.QDim() {
			t.Errorf("%s: q_proj %v, want %d rows (queries and gate)", family, q.Shape(), 2*m.Arch.QDim())
		}
		if got, want := int64(m.NumParams()), m.Config().NumParameters(); got != want {
			t.Errorf("%s: %d parameters, config counts %d", family, got, want)
		}
	}
}

// TestGatedDeltaNetGenerateMatchesUncached: batched greedy decoding, which carries each row's
// recurrent state and conv inputs from step to step and drops finished rows, gives the tokens
// of re-running each whole sequence, and rows do not depend on each other.
func TestGatedDeltaNetGenerateMatchesUncached(t *testing.T) {
	for _, family := range []string{"qwen3_next", "qwen3_5_moe_text"} {
		t.Run(family, func(t *testing.T) {
			m := tinyLinearModel(t, family, func(c *config.Config) { c.NumExpertsPerTok = 2 })
			checkBatchGreedy(t, m)
			checkRowsIndependent(t, m)
		})
	}
}

// TestQwen35LoadsLanguageModelNames: a checkpoint holding the text model under
// model.language_model.* (the vision-language layout), beside a vision tensor, loads as the
// same model, and the vision tensor is reported unused.
func TestQwen35LoadsLanguageModelNames(t *testing.T) {
	m := tinyLinearModel(t, "qwen3_5_moe_text", nil)
	ts, err := m.WeightTensors(tensor.Invalid)
	if err != nil {
		t.Fatal(err)
	}
	for i := range ts {
		if rest, ok := strings.CutPrefix(ts[i].Name, "model."); ok {
			ts[i].Name = "model.language_model." + rest
		}
	}
	ts = append(ts, safetensors.Tensor{Name: "model.visual.patch_embed.proj.bias", DType: ts[0].DType, Shape: []int{1}, Data: make([]byte, ts[0].DType.Size())})
	dir := t.TempDir()
	if _, err := safetensors.SaveCheckpoint(dir, ts, safetensors.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := m.Config().Write(filepath.Join(dir, "config.json")); err != nil {
		t.Fatal(err)
	}
	back, err := Load(dir, newCPU(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	if !slices.Equal(back.Unused, []string{"model.visual.patch_embed.proj.bias"}) {
		t.Errorf("unused %v, want the vision tensor alone", back.Unused)
	}
	ids := []int32{3, 7, 1, 22, 9}
	want, _ := m.Logprobs(ids)
	got, err := back.Logprobs(ids)
	if err != nil {
		t.Fatal(err)
	}
	if d := maxAbsDiff(got, want); d > 0 {
		t.Errorf("logprobs differ by %g after the renamed checkpoint", d)
	}
}
