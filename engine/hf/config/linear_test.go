package config

import (
	"slices"
	"strings"
	"testing"
)

// A Qwen3-Next file as the Hub publishes it (4.x dialect): full_attention_interval instead of
// layer_types, rope_theta and partial_rotary_factor at the top level.
const qwen3NextHub = `{
  "architectures": ["Qwen3NextForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645,
  "full_attention_interval": 3, "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 5120, "linear_conv_kernel_dim": 4,
  "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
  "linear_value_head_dim": 128, "max_position_embeddings": 262144, "mlp_only_layers": [],
  "model_type": "qwen3_next", "moe_intermediate_size": 512, "norm_topk_prob": true,
  "num_attention_heads": 16, "num_experts": 512, "num_experts_per_tok": 10, "num_hidden_layers": 6,
  "num_key_value_heads": 2, "output_router_logits": false, "partial_rotary_factor": 0.25,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 10000000, "router_aux_loss_coef": 0.001,
  "shared_expert_intermediate_size": 512, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.57.0.dev0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936
}`

func TestLinearAttentionLayerTypes(t *testing.T) {
	c, err := Parse([]byte(qwen3NextHub), "hub")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{LinearAttention, LinearAttention, FullAttention, LinearAttention, LinearAttention, FullAttention}
	if !slices.Equal(c.LayerTypes, want) {
		t.Fatalf("layer_types %v, want %v (full_attention_interval 3)", c.LayerTypes, want)
	}
	if u := c.Unknown(); len(u) != 0 {
		t.Errorf("keys reported unknown: %v", u)
	}
	out, err := c.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "full_attention_interval") || !strings.Contains(string(out), `"layer_types"`) {
		t.Errorf("written file should carry layer_types, not full_attention_interval:\n%s", out)
	}
	// use_sliding_window is kept as read (transformers keeps it; Qwen3-Next has no window).
	if !strings.Contains(string(out), `"use_sliding_window": false`) {
		t.Errorf("use_sliding_window not written back:\n%s", out)
	}
	// Beside layer_types, full_attention_interval is an attribute transformers writes back.
	both := strings.Replace(qwen3NextHub, "{", `{"layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention", "linear_attention", "full_attention"],`, 1)
	cb, err := Parse([]byte(both), "both")
	if err != nil {
		t.Fatal(err)
	}
	if !cb.IsLinearLayer(0) || cb.IsLinearLayer(1) || len(cb.Unknown()) != 0 {
		t.Errorf("layer_types from the file %v (unknown %v)", cb.LayerTypes, cb.Unknown())
	}
	if out, _ := cb.MarshalJSON(); !strings.Contains(string(out), `"full_attention_interval": 3`) {
		t.Errorf("full_attention_interval beside layer_types not written back:\n%s", out)
	}
	s := c.Shape()
	if s.Linear.Layers != 4 || !s.AttnOutputGate || s.Linear.ConvDim() != 2*16*128+32*128 || c.RotaryDim() != 64 {
		t.Errorf("shape %+v, rotary %d", s, c.RotaryDim())
	}
	// A model with fewer layers re-derives the types by the interval.
	c.NumHiddenLayers = 3
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.LayerTypes, want[:3]) {
		t.Errorf("after num_hidden_layers 3: %v", c.LayerTypes)
	}
}

