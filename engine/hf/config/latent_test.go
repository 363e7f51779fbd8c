package config

import (
	"strings"
	"testing"
)

// TestLatentTinyShape: the latent-attention tiny presets resolve head_dim to the rotary width
// and qk_head_dim to nope + rope, make the first layer dense, and count their parameters as
// transformers does (written out below by hand for the tiny shape).
func TestLatentTinyShape(t *testing.T) {
	for _, mt := range []string{"deepseek_v3", "glm4_moe_lite"} {
		c, err := Preset(mt, "tiny")
		if err != nil {
			t.Fatal(err)
		}
		s := c.Shape()
		if s.HeadDim != 8 || c.QKHeadDim != 24 || c.RotaryDim() != 8 {
			t.Errorf("%s: head_dim %d, qk_head_dim %d, rotary %d; want 8, 24, 8", mt, s.HeadDim, c.QKHeadDim, c.RotaryDim())
		}
		if want := (LatentShape{QRank: 24, KVRank: 32, Nope: 16, Rope: 8, V: 12}); s.Latent != want {
			t.Errorf("%s: latent shape %+v, want %+v", mt, s.Latent, want)
		}
		if s.MoELayers != 1 || c.IsMoELayer(0) || !c.IsMoELayer(1) || s.SharedExpert != 32 || !s.RouterBias {
			t.Errorf("%s: MoE layers %d (layer 0 %v, layer 1 %v), shared %d; want layer 1 only, shared 32", mt, s.MoELayers, c.IsMoELayer(0), c.IsMoELayer(1), s.SharedExpert)
		}
		// Per layer: q_a 64*24 + norm 24 + q_b 24*4*24, kv_a 64*40 + norm 32, kv_b 32*4*28,
		// o 48*64 = 13112, plus two norms of 64. Layer 0: SwiGLU 3*64*128; layer 1: router
		// 8*64, experts 8*3*64*32, shared 3*64*32. Embeddings and LM head 2*256*64, final norm.
		const want = 2*256*64 + 64 + 2*(13112+128) + 3*64*128 + 8*64 + 8*3*64*32 + 3*64*32
		if n := s.NumParameters(); n != want {
			t.Errorf("%s: %d parameters, want %d", mt, n, want)
		}
		if n := s.ActiveParameters(); n != want-6*3*64*32 {
			t.Errorf("%s: %d active parameters, want %d", mt, n, want-6*3*64*32)
		}
	}
}

// deepseekHub is DeepSeek-V3's config.json as published (its quantization_config shortened).
const deepseekHub = `{
  "architectures": ["DeepseekV3ForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0,
  "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"},
  "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
  "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
  "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
  "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
  "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
  "norm_topk_prob": true, "num_attention_heads": 128, "num_experts_per_tok": 8,
  "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1,
  "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096, "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true,
  "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
  "transformers_version": "4.33.1", "use_cache": true, "v_head_dim": 128, "vocab_size": 129280
}`

// TestDeepseekHubConfig reads the published DeepSeek-V3 file: yarn scaling from the 4.x
// rope_scaling, head_dim and qk_head_dim derived, the keys transformers ignores kept. Its fp8
// quantization_config is refused (the weights would need their block scales); the bf16
// conversions drop it.
func TestDeepseekHubConfig(t *testing.T) {
	if _, err := Parse([]byte(deepseekHub), "deepseek-v3"); err == nil || !strings.Contains(err.Error(), `quant_method "fp8" is not supported`) {
		t.Fatalf("fp8 checkpoint: %v", err)
	}
	c, err := Parse([]byte(strings.Replace(deepseekHub, `"quant_method": "fp8"`, `"quant_method": "bitsandbytes"`, 1)), "deepseek-v3")
	if err != nil {
		t.Fatal(err)
	}
	if c.HeadDim != 64 || c.QKHeadDim != 192 || c.QLoRARank != 1536 || c.VHeadDim != 128 || !c.RopeInterleave {
		t.Errorf("head_dim %d qk_head_dim %d q_lora_rank %d v_head_dim %d rope_interleave %v", c.HeadDim, c.QKHeadDim, c.QLoRARank, c.VHeadDim, c.RopeInterleave)
	}
	if r := c.Rope; r.Type != "yarn" || r.Factor != 40 || r.MScaleAllDim != 1 || r.OriginalMaxPositionEmbeddings != 4096 {
		t.Errorf("rope %+v", r)
	}
	s := c.Shape()
	if s.MoELayers != 58 || s.Experts != 256 || s.SharedExpert != 2048 {
		t.Errorf("MoE layers %d, experts %d, shared %d; want 58, 256, 2048", s.MoELayers, s.Experts, s.SharedExpert)
	}
	// DeepSeek-V3 has 671B parameters without its multi-token-prediction layer (transformers
	// does not build it).
	if n := s.NumParameters(); n < 670e9 || n > 672e9 {
		t.Errorf("%d parameters, want about 671e9", n)
	}
	u := strings.Join(c.Unknown(), ",")
	for _, k := range []string{"scoring_func", "topk_method", "moe_layer_freq", "quantization_config"} {
		if !strings.Contains(u, k) {
			t.Errorf("unknown keys %s lack %s (kept as read)", u, k)
		}
	}
}

