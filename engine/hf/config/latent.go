package config

import (
	"encoding/json"
	"slices"
	"strings"
)

// Latent are the config.json keys of the families with multi-head latent attention (MLA:
// deepseek_v3, glm4_moe_lite). Queries come from a low-rank projection (q_a_proj, an RMSNorm
// of QLoRARank, q_b_proj) or, with q_lora_rank null, from one q_proj; keys and values from a
// compressed projection of KVLoRARank (kv_a_proj_with_mqa, whose last QKRopeHeadDim outputs
// are one rotary key shared by every head, kv_a_layernorm, kv_b_proj). Each query and key head
// is QKNopeHeadDim unrotated dims followed by QKRopeHeadDim rotated ones; each value head is
// VHeadDim wide. Config embeds it; other families leave it zero.
type Latent struct {
	// QLoRARank is the rank of the query projection; 0 (null) means a plain q_proj.
	// Default: deepseek_v3 1536; glm4_moe_lite 768.
	QLoRARank int
	// KVLoRARank is the width of the compressed key/value projection. Default 512.
	KVLoRARank int
	// QKNopeHeadDim and QKRopeHeadDim split each query and key head into its unrotated and
	// rotated dims. Default: deepseek_v3 128 and 64; glm4_moe_lite 192 and 64.
	QKNopeHeadDim, QKRopeHeadDim int
	// VHeadDim is each value head's width. Default: deepseek_v3 128; glm4_moe_lite 256.
	VHeadDim int
	// QKHeadDim is QKNopeHeadDim + QKRopeHeadDim (transformers' qk_head_dim, derived and
	// written).
	QKHeadDim int
	// RopeInterleave: the checkpoint's rotary dims are interleaved pairs (2i, 2i+1), which
	// transformers rotates after moving them to the rotate-half layout. Default true.
	RopeInterleave bool
	// MLPLayerTypes gives each layer's feed-forward block, "dense" or "sparse"
	// (glm4_moe_lite; derived as one dense layer then sparse ones when absent).
	MLPLayerTypes []string

	// mlpDerived: MLPLayerTypes was derived (as mlpFrom) and follows NumHiddenLayers until
	// it is changed.
	mlpDerived bool
	mlpFrom    []string
}

func (l Latent) clone() Latent {
	l.MLPLayerTypes = slices.Clone(l.MLPLayerTypes)
	l.mlpFrom = slices.Clone(l.mlpFrom)
	return l
}

// IsLatent reports whether the model uses multi-head latent attention.
func (c *Config) IsLatent() bool { return c.KVLoRARank > 0 }

// The keys of Latent.
var _ = addFields(map[string]field{
	"q_lora_rank":      {kInt, true, func(c *Config) any { return &c.QLoRARank }},
	"kv_lora_rank":     {kInt, false, func(c *Config) any { return &c.KVLoRARank }},
	"qk_nope_head_dim": {kInt, false, func(c *Config) any { return &c.QKNopeHeadDim }},
	"qk_rope_head_dim": {kInt, false, func(c *Config) any { return &c.QKRopeHeadDim }},
	"v_head_dim":       {kInt, false, func(c *Config) any { return &c.VHeadDim }},
	"qk_head_dim":      {kInt, false, func(c *Config) any { return &c.QKHeadDim }},
	"rope_interleave":  {kBool, false, func(c *Config) any { return &c.RopeInterleave }},
	"mlp_layer_types":  {kStringList, true, func(c *Config) any { return &c.MLPLayerTypes }},
})

// latentKeys are the keys both latent-attention families have (head_dim only deepseek_v3 writes
// always).
var latentKeys = []string{"attention_bias", "attention_dropout", "bos_token_id", "eos_token_id",
	"hidden_act", "hidden_size", "initializer_range", "intermediate_size", "kv_lora_rank",
	"max_position_embeddings", "moe_intermediate_size", "n_group", "n_routed_experts", "n_shared_experts",
	"norm_topk_prob", "num_attention_heads", "num_experts_per_tok", "num_hidden_layers",
	"num_key_value_heads", "pad_token_id", "pretraining_tp", "q_lora_rank", "qk_head_dim",
	"qk_nope_head_dim", "qk_rope_head_dim", "rms_norm_eps", "rope_interleave", "routed_scaling_factor",
	"tie_word_embeddings", "topk_group", "use_cache", "v_head_dim", "vocab_size"}

