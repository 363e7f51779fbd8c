package config

import (
	"strings"
	"testing"
)

// Parameter counts of the tiny presets of further MoE families, from the shapes of
// transformers' modules.
func TestMoEFamiliesParameters(t *testing.T) {
	h, v, q, kv := int64(64), int64(256), int64(64), int64(32)
	attn := h*q + 2*h*kv + q*h
	for _, tc := range []struct {
		family string
		want   int64
	}{
		// embed, lm_head, final norm; per layer attention, q/k norms over the projections, two
		// post-norms, router and 8 experts of 32
		{"flex_olmo", 2*v*h + h + 2*(attn+q+kv+2*h+h*8+8*3*h*32)},
		// Llama's layers with a router and 8 experts of 32 in place of the MLP
		{"granitemoe", 2*v*h + h + 2*(attn+2*h+h*8+8*3*h*32)},
		// per-head q/k norms (16), a router, 8 experts of 32 and a shared MLP of 32
		{"hunyuan_v1_moe", 2*v*h + h + 2*(attn+2*16+2*h+h*8+8*3*h*32+3*h*32)},
		// tied; per sparse layer a router with its correction bias (a parameter), 8 experts of
		// 32 and a shared expert of 32
		{"ernie4_5_moe", v*h + h + 2*(attn+2*h+h*8+8+8*3*h*32+3*h*32)},
		// q/k norms over the projections, a router and 8 experts of 32 (the correction bias is
		// a buffer)
		{"minimax_m2", 2*v*h + h + 2*(attn+q+kv+2*h+h*8+8*3*h*32)},
		// per-head q/k norms (16), g_proj (4 heads), a router with its correction bias (a
		// parameter), 8 experts of 32 and a shared expert of 32
		{"laguna", 2*v*h + h + 2*(attn+2*16+4*h+2*h+h*8+8+8*3*h*32+3*h*32)},
		// tied; per layer a mixture of attention heads (a router, 8 experts' query and
		// output projections of 2·16 wide, kv_proj, an output bias), two norms, a router, 8
		// GLU experts of 32 and the block's output bias
		{"jetmoe", v*h + h + 2*(h*8+8*2*h*kv+2*h*kv+h+2*h+h*8+8*3*h*32+h)},
	} {
		c, err := Preset(tc.family, "tiny")
		if err != nil {
			t.Fatal(err)
		}
		if got := c.NumParameters(); got != tc.want {
			t.Errorf("%s tiny: %d parameters, want %d", tc.family, got, tc.want)
		}
	}
}