// TestLatentRefusals: values transformers would not compute as written, or shapes latent
// attention cannot have, are refused with the key named.
func TestLatentRefusals(t *testing.T) {
	tiny := func(mt string) string {
		c, err := Preset(mt, "tiny")
		if err != nil {
			t.Fatal(err)
		}
		return string(mustMarshal(t, c))
	}
	with := func(src, key, value string) string {
		return strings.Replace(src, "{", "{\n  \""+key+"\": "+value+",", 1)
	}
	replace := func(src, old, new string) string {
		if !strings.Contains(src, old) {
			t.Fatalf("%q not in the tiny config", old)
		}
		return strings.Replace(src, old, new, 1)
	}
	ds, glm := tiny("deepseek_v3"), tiny("glm4_moe_lite")
	for _, c := range []struct {
		name, src, want string
	}{
		{"softmax scoring", with(ds, "scoring_func", `"softmax"`), `scoring_func "softmax" is not supported`},
		{"greedy top-k", with(ds, "topk_method", `"greedy"`), `topk_method "greedy" is not supported`},
		{"sparse every other layer", with(ds, "moe_layer_freq", "2"), "moe_layer_freq 2 is not supported"},
		{"head_dim", replace(ds, `"head_dim": 8`, `"head_dim": 16`), "head_dim (16) must equal qk_rope_head_dim (8)"},
		{"qk_head_dim", replace(ds, `"qk_head_dim": 24`, `"qk_head_dim": 20`), "qk_head_dim (20) must equal"},
		{"grouped kv heads", replace(ds, `"num_key_value_heads": 4`, `"num_key_value_heads": 2`), "num_key_value_heads (2) must equal num_attention_heads (4)"},
		{"groups", replace(ds, `"n_group": 2`, `"n_group": 3`), "n_group (3) must be at least 1 and divide"},
		{"one expert per group", replace(replace(ds, `"n_group": 2`, `"n_group": 8`), `"topk_group": 1`, `"topk_group": 4`), "leaves one expert per group"},
		{"no rope dims", replace(ds, `"qk_rope_head_dim": 8`, `"qk_rope_head_dim": 0`), "qk_rope_head_dim (0) must be positive"},
		{"first_k_dense_replace against mlp_layer_types", with(glm, "first_k_dense_replace", "2"), "first_k_dense_replace (2) disagrees with mlp_layer_types (1 leading dense layers)"},
		{"mlp layer type", replace(glm, `"dense",`, `"moe",`), `mlp_layer_types[0] is "moe"`},
		{"mlp layer count", replace(glm, `"dense",`, ``), "mlp_layer_types has 1 entries but num_hidden_layers is 2"},
	} {
		_, err := Parse([]byte(c.src), c.name)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
	}
	// GLM-4.7-Flash's files carry first_k_dense_replace 1, which agrees with the default
	// pattern; a null q_lora_rank (plain q_proj) is written back as null.
	c, err := Parse([]byte(with(replace(glm, `"q_lora_rank": 24`, `"q_lora_rank": null`), "first_k_dense_replace", "1")), "glm")
	if err != nil {
		t.Fatal(err)
	}
	if c.QLoRARank != 0 || !strings.Contains(string(mustMarshal(t, c)), `"q_lora_rank": null`) {
		t.Errorf("q_lora_rank %d; written: %s", c.QLoRARank, mustMarshal(t, c))
	}
}

// TestMLPLayerTypesFollowLayers: the derived mlp_layer_types follows num_hidden_layers; one
// set explicitly stays as given.
func TestMLPLayerTypesFollowLayers(t *testing.T) {
	c, err := Preset("glm4_moe_lite", "tiny")
	if err != nil {
		t.Fatal(err)
	}
	c.NumHiddenLayers = 4
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.MLPLayerTypes, ","); got != "dense,sparse,sparse,sparse" {
		t.Errorf("derived mlp_layer_types %s", got)
	}
	c.MLPLayerTypes = []string{"dense", "dense", "sparse", "dense"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.IsMoELayer(1) || !c.IsMoELayer(2) || c.IsMoELayer(3) || c.Shape().MoELayers != 1 {
		t.Errorf("explicit mlp_layer_types: MoE layers %d", c.Shape().MoELayers)
	}
}

// TestLatentSummary: the summary names the latent ranks and head dims and the router, and
// counts DeepSeek-V3's 671B parameters, 37.6B of them active per token.
func TestLatentSummary(t *testing.T) {
	c, err := Preset("deepseek_v3", "deepseek-v3")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := c.WriteSummary(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"671.03B", "37.55B", "latent         q rank 1536, kv rank 512, query/key heads 128 + 64 rotary (interleaved true), value heads 128",
		"sigmoid router with correction bias, best 4 of 8 groups, weights x 2.5, shared expert width 2048"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, b.String())
		}
	}
}
