package models

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// logprobsOf runs m on ids and returns its logprobs.
func logprobsOf(t *testing.T, m *Model, ids []int32) []float32 {
	t.Helper()
	lp, err := m.Logprobs(ids)
	if err != nil {
		t.Fatal(err)
	}
	return lp
}

func maxDiff(a, b []float32) float64 {
	d := 0.0
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}

// copyParams gives dst every parameter of src (same family and shapes).
func copyParams(t *testing.T, dst, src *Model) {
	t.Helper()
	for _, s := range src.Specs {
		v, err := src.ParamFloat32(s.Name)
		if err == nil {
			err = dst.SetParam(s.Name, v)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// longrope with short factors of 1 and max_position_embeddings equal to the original context
// (attention factor 1) is the default rotary embedding up to that context, and uses its long
// factors past it.
func TestLongRoPESwitchesPastOriginalContext(t *testing.T) {
	long := tinyArch("phi3", func(a *Arch) {
		a.HeadDim = 8
		a.Rope = backend.RoPEConfig{Type: "longrope", Theta: 10000, MaxPositionEmbeddings: 4, OriginalMaxPositionEmbeddings: 4,
			ShortFactor: []float64{1, 1, 1, 1}, LongFactor: []float64{3, 3, 3, 3}}
	})
	plain := tinyArch("phi3", func(a *Arch) { a.HeadDim = 8 })
	b := newCPU()
	ml := newTiny(t, b, long, Options{}, 7)
	mp := newTiny(t, b, plain, Options{}, 7)
	copyParams(t, mp, ml)
	short := []int32{3, 9, 27, 4}
	if d := maxDiff(logprobsOf(t, ml, short), logprobsOf(t, mp, short)); d > 1e-6 {
		t.Errorf("within the original context longrope differs from the default rope by %g", d)
	}
	longer := []int32{3, 9, 27, 4, 8, 1}
	if d := maxDiff(logprobsOf(t, ml, longer), logprobsOf(t, mp, longer)); d < 1e-4 {
		t.Errorf("past the original context longrope's long factors change nothing (%g)", d)
	}
}

// A NoPE layer ignores positions: a one-layer model whose only layer is NoPE gives each token
// the same logprob of the next whatever rotary frequencies it is given, while a rotating layer
// does not.
func TestNoPELayerIgnoresRotary(t *testing.T) {
	ids := []int32{5, 2, 9, 2, 7}
	run := func(nope bool, theta float64) []float32 {
		a := tinyArch("smollm3", func(a *Arch) {
			a.Layers, a.Windows, a.Tied = 1, []int{0}, false
			a.NoRoPE = []bool{nope}
			a.Rope.Theta = theta
		})
		return logprobsOf(t, newTiny(t, newCPU(), a, Options{}, 9), ids)
	}
	if d := maxDiff(run(true, 10000), run(true, 7)); d != 0 {
		t.Errorf("a NoPE layer's output depends on rope_theta (%g)", d)
	}
	if d := maxDiff(run(false, 10000), run(false, 7)); d < 1e-5 {
		t.Errorf("a rotating layer's output does not depend on rope_theta (%g)", d)
	}
}

// Granite's multipliers, each against an identity it implies: logits scaled by s equal the
// logits of a model whose final norm weight is scaled by s; with every multiplier neutral (the
// score scale 1/sqrt(head_dim)) the model is Llama's decoder; an embedding multiplier changes
// the balance of the embeddings against the branches, so the logprobs change.
func TestGraniteMultipliers(t *testing.T) {
	b := newCPU()
	ids := []int32{1, 4, 9, 16, 25, 36}
	scaled := newTiny(t, b, tinyArch("granite", func(a *Arch) { a.LogitScale = 0.25 }), Options{}, 5)
	normed := newTiny(t, b, tinyArch("granite", nil), Options{}, 5)
	copyParams(t, normed, scaled)
	w, _ := normed.ParamFloat32(nameFinalNorm)
	for i := range w {
		w[i] *= 0.25
	}
	if err := normed.SetParam(nameFinalNorm, w); err != nil {
		t.Fatal(err)
	}
	if d := maxDiff(logprobsOf(t, scaled, ids), logprobsOf(t, normed, ids)); d > 1e-5 {
		t.Errorf("logits scaled by 1/logits_scaling differ from a scaled final norm by %g", d)
	}
	neutral := newTiny(t, b, tinyArch("granite", func(a *Arch) { a.EmbedScale, a.ResidualScale, a.AttnScale, a.LogitScale = 1, 1, 0.5, 1 }), Options{}, 5)
	llama := newTiny(t, b, tinyArch("llama", nil), Options{}, 5)
	copyParams(t, llama, neutral)
	if d := maxDiff(logprobsOf(t, neutral, ids), logprobsOf(t, llama, ids)); d > 1e-6 {
		t.Errorf("granite with neutral multipliers differs from llama by %g", d)
	}
	double := newTiny(t, b, tinyArch("granite", func(a *Arch) { a.EmbedScale, a.ResidualScale, a.AttnScale = 2, 1, 0.5 }), Options{}, 5)
	copyParams(t, double, neutral)
	if d := maxDiff(logprobsOf(t, double, ids), logprobsOf(t, neutral, ids)); d < 1e-6 {
		t.Errorf("embedding_multiplier changes nothing (%g)", d)
	}
}

// The fused weights are views: a gradient step on qkv_proj's rows of k changes only k, and
// saving writes qkv_proj and gate_up_proj under their HF names.
func TestFusedWeightsAreHFTensors(t *testing.T) {
	m := newTiny(t, newCPU(), tinyArch("phi3", nil), Options{}, 2)
	names := map[string][]int{}
	for _, s := range m.Specs {
		names[s.Name] = s.Shape
	}
	q, kv := 4*4, 2*4
	for name, want := range map[string][]int{
		"model.layers.0.self_attn.qkv_proj.weight": {q + 2*kv, 16},
		"model.layers.1.mlp.gate_up_proj.weight":   {2 * 24, 16},
	} {
		if got := names[name]; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
			t.Errorf("%s: shape %v, want %v", name, got, want)
		}
	}
	for _, gone := range []string{"model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.gate_proj.weight"} {
		if _, ok := names[gone]; ok {
			t.Errorf("%s exists beside the fused weight", gone)
		}
	}
}

// GLM-4.5-Air's checkpoint carries a multi-token-prediction layer (num_nextn_predict_layers 1,
// at layer index num_hidden_layers): the model is built without it, its weights are reported
// unused, and a save says num_nextn_predict_layers 0, as its weights are not in it.
func TestGLM4MoEMultiTokenPredictionLayerIsLeftOut(t *testing.T) {
	c, err := config.Preset("glm4_moe", "tiny")
	if err != nil {
		t.Fatal(err)
	}
	c.NumNextNPredictLayers = 1
	m, err := New(c, newCPU(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.InitRandom(3); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := m.Save(dir, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	saved, err := config.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if saved.NumNextNPredictLayers != 0 {
		t.Errorf("saved num_nextn_predict_layers %d, want 0", saved.NumNextNPredictLayers)
	}
	// The checkpoint as the Hub has it: the MTP layer's weights beside the model's.
	ts, err := m.WeightTensors(tensor.F32)
	if err != nil {
		t.Fatal(err)
	}
	mtp := "model.layers.2.eh_proj.weight"
	ts = append(ts, safetensors.Tensor{Name: mtp, DType: safetensors.F32, Shape: []int{2}, Load: func() ([]byte, error) { return make([]byte, 8), nil }})
	if _, err := safetensors.SaveCheckpoint(dir, ts, safetensors.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	hub := c.Clone()
	hub.Architectures = []string{"Glm4MoeForCausalLM"}
	if err := hub.Write(dir); err != nil {
		t.Fatal(err)
	}
	back, err := Load(dir, newCPU(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	if !slices.Contains(back.Unused, mtp) {
		t.Errorf("unused tensors %v, want %s among them", back.Unused, mtp)
	}
}

// Dropout that the model code does not implement is refused, naming the key.
func TestUnimplementedDropoutIsRefused(t *testing.T) {
	for _, tc := range []struct{ family, key string }{
		{"granite", "attention_dropout"}, {"phi3", "resid_pdrop"}, {"phi3", "embd_pdrop"}, {"llama", "attention_dropout"},
	} {
		c, err := config.Preset(tc.family, "tiny")
		if err != nil {
			t.Fatal(err)
		}
		if c, err = ApplyOverrides(c, []string{tc.key + "=0.1"}); err != nil {
			t.Fatal(err)
		}
		_, err = New(c, newCPU(), Options{})
		if err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%s %s=0.1: %v, want a refusal naming %s", tc.family, tc.key, err, tc.key)
		}
	}
}
