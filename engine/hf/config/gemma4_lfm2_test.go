package config

import (
	"slices"
	"strings"
	"testing"
)

// TestGemma4Resolves: without layer_types every sixth layer is full and the last is forced to
// full, as transformers does; the full layers take global_head_dim and, under
// attention_k_eq_v, num_global_key_value_heads; a file's full_attention rope dictionary
// replaces the proportional default whole; the string use_bidirectional_attention and a null
// num_experts are read.
func TestGemma4Resolves(t *testing.T) {
	c, err := Parse([]byte(`{"model_type": "gemma4_text", "num_hidden_layers": 8, "head_dim": 64, "global_head_dim": 128,
		"num_attention_heads": 8, "num_key_value_heads": 4, "num_global_key_value_heads": 2, "attention_k_eq_v": true,
		"num_experts": null, "use_bidirectional_attention": "vision",
		"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5000.0}, "sliding_attention": {"rope_type": "default", "rope_theta": 10.0}}}`), "t")
	if err != nil {
		t.Fatal(err)
	}
	var full []int
	for i, lt := range c.LayerTypes {
		if lt == FullAttention {
			full = append(full, i)
		}
	}
	if !slices.Equal(full, []int{5, 7}) {
		t.Errorf("full layers %v, want [5 7] (every sixth and the last)", full)
	}
	s := c.Shape()
	if hd, kv := s.LayerHeads(5); hd != 128 || kv != 2 {
		t.Errorf("full layer: head_dim %d, kv heads %d; want 128, 2", hd, kv)
	}
	if hd, kv := s.LayerHeads(0); hd != 64 || kv != 4 {
		t.Errorf("sliding layer: head_dim %d, kv heads %d; want 64, 4", hd, kv)
	}
	if c.Rope.Type != "default" || c.Rope.PartialRotaryFactor != 0 || c.Rope.Theta != 5000 {
		t.Errorf("full-layer rope %+v: want the file's dictionary alone", c.Rope)
	}
	if c.Bidirectional != "vision" || c.NumExperts != 0 {
		t.Errorf("use_bidirectional_attention %q, num_experts %d", c.Bidirectional, c.NumExperts)
	}
	d, err := New("gemma4_text")
	if err != nil {
		t.Fatal(err)
	}
	if d.Rope.Type != "proportional" || d.Rope.PartialRotaryFactor != 0.25 || d.SlidingRope.Theta != 1e4 || d.GlobalHead() != 512 {
		t.Errorf("defaults: full rope %+v, sliding %+v, global head %d", d.Rope, d.SlidingRope, d.GlobalHead())
	}
	// per_layer_config's layer indices are ints in transformers: written in numeric order,
	// zero-padded to the width of the largest.
	out, err := d.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	i5, i11, i29 := strings.Index(string(out), `"05": {`), strings.Index(string(out), `"11": {`), strings.Index(string(out), `"29": {`)
	if i5 < 0 || i11 < 0 || i29 < 0 || !(i5 < i11 && i11 < i29) {
		t.Errorf("per_layer_config of the default 30 layers not in numeric order:\n%s", out)
	}
}

// TestLFM2MoEResolves: conv layers are a layer type of lfm2_moe only; the original release's
// tie_embedding is read as tie_word_embeddings and written under that name; the MoE layers
// follow num_dense_layers and the router's bias follows use_expert_bias.
func TestLFM2MoEResolves(t *testing.T) {
	c, err := Parse([]byte(`{"model_type": "lfm2_moe", "num_hidden_layers": 3, "hidden_size": 32, "num_attention_heads": 4,
		"num_key_value_heads": 2, "layer_types": ["conv", "full_attention", "conv"], "num_dense_layers": 1,
		"num_experts": 4, "num_experts_per_tok": 2, "tie_embedding": false}`), "t")
	if err != nil {
		t.Fatal(err)
	}
	s := c.Shape()
	if !s.IsConv(0) || s.IsConv(1) || !s.IsConv(2) || s.MoELayers != 2 || !s.RouterBias || c.TieWordEmbeddings || s.HeadDim != 8 {
		t.Errorf("shape %+v, tied %v", s, c.TieWordEmbeddings)
	}
	out, err := c.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "tie_embedding\"") || !strings.Contains(string(out), `"tie_word_embeddings": false`) {
		t.Errorf("written config:\n%s", out)
	}
	if _, err := Parse([]byte(`{"model_type": "qwen2", "num_hidden_layers": 1, "layer_types": ["conv"]}`), "t"); err == nil || !strings.Contains(err.Error(), `layer_types[0] is "conv"`) {
		t.Errorf("qwen2 with a conv layer: %v", err)
	}
}

