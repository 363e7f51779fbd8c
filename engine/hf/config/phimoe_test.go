package config

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// phimoeHub is microsoft/Phi-3.5-MoE-instruct's config.json in the 4.x dialect (rope_scaling
// with its legacy type key and the mscales, the top-level original context, auto_map) at a
// tiny width, so that its longrope tables have head_dim/2 = 8 entries.
const phimoeHub = `{
  "architectures": ["PhiMoEForCausalLM"],
  "auto_map": {"AutoConfig": "configuration_phimoe.PhiMoEConfig", "AutoModelForCausalLM": "modeling_phimoe.PhiMoEForCausalLM"},
  "attention_bias": true, "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 32000,
  "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
  "input_jitter_noise": 0.01, "intermediate_size": 96, "lm_head_bias": true,
  "max_position_embeddings": 131072, "model_type": "phimoe", "num_attention_heads": 4,
  "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_key_value_heads": 2, "num_local_experts": 16,
  "original_max_position_embeddings": 4096, "output_router_logits": false, "rms_norm_eps": 1e-05,
  "rope_scaling": {"long_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 3.0, 5.0, 8.0], "long_mscale": 1.243163121016122,
    "original_max_position_embeddings": 4096, "short_factor": [1.0, 1.0, 1.0, 1.05, 1.1, 1.2, 1.3, 1.5],
    "short_mscale": 1.243163121016122, "type": "longrope"},
  "rope_theta": 10000.0, "router_aux_loss_coef": 0.0, "router_jitter_noise": 0.01, "sliding_window": 131072,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.43.3", "use_cache": true,
  "vocab_size": 32064
}`

// TestPhimoeReadsHubConfig: the Hub's file reads (without its input_jitter_noise, which is
// refused, see TestPhimoeRefusals), longrope with the mscale as the attention factor and the
// short factors at every length, the biases on; and it writes back in the 5.x dialect that
// reads the same.
func TestPhimoeReadsHubConfig(t *testing.T) {
	src := strings.Replace(phimoeHub, `"input_jitter_noise": 0.01`, `"input_jitter_noise": 0.0`, 1)
	src = strings.Replace(src, `"PhiMoEForCausalLM"]`, `"PhimoeForCausalLM"]`, 1)
	c, err := Parse([]byte(src), "config.json")
	if err != nil {
		t.Fatal(err)
	}
	if c.Rope.Type != "longrope" || c.Rope.Theta != 10000 || c.Rope.OriginalMaxPositionEmbeddings != 4096 || len(c.Rope.LongFactor) != 8 {
		t.Errorf("rope %+v", c.Rope)
	}
	if f := c.Family().RopeAttentionFactor(c); f != 1.243163121016122 {
		t.Errorf("attention factor %v, want the mscale 1.243163121016122", f)
	}
	if !c.Family().RopeShortFactorsOnly {
		t.Error("RopeShortFactorsOnly unset: transformers 5's PhimoeRotaryEmbedding uses short_factor at every length")
	}
	s := c.Shape()
	if !s.QKVBias || !s.OBias || !s.HeadBias || !s.NormBias || s.Experts != 16 || s.TopK != 2 {
		t.Errorf("shape %+v", s)
	}
	if c.RouterJitterNoise != 0.01 || c.SlidingWindow != 131072 || c.EOSTokenIDs[0] != 32000 {
		t.Errorf("config %+v", c)
	}
	out, err := c.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	rp, _ := m["rope_parameters"].(map[string]any)
	if rp["short_mscale"] != 1.243163121016122 || rp["long_mscale"] != 1.243163121016122 || m["lm_head_bias"] != true {
		t.Errorf("written: rope_parameters %v, lm_head_bias %v", rp, m["lm_head_bias"])
	}
	if _, ok := rp["attention_factor"]; ok {
		t.Errorf("written rope_parameters carry an attention_factor transformers' file does not: %v", rp)
	}
	back, err := Parse(out, "config.json")
	if err != nil {
		t.Fatalf("written file does not read back: %v\n%s", err, out)
	}
	if back.Family().RopeAttentionFactor(back) != 1.243163121016122 || !reflect.DeepEqual(back.Shape(), s) {
		t.Errorf("read back %+v", back.Shape())
	}
}

// TestPhimoeDefaults: an empty file gets PhimoeConfig's defaults.
func TestPhimoeDefaults(t *testing.T) {
	c, err := Parse([]byte(`{"model_type": "phimoe"}`), "config.json")
	if err != nil {
		t.Fatal(err)
	}
	if c.VocabSize != 32064 || c.HiddenSize != 4096 || c.IntermediateSize != 6400 || c.NumHiddenLayers != 32 ||
		c.NumAttentionHeads != 32 || c.NumKeyValueHeads != 8 || c.MaxPositionEmbeddings != 131072 ||
		c.NumExperts != 16 || c.NumExpertsPerTok != 2 || c.RouterJitterNoise != 0.01 || c.RouterAuxLossCoef != 0.001 ||
		c.Rope.Type != "default" || c.Rope.Theta != 1e6 || c.RMSNormEps != 1e-5 || c.AttentionBias || c.LMHeadBias ||
		c.SlidingWindow != 0 || c.TieWordEmbeddings {
		t.Errorf("defaults %+v, rope %+v", c, c.Rope)
	}
	if f := c.Family().RopeAttentionFactor(c); f != 0 {
		t.Errorf("default rope: attention factor %v, want 0 (the type's own)", f)
	}
}

// TestPhimoeRefusals: what the model here cannot compute as transformers does is an error that
// names the key.
func TestPhimoeRefusals(t *testing.T) {
	rope := func(extra string) string {
		return `{"model_type": "phimoe", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
			"original_max_position_embeddings": 16, "short_factor": [1,1,1,1,1,1,1,1], "long_factor": [2,2,2,2,2,2,2,2]` + extra + `}}`
	}
	for _, tc := range []struct{ file, key string }{
		{phimoeHub, "input_jitter_noise"},
		{rope(`, "short_mscale": 1.2, "long_mscale": 1.3`), "long_mscale"},
		{rope(`, "short_mscale": 1.2`), "long_mscale"},
		{rope(`, "short_mscale": -1, "long_mscale": -1`), "short_mscale"},
		{`{"model_type": "phimoe", "rope_parameters": {"rope_type": "yarn", "factor": 2.0}}`, "rope_type"},
		{`{"model_type": "phimoe", "num_experts_per_tok": 3}`, "num_experts_per_tok"},
		{`{"model_type": "phimoe", "use_post_norm": true}`, "use_post_norm"},
	} {
		_, err := Parse([]byte(tc.file), "config.json")
		if err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%.80s...: %v, want an error naming %s", tc.file, err, tc.key)
		}
	}
	if _, err := Parse([]byte(rope(`, "short_mscale": 1.2, "long_mscale": 1.2`)), "config.json"); err != nil {
		t.Errorf("longrope with equal mscales: %v", err)
	}
}
