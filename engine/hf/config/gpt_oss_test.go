package config

import (
	"strings"
	"testing"
)

// gptOss20b is openai/gpt-oss-20b's config.json as published (4.x dialect: rope_scaling and
// rope_theta; the original release's experts_per_token and initial_context_length; an mxfp4
// quantization_config), with layer_types cut to the alternating list it holds.
const gptOss20b = `{
  "architectures": ["GptOssForCausalLM"],
  "attention_bias": true,
  "attention_dropout": 0.0,
  "eos_token_id": 200002,
  "experts_per_token": 4,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2880,
  "initial_context_length": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 2880,
  "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
  "max_position_embeddings": 131072,
  "model_type": "gpt_oss",
  "num_attention_heads": 64,
  "num_experts_per_tok": 4,
  "num_hidden_layers": 24,
  "num_key_value_heads": 8,
  "num_local_experts": 32,
  "output_router_logits": false,
  "pad_token_id": 199999,
  "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false},
  "rope_theta": 150000,
  "router_aux_loss_coef": 0.9,
  "sliding_window": 128,
  "swiglu_limit": 7.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.55.0.dev0",
  "use_cache": true,
  "vocab_size": 201088
}`

// TestGptOssHubFile: the Hub file resolves to the preset (yarn x32 over 4096 positions without
// truncation, alternating layers, sinks and expert biases), keeps its quantization_config, and
// counts gpt-oss-20b's 20,914,757,184 parameters: 2 * 201088 * 2880 embeddings and head, and
// per layer attention 2880 * 64 * (64 + 2 * 8) * 2 with biases and 64 sinks, a router of 32 * 2880
// with 32 biases and 32 experts of 3 * 2880 * 2880 with 3 * 2880 biases.
func TestGptOssHubFile(t *testing.T) {
	c, err := Parse([]byte(gptOss20b), "gpt-oss-20b")
	if err != nil {
		t.Fatal(err)
	}
	r := c.Rope
	if r.Type != "yarn" || r.Factor != 32 || r.OriginalMaxPositionEmbeddings != 4096 || r.Truncate == nil || *r.Truncate || r.Theta != 150000 {
		t.Errorf("rope %+v", r)
	}
	if !c.IsSlidingLayer(0) || c.IsSlidingLayer(1) || c.SlidingWindow != 128 {
		t.Errorf("layer 0 sliding %v, layer 1 sliding %v, window %d", c.IsSlidingLayer(0), c.IsSlidingLayer(1), c.SlidingWindow)
	}
	if _, ok := c.Extra("quantization_config"); !ok {
		t.Error("quantization_config was not kept")
	}
	s := c.Shape()
	if !s.Sinks || !s.ExpertBias || s.Experts != 32 || s.TopK != 4 || !s.QKVBias || !s.OBias {
		t.Errorf("shape %+v", s)
	}
	if n := c.NumParameters(); n != 20914757184 {
		t.Errorf("NumParameters = %d, want 20914757184", n)
	}
	p, err := Preset("gpt_oss", "gpt-oss-20b")
	if err != nil {
		t.Fatal(err)
	}
	c.RemoveExtra("quantization_config")
	got, want := mustMarshal(t, c), mustMarshal(t, p)
	if string(got) != string(want) {
		t.Errorf("the Hub file and the preset differ at %s", diffLines(got, want))
	}
	d, err := New("gpt_oss")
	if err != nil {
		t.Fatal(err)
	}
	if d.Rope.Type != "yarn" || d.SwigluLimit != 7 || d.SwigluAlpha != 1.702 || d.LayerTypes[0] != SlidingAttention || d.LayerTypes[1] != FullAttention {
		t.Errorf("defaults: rope %+v, limit %g, alpha %g, layer types %v", d.Rope, d.SwigluLimit, d.SwigluAlpha, d.LayerTypes[:2])
	}
}

// TestGptOssRefusals: unknown keys and bad clamps are refused with the key named.
func TestGptOssRefusals(t *testing.T) {
	for _, tc := range []struct{ old, new, want string }{
		{`"swiglu_limit": 7.0`, `"swiglu_limit": 7.0, "swiglu_limt": 1`, `key "swiglu_limt" is not a gpt_oss key`},
		{`"swiglu_limit": 7.0`, `"swiglu_limit": 0`, "swiglu_limit (0) must be positive"},
		{`"swiglu_limit": 7.0`, `"swiglu_limit": 7.0, "swiglu_alpha": -1`, "swiglu_alpha (-1) must be positive"},
	} {
		_, err := Parse([]byte(strings.Replace(gptOss20b, tc.old, tc.new, 1)), "cfg.json")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error = %v, want one containing %q", tc.new, err, tc.want)
		}
	}
}
