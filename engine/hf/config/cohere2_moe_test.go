package config

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// TestCohere2MoEDefaults: Cohere2MoeConfig() as transformers fills it: the sizes of its
// docstring checkpoint, LayerNorms of 1e-5 (rms_norm_eps null), every fourth layer full
// attention and unrotated, every layer sparse, one norm per layer, tied embeddings.
func TestCohere2MoEDefaults(t *testing.T) {
	c, err := New("cohere2_moe")
	if err != nil {
		t.Fatal(err)
	}
	if c.VocabSize != 256000 || c.HiddenSize != 8192 || c.IntermediateSize != 22528 || c.NumHiddenLayers != 40 ||
		c.NumAttentionHeads != 64 || c.NumKeyValueHeads != 64 || c.HeadDim != 128 || c.MaxPositionEmbeddings != 8192 ||
		c.LogitScale != 0.0625 || c.LayerNormEps != 1e-5 || c.CohereRMSNormEps != 0 || c.RMSNormEps != 1e-5 ||
		*c.PadTokenID != 0 || *c.BOSTokenID != 5 || c.EOSTokenIDs[0] != 255001 || !c.TieWordEmbeddings ||
		c.Rope.Theta != 10000 || c.SlidingWindow != 4096 || c.NumExperts != 8 || c.NumExpertsPerTok != 2 ||
		c.NumSharedExperts != 0 || c.SharedExpertCombinationStrategy != "average" || c.ExpertSelectionFn != "softmax" ||
		c.PrefixDenseSlidingWindowPattern != 1 || !c.NormTopKProb || c.PrefixDenseIntermediateSize != 0 ||
		c.SlidingWindowPattern != 4 {
		t.Errorf("defaults: %+v", c)
	}
	for i := 0; i < c.NumHiddenLayers; i++ {
		full := (i+1)%4 == 0
		if c.IsSlidingLayer(i) == full || c.UsesRoPE(i) == full || !c.IsMoELayer(i) {
			t.Errorf("layer %d: sliding %v, rotated %v, sparse %v; want sliding and rotated %v, sparse", i,
				c.IsSlidingLayer(i), c.UsesRoPE(i), c.IsMoELayer(i), !full)
		}
	}
	s := c.Shape()
	if s.Norms != ParallelNorm || !s.NormCenter || s.NormBias || !s.Tied || s.SharedExpert != 0 || s.Intermediate != 22528 ||
		s.MoELayers != 40 || s.ExpertIntermediate != 22528 {
		t.Errorf("shape %+v", s)
	}
}

// TestCohere2MoEFirstKDense: first_k_dense_replace is consumed (not written back) and decides
// the derived lists: the prefix layers follow prefix_dense_sliding_window_pattern and are dense
// (rotated despite being full attention under pattern 1), the rest follow
// sliding_window_pattern counted from the first sparse layer.
func TestCohere2MoEFirstKDense(t *testing.T) {
	for _, tc := range []struct {
		prefix  int
		layers  []string
		rotated []bool
	}{
		{1, []string{FullAttention, FullAttention, SlidingAttention, FullAttention, SlidingAttention, FullAttention},
			[]bool{true, true, true, false, true, false}},
		{2, []string{SlidingAttention, FullAttention, SlidingAttention, FullAttention, SlidingAttention, FullAttention},
			[]bool{true, false, true, false, true, false}},
	} {
		src := `{"model_type": "cohere2_moe", "num_hidden_layers": 6, "first_k_dense_replace": 2,
			"prefix_dense_sliding_window_pattern": ` + string(rune('0'+tc.prefix)) + `, "sliding_window_pattern": 2,
			"prefix_dense_intermediate_size": 1000}`
		c, err := Parse([]byte(src), "cfg.json")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(c.LayerTypes, tc.layers) {
			t.Errorf("prefix pattern %d: layer_types %v, want %v", tc.prefix, c.LayerTypes, tc.layers)
		}
		if want := []string{"dense", "dense", "sparse", "sparse", "sparse", "sparse"}; !slices.Equal(c.MLPLayerTypes, want) {
			t.Errorf("mlp_layer_types %v, want %v", c.MLPLayerTypes, want)
		}
		for i, want := range tc.rotated {
			if c.UsesRoPE(i) != want {
				t.Errorf("prefix pattern %d layer %d: rotated %v, want %v", tc.prefix, i, c.UsesRoPE(i), want)
			}
		}
		if s := c.Shape(); s.Intermediate != 1000 || s.MoELayers != 4 {
			t.Errorf("shape: dense width %d, %d sparse layers; want 1000, 4", s.Intermediate, s.MoELayers)
		}
		out, err := c.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(out, &m); err != nil {
			t.Fatal(err)
		}
		if _, ok := m["first_k_dense_replace"]; ok {
			t.Error("first_k_dense_replace written back; transformers pops it")
		}
		back, err := Parse(out, "written")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(back.LayerTypes, c.LayerTypes) || !slices.Equal(back.MLPLayerTypes, c.MLPLayerTypes) {
			t.Errorf("written file reads back as %v / %v", back.LayerTypes, back.MLPLayerTypes)
		}
		for i := range tc.rotated {
			if back.UsesRoPE(i) != c.UsesRoPE(i) {
				t.Errorf("layer %d rotation changed by the round trip", i)
			}
		}
	}
}