// resolveLatent derives head_dim (the rotary width, as transformers sets it) and qk_head_dim,
// unless the file gave them (Validate then checks them).
func resolveLatent(c *Config) {
	if !c.src["head_dim"] || c.HeadDim == 0 {
		c.HeadDim = c.QKRopeHeadDim
	}
	if !c.src["qk_head_dim"] || c.QKHeadDim == 0 {
		c.QKHeadDim = c.QKNopeHeadDim + c.QKRopeHeadDim
	}
}

// validateLatent checks the latent-attention sizes, the router keys and the keys of the Hub
// checkpoints that transformers keeps but does not read, refusing values under which
// transformers would compute a model other than the one the file describes.
func validateLatent(c *Config) error {
	for _, s := range []struct {
		key string
		v   int
	}{{"kv_lora_rank", c.KVLoRARank}, {"qk_rope_head_dim", c.QKRopeHeadDim}, {"v_head_dim", c.VHeadDim}} {
		if s.v <= 0 || s.v > maxDim {
			return errorf("%s (%d) must be positive", s.key, s.v)
		}
	}
	if c.QKNopeHeadDim < 0 || c.QKNopeHeadDim > maxDim {
		return errorf("qk_nope_head_dim (%d) must not be negative", c.QKNopeHeadDim)
	}
	if c.QLoRARank < 0 || c.QLoRARank > maxDim {
		return errorf("q_lora_rank (%d) must be positive, or null for a plain q_proj", c.QLoRARank)
	}
	if c.HeadDim != c.QKRopeHeadDim {
		return errorf("head_dim (%d) must equal qk_rope_head_dim (%d): %s rotates head_dim dims of each head; remove head_dim", c.HeadDim, c.QKRopeHeadDim, c.ModelType)
	}
	if c.QKHeadDim != c.QKNopeHeadDim+c.QKRopeHeadDim {
		return errorf("qk_head_dim (%d) must equal qk_nope_head_dim + qk_rope_head_dim (%d); remove qk_head_dim", c.QKHeadDim, c.QKNopeHeadDim+c.QKRopeHeadDim)
	}
	if c.NumKeyValueHeads != c.NumAttentionHeads {
		return errorf("num_key_value_heads (%d) must equal num_attention_heads (%d): latent attention expands its compressed keys and values into one key and value per query head", c.NumKeyValueHeads, c.NumAttentionHeads)
	}
	if c.Rope.PartialRotaryFactor != 0 && c.Rope.PartialRotaryFactor != 1 {
		return errorf("partial_rotary_factor (%g) must be 1: the rotated part of each head is qk_rope_head_dim", c.Rope.PartialRotaryFactor)
	}
	switch {
	case c.NGroup < 1 || c.NumExperts%c.NGroup != 0:
		return errorf("n_group (%d) must be at least 1 and divide n_routed_experts (%d)", c.NGroup, c.NumExperts)
	case c.TopKGroup < 1 || c.TopKGroup > c.NGroup:
		return errorf("topk_group (%d) must be between 1 and n_group (%d)", c.TopKGroup, c.NGroup)
	case c.TopKGroup*(c.NumExperts/c.NGroup) < c.NumExpertsPerTok:
		return errorf("topk_group (%d) groups of %d experts hold fewer than num_experts_per_tok (%d); raise topk_group", c.TopKGroup, c.NumExperts/c.NGroup, c.NumExpertsPerTok)
	case c.NGroup > 1 && c.NumExperts/c.NGroup < 2:
		return errorf("n_group (%d) leaves one expert per group; transformers scores a group by its two best experts, so each group needs at least 2 (lower n_group)", c.NGroup)
	case c.NSharedExperts < 0:
		return errorf("n_shared_experts (%d) must not be negative", c.NSharedExperts)
	}
	if err := positiveFloats("routed_scaling_factor", c.RoutedScalingFactor); err != nil {
		return err
	}
	// Keys of the Hub checkpoints that transformers keeps as attributes and never reads: a
	// value other than the one its code implements describes a different model.
	for _, k := range []struct{ key, want string }{{"scoring_func", `"sigmoid"`}, {"topk_method", `"noaux_tc"`}, {"moe_layer_freq", "1"}} {
		if raw, ok := c.Extra(k.key); ok && !isNull(raw) && !jsonEqual(raw, []byte(k.want)) {
			return errorf("%s %s is not supported: %s computes %s = %s (remove the key or set it to that)", k.key, strings.TrimSpace(string(raw)), c.ModelType, k.key, k.want)
		}
	}
	// DeepSeek-V3's published weights are fp8 blocks with per-block scales (weight_scale_inv),
	// which nothing here reads: loading them as plain floats would be another model.
	if raw, ok := c.Extra("quantization_config"); ok && !isNull(raw) {
		var q struct {
			Method string `json:"quant_method"`
		}
		if err := json.Unmarshal(raw, &q); err != nil || q.Method != "bitsandbytes" {
			return errorf("quantization_config with quant_method %q is not supported for %s (fp8 block-quantised weights are not read): convert the checkpoint to bf16 and remove quantization_config", q.Method, c.ModelType)
		}
	}
	return nil
}