func TestLinearAttentionRefusals(t *testing.T) {
	for _, tc := range []struct {
		name, edit, want string
	}{
		{"unknown key", `"sliding_window": 4096,`, `"sliding_window" is not a qwen3_next key`},
		{"ungated attention", `"attn_output_gate": false,`, "attn_output_gate false is not supported"},
		{"value heads", `"linear_num_value_heads": 24, "linear_num_key_heads": 16,`, "linear_num_value_heads (24) must be a multiple of linear_num_key_heads (16)"},
		{"layer type", `"layer_types": ["linear_attention", "sliding_attention", "full_attention", "full_attention", "full_attention", "full_attention"],`, `layer_types[1] is "sliding_attention"`},
		{"conv", `"linear_conv_kernel_dim": 0,`, "linear_conv_kernel_dim (0) must be a positive size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := strings.Replace(qwen3NextHub, "{", "{"+tc.edit, 1)
			// Later duplicates of edited keys are removed so that the edit is the only one.
			for _, k := range []string{"linear_num_value_heads", "linear_num_key_heads", "linear_conv_kernel_dim"} {
				if strings.Contains(tc.edit, k) {
					src = dropKey(src, k, strings.Index(src, tc.edit)+len(tc.edit))
				}
			}
			_, err := Parse([]byte(src), "edited")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// dropKey removes the first `"key": value,` entry of src after offset from.
func dropKey(src, key string, from int) string {
	i := strings.Index(src[from:], `"`+key+`"`)
	if i < 0 {
		return src
	}
	i += from
	j := strings.Index(src[i:], ",")
	return src[:i] + src[i+j+1:]
}

func TestQwen35MoeTextKeepsMRopeKeys(t *testing.T) {
	c, err := Preset("qwen3_5_moe_text", "tiny")
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	src := strings.Replace(string(out), `"rope_theta": 10000.0,`, `"mrope_interleaved": true, "mrope_section": [11, 11, 10], "rope_theta": 10000.0,`, 1)
	c2, err := Parse([]byte(src), "mrope")
	if err != nil {
		t.Fatal(err)
	}
	if u := c2.Unknown(); len(u) != 0 {
		t.Errorf("mrope keys reported unknown: %v", u)
	}
	again, err := c2.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(again), `"mrope_section"`) || strings.Contains(string(again), `"intermediate_size"`) {
		t.Errorf("mrope_section not written back:\n%s", again)
	}
	if c2.NumParameters() <= 0 || c2.Shape().Intermediate != 0 {
		t.Errorf("qwen3_5_moe_text has no dense MLP: shape %+v", c2.Shape())
	}
}

// A Qwen3.5-MoE text_config as the Hub's files carry it (beside model_type qwen3_5_moe_text):
// both layer_types and full_attention_interval, the mrope keys, the MTP keys, and keys of
// qwen3_next's config that Qwen3_5MoeTextConfig does not have.
const qwen35TextHub = `{
  "model_type": "qwen3_5_moe_text", "attention_bias": false, "attention_dropout": 0.0, "attn_output_gate": true,
  "dtype": "bfloat16", "eos_token_id": 248044, "full_attention_interval": 2, "head_dim": 16, "hidden_act": "silu",
  "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 64,
  "layer_types": ["linear_attention", "full_attention"], "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16,
  "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_value_head_dim": 16,
  "max_position_embeddings": 128, "moe_intermediate_size": 64, "mtp_num_hidden_layers": 1,
  "mtp_use_dedicated_embeddings": false, "norm_topk_prob": false, "num_attention_heads": 4, "num_experts": 4,
  "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_key_value_heads": 2, "output_router_logits": false,
  "pad_token_id": null, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06,
  "rope_parameters": {"mrope_interleaved": true, "mrope_section": [11, 11, 10], "partial_rotary_factor": 0.25,
    "rope_theta": 10000000, "rope_type": "default"},
  "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 64, "tie_word_embeddings": false,
  "use_cache": true, "vocab_size": 64
}`

func TestQwen35MoeTextHubKeys(t *testing.T) {
	c, err := Parse([]byte(qwen35TextHub), "hub")
	if err != nil {
		t.Fatal(err)
	}
	if u := c.Unknown(); len(u) != 0 {
		t.Errorf("keys reported unknown: %v", u)
	}
	s := c.Shape()
	if s.Intermediate != 0 || s.MoELayers != 2 || !c.NormTopKProb || s.Linear.Layers != 1 || c.RotaryDim() != 4 {
		t.Errorf("shape %+v, norm_topk_prob %v: every layer sparse, top-k always renormalised (the file's false is an unread attribute)", s, c.NormTopKProb)
	}
	out, err := c.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{`"mtp_num_hidden_layers": 1`, `"norm_topk_prob": false`, `"intermediate_size": 64`, `"full_attention_interval": 2`, `"mrope_section"`} {
		if !strings.Contains(string(out), k) {
			t.Errorf("%s not written back as read:\n%s", k, out)
		}
	}
}