// The further MoE families refuse keys they do not know, naming the key, and read the
// aliases transformers' attribute_map declares.
func TestMoEFamiliesRefuseUnknownKeys(t *testing.T) {
	for _, fam := range []string{"flex_olmo", "granitemoe", "hunyuan_v1_moe", "ernie4_5_moe", "minimax_m2", "laguna", "jetmoe"} {
		_, err := Parse([]byte(`{"model_type": "`+fam+`", "use_post_norm": true}`), "cfg.json")
		if err == nil || !strings.Contains(err.Error(), `key "use_post_norm" is not a `+fam+` key`) {
			t.Errorf("%s: unknown key: %v", fam, err)
		}
	}
	c, err := Parse([]byte(`{"model_type": "flex_olmo", "num_local_experts": 3, "num_experts_per_tok": 2}`), "cfg.json")
	if err != nil || c.NumExperts != 3 {
		t.Fatalf("flex_olmo num_local_experts: %v, %+v", err, c)
	}
	c, err = Parse([]byte(`{"model_type": "hunyuan_v1_moe", "num_local_experts": 6, "num_experts_per_tok": 3}`), "cfg.json")
	if err != nil || c.NumExperts != 6 || c.NumExpertsPerTok != 3 {
		t.Fatalf("hunyuan_v1_moe aliases: %v, %+v", err, c)
	}
	c, err = Parse([]byte(`{"model_type": "ernie4_5_moe", "num_experts": 6, "num_experts_per_tok": 3, "num_hidden_layers": 4, "moe_layer_interval": 2}`), "cfg.json")
	if err != nil || c.NumExperts != 6 || c.NumExpertsPerTok != 3 || c.MoELayerEndIndex != 3 {
		t.Fatalf("ernie4_5_moe aliases, end index: %v, %+v", err, c)
	}
	// Sparse layers: from moe_layer_start_index 1 to 3, every second one counted from 1.
	for i, want := range []bool{false, true, false, true} {
		if c.IsMoELayer(i) != want {
			t.Errorf("ernie4_5_moe layer %d sparse %v, want %v", i, c.IsMoELayer(i), want)
		}
	}
	if _, err := Parse([]byte(`{"model_type": "ernie4_5_moe", "use_bias": true}`), "cfg.json"); err == nil || !strings.Contains(err.Error(), "use_bias") {
		t.Errorf("ernie4_5_moe use_bias: %v", err)
	}
	if _, err := Parse([]byte(`{"model_type": "minimax_m2", "output_router_logits": true}`), "cfg.json"); err == nil || !strings.Contains(err.Error(), "output_router_logits") {
		t.Errorf("minimax_m2 output_router_logits: %v", err)
	}
	// The Hub file's keys that transformers keeps without reading are kept.
	if _, err := Parse([]byte(`{"model_type": "minimax_m2", "rotary_dim": 64, "use_qk_norm": true, "qk_norm_type": "per_layer", "scoring_func": "sigmoid", "use_routing_bias": true}`), "cfg.json"); err != nil {
		t.Errorf("minimax_m2 Hub keys: %v", err)
	}
	for _, tc := range []struct{ file, key string }{
		{`{"model_type": "laguna", "num_hidden_layers": 2, "num_attention_heads_per_layer": [32, 16]}`, "num_attention_heads_per_layer"},
		{`{"model_type": "laguna", "moe_router_logit_softcapping": 30.0}`, "moe_router_logit_softcapping"},
		{`{"model_type": "laguna", "moe_apply_router_weight_on_input": true}`, "moe_apply_router_weight_on_input"},
		{`{"model_type": "laguna", "gating": false}`, "gating=false"},
		{`{"model_type": "laguna", "output_router_logits": true}`, "output_router_logits"},
		{`{"model_type": "laguna", "num_hidden_layers": 2, "mlp_layer_types": ["dense"]}`, "mlp_layer_types"},
	} {
		if _, err := Parse([]byte(tc.file), "cfg.json"); err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("laguna %s: %v, want an error naming %s", tc.file, err, tc.key)
		}
	}
	// A file's rope_parameters replace the defaults whole (partial_rotary_factor 1 where absent).
	c, err = Parse([]byte(`{"model_type": "laguna", "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1000.0}, "sliding_attention": {"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.25}}}`), "cfg.json")
	if err != nil || c.Rope.Theta != 1000 || c.Rope.PartialRotaryFactor != 0 || c.SlidingRope.Theta != 100 || c.SlidingRope.PartialRotaryFactor != 0.25 {
		t.Errorf("laguna rope_parameters: %v, %+v %+v", err, c.Rope, c.SlidingRope)
	}
	// Per-layer lists of moe_topk are not read: the error names the key.
	_, err = Parse([]byte(`{"model_type": "hunyuan_v1_moe", "num_experts": 4, "moe_topk": [2, 2]}`), "cfg.json")
	if err == nil || !strings.Contains(err.Error(), "moe_topk") {
		t.Errorf("hunyuan_v1_moe moe_topk list: %v", err)
	}
}

// Defaults as the transformers config classes have them (without arguments).
func TestMoEFamiliesDefaults(t *testing.T) {
	c, err := New("flex_olmo")
	if err != nil {
		t.Fatal(err)
	}
	if c.NumExperts != 7 || c.NumExpertsPerTok != 5 || c.Rope.Theta != 500000 || c.NumKeyValueHeads != 32 ||
		*c.PadTokenID != 100277 || c.BOSTokenID != nil || c.NormTopKProb || c.RouterAuxLossCoef != 0.01 {
		t.Errorf("flex_olmo defaults: %+v", c)
	}
	c, err = New("granitemoe")
	if err != nil {
		t.Fatal(err)
	}
	if c.NumExperts != 8 || c.NumExpertsPerTok != 2 || c.NumKeyValueHeads != 32 || !c.NormTopKProb ||
		c.RouterAuxLossCoef != 0.001 || c.RMSNormEps != 1e-6 || c.EmbeddingMultiplier != 1 || c.Rope.Theta != 10000 {
		t.Errorf("granitemoe defaults: %+v", c)
	}
	c, err = New("hunyuan_v1_moe")
	if err != nil {
		t.Fatal(err)
	}
	if c.NumExperts != 1 || c.NumExpertsPerTok != 1 || c.NumKeyValueHeads != 32 || !c.NormTopKProb ||
		c.RMSNormEps != 1e-5 || *c.PadTokenID != 0 || *c.EODTokenID != 3 || *c.SEPTokenID != 4 || c.Shape().SharedExpert != 11008 {
		t.Errorf("hunyuan_v1_moe defaults: %+v", c)
	}
	c, err = New("ernie4_5_moe")
	if err != nil {
		t.Fatal(err)
	}
	s := c.Shape()
	if c.NumExperts != 64 || c.NumExpertsPerTok != 6 || c.MoELayerEndIndex != 27 || c.Rope.Theta != 500000 ||
		!c.TieWordEmbeddings || s.MoELayers != 27 || s.SharedExpert != 2*1536 || c.MoENormMin != 1e-12 {
		t.Errorf("ernie4_5_moe defaults: %+v", c)
	}
	c, err = New("minimax_m2")
	if err != nil {
		t.Fatal(err)
	}
	if c.NumExperts != 256 || c.NumExpertsPerTok != 8 || c.HeadDim != 128 || c.Rope.Theta != 5000000 ||
		!c.NormTopKProb || *c.BOSTokenID != 200034 || c.PadTokenID != nil || c.Shape().QKNorm != QKNormProjection {
		t.Errorf("minimax_m2 defaults: %+v", c)
	}
	c, err = New("laguna")
	if err != nil {
		t.Fatal(err)
	}
	s = c.Shape()
	if c.NumExperts != 256 || c.HeadDim != 128 || len(c.LayerTypes) != 40 || c.IsSlidingLayer(0) ||
		c.IsMoELayer(0) || !c.IsMoELayer(1) || s.MoELayers != 39 || c.Rope.Theta != 500000 || c.Rope.PartialRotaryFactor != 0.5 ||
		c.SlidingRope.Theta != 10000 || c.SlidingRope.PartialRotaryFactor != 1 || len(c.NumAttentionHeadsPerLayer) != 40 ||
		s.SharedExpert != 512 || !s.HeadGate || !s.RouterBiasParam {
		t.Errorf("laguna defaults: %+v", c)
	}
}