// extraInt reads an integer key kept from the source (not a field), if present.
func (c *Config) extraInt(key string) (int, bool, error) {
	raw, ok := c.Extra(key)
	if !ok || isNull(raw) {
		return 0, false, nil
	}
	var v json.Number
	if err := json.Unmarshal(raw, &v); err != nil {
		return 0, true, errorf("key %q: expected an integer, got %s", key, raw)
	}
	n, err := decodeInt(key, []byte(v.String()))
	return n, true, err
}

// LatentShape is the structure of multi-head latent attention (Shape.Latent): the query rank
// (0: a plain q_proj), the compressed key/value rank, and each head's unrotated (Nope) and
// rotated (Rope) query/key dims and value dims.
type LatentShape struct {
	QRank, KVRank, Nope, Rope, V int
}

// QKHead is a query or key head's width, Nope + Rope.
func (l LatentShape) QKHead() int { return l.Nope + l.Rope }

// AttentionWidth is the head width the attention op runs at, max(QKHead, V) (nn.MLA pads the
// narrower heads with zeros).
func (l LatentShape) AttentionWidth() int { return max(l.QKHead(), l.V) }

// ActivationsPerToken is the activation elements one latent-attention layer keeps per token
// for nh heads (nn.MLA's cache): the query projection and its norm (2 QRank), the compressed kv
// and its norm (2 KVRank), q, k, v and the attention output at the attention width, and the
// output at the value width when it differs.
func (l LatentShape) ActivationsPerToken(nh int) int64 {
	d, n := int64(l.AttentionWidth()), int64(nh)
	a := 2*int64(l.QRank) + 2*int64(l.KVRank) + 4*n*d
	if l.V != l.AttentionWidth() {
		a += n * int64(l.V)
	}
	return a
}

// Parameters counts one layer's attention parameters for h hidden and nh heads: q_a_proj,
// q_a_layernorm and q_b_proj (or q_proj), kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj and
// o_proj, with the biases of q_a_proj and kv_a_proj_with_mqa (bias) and o_proj (obias).
func (l LatentShape) Parameters(h, nh int64, bias, obias bool) int64 {
	qk, kvr, qr, rope, v := int64(l.QKHead()), int64(l.KVRank), int64(l.QRank), int64(l.Rope), int64(l.V)
	var n int64
	if qr > 0 {
		n += h*qr + qr + qr*nh*qk
		if bias {
			n += qr
		}
	} else {
		n += h * nh * qk
	}
	n += h*(kvr+rope) + kvr + kvr*nh*(int64(l.Nope)+v) + nh*v*h
	if bias {
		n += kvr + rope
	}
	if obias {
		n += h
	}
	return n
}