// TestGemma4AndLFM2Refusals: unknown keys and bad values are refused, naming the key.
func TestGemma4AndLFM2Refusals(t *testing.T) {
	for _, tc := range []struct{ json, want string }{
		{`{"model_type": "gemma4_text", "rope_local_base_freq": 10000}`, `key "rope_local_base_freq" is not a gemma4_text key`},
		{`{"model_type": "gemma4_text", "use_bidirectional_attention": "some"}`, `use_bidirectional_attention "some"`},
		{`{"model_type": "gemma4_text", "num_hidden_layers": 2, "num_kv_shared_layers": 2}`, "num_kv_shared_layers (2) must be below"},
		{`{"model_type": "gemma4_text", "attention_k_eq_v": true, "num_global_key_value_heads": 3}`, "num_global_key_value_heads (3) must divide"},
		{`{"model_type": "lfm2_moe", "rms_norm_eps": 1e-5}`, `key "rms_norm_eps" is not a lfm2_moe key`},
		{`{"model_type": "lfm2_moe", "conv_L_cache": 0}`, "conv_L_cache (0)"},
		{`{"model_type": "lfm2_moe", "num_hidden_layers": 2, "layer_types": ["conv", "sliding_attention"]}`, `layer_types[1] is "sliding_attention"`},
	} {
		_, err := Parse([]byte(tc.json), "t")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.json, err, tc.want)
		}
	}
}

// TestGemma4PerLayerConfig: a 5.15+ file's per_layer_config gives the full layers' geometry;
// a flat (older) file's global_head_dim and num_global_key_value_heads are written back as
// per_layer_config, as transformers re-saves them; entries the model cannot build are refused.
func TestGemma4PerLayerConfig(t *testing.T) {
	c, err := Parse([]byte(`{"model_type": "gemma4_text", "num_hidden_layers": 4, "head_dim": 16,
		"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size_per_layer_input": 0,
		"layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
		"per_layer_config": {"1": {"head_dim": 48, "num_key_value_heads": 1}, "3": {"head_dim": 48, "num_key_value_heads": 1}}}`), "t")
	if err != nil {
		t.Fatal(err)
	}
	if hd, kv := c.Shape().LayerHeads(3); hd != 48 || kv != 1 {
		t.Errorf("full layer from per_layer_config: head_dim %d, kv heads %d; want 48, 1", hd, kv)
	}
	flat, err := Parse([]byte(`{"model_type": "gemma4_text", "num_hidden_layers": 2, "head_dim": 16, "global_head_dim": 64,
		"num_attention_heads": 4, "num_key_value_heads": 2, "num_global_key_value_heads": 1, "attention_k_eq_v": true,
		"layer_types": ["sliding_attention", "full_attention"]}`), "t")
	if err != nil {
		t.Fatal(err)
	}
	out, err := flat.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "global_head_dim") || !strings.Contains(string(out), `"per_layer_config": {
    "1": {
      "head_dim": 64,
      "num_key_value_heads": 1
    }
  }`) {
		t.Errorf("flat file written as:\n%s", out)
	}
	back, err := Parse(out, "t")
	if err != nil {
		t.Fatal(err)
	}
	if hd, kv := back.Shape().LayerHeads(1); hd != 64 || kv != 1 {
		t.Errorf("re-read: full layer head_dim %d, kv heads %d; want 64, 1", hd, kv)
	}
	for _, tc := range []struct{ per, want string }{
		{`{"0": {"head_dim": 32}}`, "layer 0 (sliding_attention): head_dim 32 differs"},
		{`{"1": {"head_dim": 32}, "3": {"head_dim": 64}}`, "head_dim 32 and 64"},
		{`{"1": {"sliding_window": 3}}`, `"sliding_window" is not supported`},
		{`{"7": {"head_dim": 32}}`, `key "7" is not a layer index`},
		{`{"+1": {"head_dim": 32}}`, `key "+1" is not a layer index`},
	} {
		_, err := Parse([]byte(`{"model_type": "gemma4_text", "num_hidden_layers": 4, "head_dim": 16,
			"layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
			"per_layer_config": `+tc.per+`}`), "t")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("per_layer_config %s: got %v, want an error containing %q", tc.per, err, tc.want)
		}
	}
	// Keys zero-padded as transformers 5.17 writes them name the same layers.
	padded, err := Parse([]byte(`{"model_type": "gemma4_text", "num_hidden_layers": 4, "head_dim": 16,
		"layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
		"per_layer_config": {"01": {"head_dim": 48, "num_key_value_heads": 1}, "03": {"head_dim": 48, "num_key_value_heads": 1}}}`), "t")
	if err != nil {
		t.Fatal(err)
	}
	if hd, kv := padded.Shape().LayerHeads(3); hd != 48 || kv != 1 {
		t.Errorf("zero-padded keys: full layer head_dim %d, kv heads %d; want 48, 1", hd, kv)
	}
}