// jetmoe: JetMoeConfig's defaults, num_attention_heads derived from the key/value heads and
// the top-k whatever the file says, head_dim read as kv_channels, and the values the family
// does not implement refused naming the key.
func TestJetMoe(t *testing.T) {
	c, err := New("jetmoe")
	if err != nil {
		t.Fatal(err)
	}
	s := c.Shape()
	if c.VocabSize != 32000 || c.HiddenSize != 2048 || c.NumHiddenLayers != 12 || c.NumKeyValueHeads != 16 ||
		c.NumAttentionHeads != 32 || c.HeadDim != 128 || c.IntermediateSize != 5632 || c.MaxPositionEmbeddings != 4096 ||
		c.HiddenAct != "silu" || c.NumExperts != 8 || c.NumExpertsPerTok != 2 || c.OutputRouterLogits ||
		c.RouterAuxLossCoef != 0.01 || !c.UseCache || *c.BOSTokenID != 1 || c.EOSTokenIDs[0] != 2 || c.PadTokenID != nil ||
		!c.TieWordEmbeddings || c.Rope.Theta != 10000 || c.Rope.Type != "default" || c.RMSNormEps != 1e-6 ||
		c.InitializerRange != 0.01 || c.AttentionDropout != 0 || !c.NormTopKProb ||
		!s.MoA || s.MoELayers != 12 || s.ExpertIntermediate != 5632 || s.QKVBias || s.OBias {
		t.Errorf("jetmoe defaults: %+v", c)
	}
	c, err = Parse([]byte(`{"model_type": "jetmoe", "hidden_size": 24, "num_key_value_heads": 2, "num_attention_heads": 7,
		"head_dim": 6, "num_local_experts": 4, "num_experts_per_tok": 3, "intermediate_size": 20}`), "cfg.json")
	if err != nil {
		t.Fatal(err)
	}
	if c.NumAttentionHeads != 6 || c.HeadDim != 6 || c.NumExperts != 4 || c.NumExpertsPerTok != 3 || c.ExpertIntermediateSize() != 20 {
		t.Errorf("jetmoe derived heads, head_dim alias: %+v", c)
	}
	out, err := c.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"num_attention_heads": 6,`, `"kv_channels": 6,`, `"activation_function": "silu",`, `"aux_loss_coef": 0.01,`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("jetmoe written without %s:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), `"head_dim"`) || strings.Contains(string(out), `"hidden_act"`) {
		t.Errorf("jetmoe written with another family's keys:\n%s", out)
	}
	for _, tc := range []struct{ file, key string }{
		{`{"model_type": "jetmoe", "output_router_logits": true}`, "output_router_logits"},
		{`{"model_type": "jetmoe", "activation_function": "gelu"}`, "activation_function"},
		{`{"model_type": "jetmoe", "activation_function": "tanh"}`, "activation_function"},
		{`{"model_type": "jetmoe", "hidden_act": "silu"}`, "hidden_act"},
		{`{"model_type": "jetmoe", "num_experts_per_tok": 9}`, "num_experts_per_tok"},
		{`{"model_type": "jetmoe", "num_key_value_heads": null}`, "num_key_value_heads"},
	} {
		if _, err := Parse([]byte(tc.file), "cfg.json"); err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("jetmoe %s: %v, want an error naming %s", tc.file, err, tc.key)
		}
	}
}