// TestCohere2MoEWritesTransformersKeys: the written file holds every key of
// Cohere2MoeConfig, the nullable ones (rms_norm_eps, prefix_dense_intermediate_size) as null
// by default; rms_norm_eps set turns the norms into RMSNorms of it.
func TestCohere2MoEWritesTransformersKeys(t *testing.T) {
	c, err := New("cohere2_moe")
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range c.Family().Keys {
		if _, ok := m[k]; !ok {
			t.Errorf("key %s not written", k)
		}
	}
	for _, k := range []string{"rms_norm_eps", "prefix_dense_intermediate_size"} {
		if string(m[k]) != "null" {
			t.Errorf("%s written as %s, want null", k, m[k])
		}
	}
	for k, want := range map[string]string{"logit_scale": "0.0625", "layer_norm_eps": "1e-05", "sliding_window_pattern": "4",
		"expert_selection_fn": `"softmax"`, "shared_expert_combination_strategy": `"average"`} {
		if string(m[k]) != want {
			t.Errorf("%s written as %s, want %s", k, m[k], want)
		}
	}
	// rope_theta, a field of Cohere2MoeConfig, is written beside rope_parameters with its value.
	th, err := Parse([]byte(`{"model_type": "cohere2_moe", "rope_theta": 50000.0}`), "cfg.json")
	if err != nil {
		t.Fatal(err)
	}
	tout, err := th.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var tm struct {
		Theta float64 `json:"rope_theta"`
		Rope  struct {
			Theta float64 `json:"rope_theta"`
		} `json:"rope_parameters"`
	}
	if err := json.Unmarshal(tout, &tm); err != nil {
		t.Fatal(err)
	}
	if tm.Theta != 50000 || tm.Rope.Theta != 50000 {
		t.Errorf("rope_theta written as %v, rope_parameters.rope_theta %v; want 50000 both", tm.Theta, tm.Rope.Theta)
	}
	back, err := Parse(tout, "written")
	if err != nil {
		t.Fatal(err)
	}
	if back.Rope.Theta != 50000 {
		t.Errorf("written file reads back with theta %v", back.Rope.Theta)
	}
	r, err := Parse([]byte(`{"model_type": "cohere2_moe", "rms_norm_eps": 1e-6, "layer_norm_eps": 1e-3}`), "cfg.json")
	if err != nil {
		t.Fatal(err)
	}
	if s := r.Shape(); s.NormCenter || r.RMSNormEps != 1e-6 || r.CohereRMSNormEps != 1e-6 {
		t.Errorf("rms_norm_eps 1e-6: centred %v, eps %g", s.NormCenter, r.RMSNormEps)
	}
}

// TestCohere2MoEParameters: the tiny preset's count from the shapes of transformers' modules.
func TestCohere2MoEParameters(t *testing.T) {
	c, err := Preset("cohere2_moe", "tiny")
	if err != nil {
		t.Fatal(err)
	}
	h, v, q, kv := int64(64), int64(256), int64(64), int64(32)
	attn := h*q + 2*h*kv + q*h
	// tied embeddings, the final norm; per layer attention, one norm, a router, 8 experts of
	// 32 and a shared expert of 1 x 32.
	want := v*h + h + 2*(attn+h+h*8+8*3*h*32+3*h*32)
	if got := c.NumParameters(); got != want {
		t.Errorf("tiny: %d parameters, want %d", got, want)
	}
	if !slices.Equal(c.LayerTypes, []string{SlidingAttention, FullAttention}) {
		t.Errorf("tiny layer_types %v", c.LayerTypes)
	}
}

// TestCohere2MoERefusals: keys the family does not have and values transformers rejects or
// the model does not implement are errors naming the key.
func TestCohere2MoERefusals(t *testing.T) {
	for _, tc := range []struct{ file, key string }{
		{`{"use_qk_norm": true}`, `key "use_qk_norm" is not a cohere2_moe key`},
		{`{"output_router_logits": true}`, `key "output_router_logits" is not a cohere2_moe key`},
		{`{"expert_selection_fn": "softplus"}`, "expert_selection_fn"},
		{`{"shared_expert_combination_strategy": "max"}`, "shared_expert_combination_strategy"},
		{`{"num_hidden_layers": 2, "mlp_layer_types": ["dense"]}`, "mlp_layer_types has 1 entries"},
		{`{"num_hidden_layers": 2, "mlp_layer_types": ["dense", "moe"]}`, `mlp_layer_types[1] is "moe"`},
		{`{"sliding_window_pattern": 0}`, "sliding_window_pattern (0) must be at least 1"},
		{`{"prefix_dense_sliding_window_pattern": 0}`, "prefix_dense_sliding_window_pattern (0)"},
		{`{"logit_scale": 0.0}`, "logit_scale 0"},
		{`{"first_k_dense_replace": "two"}`, "first_k_dense_replace"},
		{`{"num_hidden_layers": 2, "first_k_dense_replace": 3}`, "first_k_dense_replace (3)"},
		{`{"num_shared_experts": -1}`, "num_shared_experts (-1)"},
		{`{"layer_norm_eps": 0.0}`, "layer_norm_eps (0)"},
		{`{"rms_norm_eps": 2.0}`, "rms_norm_eps (2)"},
		{`{"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}`, "partial_rotary_factor 0.5"},
	} {
		src := `{"model_type": "cohere2_moe", ` + strings.TrimPrefix(tc.file, "{")
		if _, err := Parse([]byte(src), "cfg.json"); err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%s: %v, want an error naming %s", tc.file, err, tc.key)
		}
	}
}
