package config

import (
	"slices"
	"strings"
	"testing"
)

// gemma31b4x is google/gemma-3-1b-pt's config.json in the 4.x dialect its Hub file uses
// (rope_theta, rope_local_base_freq, rope_scaling null, sliding_window_pattern).
const gemma31b4x = `{
  "architectures": ["Gemma3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "attn_logit_softcapping": null,
  "bos_token_id": 2,
  "cache_implementation": "hybrid",
  "eos_token_id": 1,
  "final_logit_softcapping": null,
  "head_dim": 256,
  "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 1152,
  "initializer_range": 0.02,
  "intermediate_size": 6912,
  "max_position_embeddings": 32768,
  "model_type": "gemma3_text",
  "num_attention_heads": 4,
  "num_hidden_layers": 26,
  "num_key_value_heads": 1,
  "pad_token_id": 0,
  "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06,
  "rope_local_base_freq": 10000,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": 512,
  "sliding_window_pattern": 6,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.50.0.dev0",
  "use_cache": true,
  "vocab_size": 262144
}`

// TestGemma3Dialects: the 4.x file resolves to the same model as the preset, with the two rope
// bases on the two layer types and every 6th layer full; the 5.x file it writes (nested
// rope_parameters, layer_types) reads back to the same bytes.
func TestGemma3Dialects(t *testing.T) {
	c, err := Parse([]byte(gemma31b4x), "gemma-3-1b")
	if err != nil {
		t.Fatal(err)
	}
	if c.Rope.Theta != 1e6 || c.SlidingRope.Theta != 1e4 || c.Rope.Type != "default" || c.SlidingRope.Type != "default" {
		t.Errorf("rope: full %+v, sliding %+v; want theta 1e6 and 1e4, both default", c.Rope, c.SlidingRope)
	}
	if len(c.LayerTypes) != 26 {
		t.Fatalf("layer_types has %d entries, want 26", len(c.LayerTypes))
	}
	for i, lt := range c.LayerTypes {
		want := SlidingAttention
		if (i+1)%6 == 0 {
			want = FullAttention
		}
		if lt != want || c.IsSlidingLayer(i) != (want == SlidingAttention) {
			t.Errorf("layer %d: %s (sliding %v), want %s", i, lt, c.IsSlidingLayer(i), want)
		}
	}
	if c.HiddenAct != "gelu_pytorch_tanh" || c.QueryPreAttnScalar != 256 || c.FinalLogitSoftcapping != 0 {
		t.Errorf("act %q, query_pre_attn_scalar %g, final cap %g", c.HiddenAct, c.QueryPreAttnScalar, c.FinalLogitSoftcapping)
	}
	p, err := Preset("gemma3_text", "gemma-3-1b")
	if err != nil {
		t.Fatal(err)
	}
	got, want := mustMarshal(t, c), mustMarshal(t, p)
	if string(got) != string(want) {
		t.Errorf("the Hub file and the preset differ at %s", diffLines(got, want))
	}
	if !strings.Contains(string(got), `"sliding_attention": {`) || strings.Contains(string(got), "rope_local_base_freq") {
		t.Errorf("written file lacks the nested rope_parameters or keeps rope_local_base_freq:\n%s", got)
	}
	back, err := Parse(got, "written")
	if err != nil {
		t.Fatal(err)
	}
	if again := mustMarshal(t, back); string(again) != string(got) {
		t.Errorf("round trip changed the file at %s", diffLines(again, got))
	}
	if s := c.Shape(); s.Norms != SandwichNorms || s.QKNorm != QKNormPerHead || !s.Tied {
		t.Errorf("shape %+v: want sandwich norms, per-head q/k norm, tied embeddings", s)
	}
	// 1 152 * 262 144 embeddings + 26 layers of attention (q 1024, kv 256 wide), two 256-wide
	// q/k norms, a 6 912-wide GeGLU and four norms, and the final norm: 999 885 952, the
	// parameter count of gemma-3-1b-pt.
	if n := c.NumParameters(); n != 999885952 {
		t.Errorf("NumParameters = %d, want 999885952", n)
	}
}

// TestGemma3RopeScalingGoesToFullLayers: a 4.x rope_scaling (Gemma 3 4B and larger: linear,
// factor 8) applies to the full-attention layers only, and a 5.x nested dictionary is read
// per layer type.
func TestGemma3RopeScalingGoesToFullLayers(t *testing.T) {
	src := strings.Replace(gemma31b4x, `"rope_scaling": null`, `"rope_scaling": {"rope_type": "linear", "factor": 8.0}`, 1)
	c, err := Parse([]byte(src), "4b-style")
	if err != nil {
		t.Fatal(err)
	}
	if c.Rope.Type != "linear" || c.Rope.Factor != 8 || c.SlidingRope.Type != "default" || c.SlidingRope.Factor != 0 {
		t.Errorf("full %+v, sliding %+v: want linear x8 on full layers only", c.Rope, c.SlidingRope)
	}
	nested := `{"model_type": "gemma3_text", "num_hidden_layers": 3, "layer_types": ["full_attention", "sliding_attention", "full_attention"],
		"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 500000.0},
		"sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}}}`
	c, err = Parse([]byte(nested), "nested")
	if err != nil {
		t.Fatal(err)
	}
	if c.Rope.Type != "yarn" || c.Rope.Theta != 5e5 || c.SlidingRope.Theta != 2e4 {
		t.Errorf("full %+v, sliding %+v", c.Rope, c.SlidingRope)
	}
	if !slices.Equal(c.LayerTypes, []string{FullAttention, SlidingAttention, FullAttention}) {
		t.Errorf("explicit layer_types became %v", c.LayerTypes)
	}
}

// TestGemma3Refusals: unknown keys, a flat rope_parameters, a stray layer type and bad caps are
// refused with the key named.
func TestGemma3Refusals(t *testing.T) {
	v := `"vocab_size": 262144`
	for _, tc := range []struct {
		name, old, new, want string
	}{
		{"unknown key", v, v + `, "hidden_act": "gelu"`, `key "hidden_act" is not a gemma3_text key`},
		{"misspelt key", v, v + `, "query_pre_attn_scaler": 1`, `"query_pre_attn_scaler"`},
		{"flat rope_parameters", v, v + `, "rope_parameters": {"rope_type": "default", "rope_theta": 1.0}`, "one dictionary per layer type"},
		{"stray layer type", v, v + `, "rope_parameters": {"full_attention": {"rope_theta": 1.0}, "chunked_attention": {}}`, `"chunked_attention" is not a layer type`},
		{"negative cap", `"final_logit_softcapping": null`, `"final_logit_softcapping": -30.0`, "final_logit_softcapping (-30) must be a positive cap"},
		{"zero scalar", `"query_pre_attn_scalar": 256`, `"query_pre_attn_scalar": 0`, "query_pre_attn_scalar (0) must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := strings.Replace(gemma31b4x, tc.old, tc.new, 1)
			_, err := Parse([]byte(src), "cfg.json")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}
