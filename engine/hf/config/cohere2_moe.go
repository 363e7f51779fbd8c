package config

import (
	"bytes"
	"fmt"
	"slices"
)

// cohere2_moe: Cohere2MoeConfig (Cohere's Command-A Plus checkpoints). Cohere2's parallel
// decoder layer — one norm (a LayerNorm without bias, eps layer_norm_eps, or an RMSNorm when
// rms_norm_eps is set) whose output feeds both the attention and the feed-forward block, both
// added to the residual — with interleaved rotary pairs applied on the sliding_attention layers
// only (and on the dense layers when prefix_dense_sliding_window_pattern is 1), logits
// multiplied by logit_scale, and in the layers mlp_layer_types marks sparse num_experts
// SwiGLU experts of intermediate_size: the top num_experts_per_tok router logits through a
// softmax (renormalised by construction) or a sigmoid (renormalised under norm_topk_prob),
// beside a shared SwiGLU MLP of num_shared_experts * intermediate_size added to them (sum) or
// averaged with them (average). Dense layers are prefix_dense_intermediate_size wide
// (intermediate_size when null).
//
// When layer_types is absent it is derived from first_k_dense_replace (a key transformers pops,
// and does not write back): the first k layers follow prefix_dense_sliding_window_pattern, the
// others sliding_window_pattern, every pattern-th layer (1-based) being full attention; an
// absent mlp_layer_types makes the first k layers dense, the others sparse. transformers has no
// load-balancing loss for the family and no output_router_logits key; the key is refused.
func init() {
	Register(Family{
		ModelType:     "cohere2_moe",
		Architectures: []string{"Cohere2MoeForCausalLM", "Cohere2MoeModel"},
		Keys: []string{"attention_bias", "attention_dropout", "bos_token_id", "eos_token_id",
			"expert_selection_fn", "head_dim", "hidden_act", "hidden_size", "initializer_range",
			"intermediate_size", "layer_norm_eps", "layer_types", "logit_scale", "max_position_embeddings",
			"mlp_layer_types", "norm_topk_prob", "num_attention_heads", "num_experts", "num_experts_per_tok",
			"num_hidden_layers", "num_key_value_heads", "num_shared_experts", "pad_token_id",
			"prefix_dense_intermediate_size", "prefix_dense_sliding_window_pattern", "rms_norm_eps",
			"shared_expert_combination_strategy", "sliding_window", "sliding_window_pattern",
			"tie_word_embeddings", "use_cache", "vocab_size"},
		FieldTypes:       cohereFields,
		DefaultRopeTheta: 10000.0,
		Defaults: func(c *Config) {
			c.VocabSize = 256000
			c.HiddenSize = 8192
			c.IntermediateSize = 22528
			c.LogitScale = 0.0625
			c.NumHiddenLayers = 40
			c.NumAttentionHeads = 64
			c.HeadDim = 128
			c.MaxPositionEmbeddings = 8192
			c.LayerNormEps = 1e-5
			c.PadTokenID, c.BOSTokenID, c.EOSTokenIDs = IntPtr(0), IntPtr(5), []int{255001}
			c.TieWordEmbeddings = true
			c.SlidingWindow = 4096
			c.NumExpertsPerTok = 2
			c.NumExperts = 8
			c.SharedExpertCombinationStrategy = "average"
			c.ExpertSelectionFn = "softmax"
			c.PrefixDenseSlidingWindowPattern = 1
			c.NormTopKProb = true
			c.SlidingWindowPattern = 4
		},
		// Cohere2MoeConfig declares rope_theta as a field of its own, which transformers writes
		// beside rope_parameters and which its rotary setup reads when rope_parameters lacks it;
		// written with rope_parameters' value, the file gives one base whichever is read.
		WriteExtra: func(c *Config, out pyObject) {
			out["rope_theta"] = floatValue(c.Rope.Theta, c.intLit["rope_parameters.rope_theta"])
			// Its rope_scaling attribute too, None for the default rope (the only type the
			// family takes).
			out["rope_scaling"] = nil
		},
		Resolve:  resolveCohere2MoE,
		Validate: validateCohere2MoE,
		MoELayer: func(c *Config, i int) bool {
			return c.NumExperts > 0 && i < len(c.MLPLayerTypes) && c.MLPLayerTypes[i] == "sparse"
		},
		Norms:      ParallelNorm,
		CenterNorm: func(c *Config) bool { return c.CohereRMSNormEps == 0 },
		NormEps: func(c *Config) float64 {
			if c.CohereRMSNormEps > 0 {
				return c.CohereRMSNormEps
			}
			return c.LayerNormEps
		},
		DenseIntermediate: func(c *Config) int {
			if c.PrefixDenseIntermediateSize > 0 {
				return c.PrefixDenseIntermediateSize
			}
			return c.IntermediateSize
		},
		RoPELayer: func(c *Config, i int) bool {
			dense := i < len(c.MLPLayerTypes) && c.MLPLayerTypes[i] == "dense"
			return c.IsSlidingLayer(i) || (dense && c.PrefixDenseSlidingWindowPattern == 1)
		},
		SharedExpert: func(c *Config) (int, bool) {
			return c.NumSharedExperts * c.IntermediateSize, false
		},
		Presets: map[string]func(*Config){
			"tiny": func(c *Config) {
				tiny(c)
				c.SlidingWindow = 8
				c.SlidingWindowPattern = 2 // a sliding layer, then a full one
				c.NumSharedExperts = 1
			},
		},
	})
}

// Cohere2MoE holds cohere2_moe's keys (cohere2_moe.go); a family that lacks a key leaves its
// field at the zero value, which is not written.
type Cohere2MoE struct {
	// LogitScale multiplies the LM head's logits. Default 0.0625.
	LogitScale float64
	// LayerNormEps is the epsilon of the LayerNorms (used when rms_norm_eps is null). Default
	// 1e-5.
	LayerNormEps float64
	// CohereRMSNormEps is cohere2_moe's rms_norm_eps: set, every norm is an RMSNorm of that
	// epsilon; 0 (null, the default) keeps the LayerNorms. RMSNormEps holds the epsilon the
	// norms use either way.
	CohereRMSNormEps float64
	// NumSharedExperts sizes the shared expert: one SwiGLU MLP of NumSharedExperts *
	// intermediate_size (0: none). Default 0.
	NumSharedExperts int
	// SharedExpertCombinationStrategy joins the shared and the routed output: "sum" or
	// "average". Default "average".
	SharedExpertCombinationStrategy string
	// ExpertSelectionFn turns the top-k router logits into weights: "softmax" or "sigmoid".
	// Default "softmax".
	ExpertSelectionFn string
	// PrefixDenseSlidingWindowPattern is the sliding pattern of the first_k_dense_replace
	// layers when layer_types is derived; 1 also rotates every dense layer's queries and keys.
	// Default 1.
	PrefixDenseSlidingWindowPattern int
	// PrefixDenseIntermediateSize is the dense layers' MLP width; 0 (null, the default) means
	// intermediate_size.
	PrefixDenseIntermediateSize int
}

// cohereFields are cohere2_moe's types of keys other families type differently: a nullable
// rms_norm_eps, which selects the norm.
var cohereFields = map[string]field{
	"rms_norm_eps": {kFloat, true, func(c *Config) any { return &c.CohereRMSNormEps }},
}

// The keys of Cohere2MoE, added to the package's field table before any family registers.
var _ = addFields(map[string]field{
	"logit_scale":                         {kFloat, false, func(c *Config) any { return &c.LogitScale }},
	"layer_norm_eps":                      {kFloat, false, func(c *Config) any { return &c.LayerNormEps }},
	"num_shared_experts":                  {kInt, false, func(c *Config) any { return &c.NumSharedExperts }},
	"shared_expert_combination_strategy":  {kString, false, func(c *Config) any { return &c.SharedExpertCombinationStrategy }},
	"expert_selection_fn":                 {kString, false, func(c *Config) any { return &c.ExpertSelectionFn }},
	"prefix_dense_sliding_window_pattern": {kInt, false, func(c *Config) any { return &c.PrefixDenseSlidingWindowPattern }},
	"prefix_dense_intermediate_size":      {kInt, true, func(c *Config) any { return &c.PrefixDenseIntermediateSize }},
})

// resolveCohere2MoE is Cohere2MoeConfig.__post_init__: first_k_dense_replace is popped from
// the file's keys (and kept in FirstKDenseReplace for the derivations, which follow later
// changes of the fields they depend on), layer_types and mlp_layer_types are derived when
// absent, and RMSNormEps becomes the epsilon of the norms the model builds.
func resolveCohere2MoE(c *Config) {
	for i, kv := range c.extra {
		if kv.Key != "first_k_dense_replace" {
			continue
		}
		if v, err := decodeInt("first_k_dense_replace", kv.Value); err == nil && !isNull(bytes.TrimSpace(kv.Value)) {
			c.FirstKDenseReplace = v
			c.extra = slices.Delete(c.extra, i, i+1)
		}
		break
	}
	k := c.FirstKDenseReplace
	c.RMSNormEps = c.NormEpsilon()
	// A zero pattern raises ZeroDivisionError in transformers; Validate refuses it, and the
	// rule here keeps every such layer sliding rather than divide by zero.
	full := func(pos, pattern int) bool { return pattern > 0 && pos%pattern == 0 }
	deriveLayerTypesBy(c, func(i int) bool {
		if i < k {
			return !full(i+1, c.PrefixDenseSlidingWindowPattern)
		}
		return !full(i-k+1, c.SlidingWindowPattern)
	})
	if c.MLPLayerTypes == nil || (c.Latent.mlpDerived && slices.Equal(c.MLPLayerTypes, c.Latent.mlpFrom)) {
		lt := make([]string, c.NumHiddenLayers)
		for i := range lt {
			lt[i] = "sparse"
			if i < k {
				lt[i] = "dense"
			}
		}
		c.MLPLayerTypes, c.Latent.mlpDerived, c.Latent.mlpFrom = lt, true, slices.Clone(lt)
	}
}

// validateCohere2MoE checks cohere2_moe's keys and refuses what the model does not implement.
func validateCohere2MoE(c *Config) error {
	if raw, ok := c.Extra("first_k_dense_replace"); ok {
		// Resolve consumes an integer; what is left is not one.
		return fmt.Errorf("first_k_dense_replace is %s; it must be an integer (the number of leading dense layers)", raw)
	}
	if err := refuseUnknown(c); err != nil {
		return err
	}
	if c.FirstKDenseReplace < 0 || c.FirstKDenseReplace > c.NumHiddenLayers {
		return fmt.Errorf("first_k_dense_replace (%d) must be between 0 and num_hidden_layers (%d)", c.FirstKDenseReplace, c.NumHiddenLayers)
	}
	if len(c.MLPLayerTypes) != c.NumHiddenLayers {
		return fmt.Errorf("mlp_layer_types has %d entries but num_hidden_layers is %d: give one entry per layer", len(c.MLPLayerTypes), c.NumHiddenLayers)
	}
	for i, t := range c.MLPLayerTypes {
		if t != "dense" && t != "sparse" {
			return fmt.Errorf("mlp_layer_types[%d] is %q; use \"dense\" or \"sparse\"", i, t)
		}
	}
	for _, p := range []struct {
		key string
		v   int
	}{{"sliding_window_pattern", c.SlidingWindowPattern}, {"prefix_dense_sliding_window_pattern", c.PrefixDenseSlidingWindowPattern}} {
		if p.v < 1 {
			return fmt.Errorf("%s (%d) must be at least 1: every %s-th layer is full attention", p.key, p.v, p.key)
		}
	}
	if c.CohereRMSNormEps < 0 || c.CohereRMSNormEps >= 1 {
		return fmt.Errorf("rms_norm_eps (%g) must be in (0, 1), or null for LayerNorms of layer_norm_eps", c.CohereRMSNormEps)
	}
	if c.CohereRMSNormEps == 0 && !(c.LayerNormEps > 0 && c.LayerNormEps < 1) {
		return fmt.Errorf("layer_norm_eps (%g) must be in (0, 1), typically 1e-5", c.LayerNormEps)
	}
	if f := c.Rope.PartialRotaryFactor; f != 0 && f != 1 {
		// Cohere2MoeRotaryEmbedding's default frequencies span head_dim whatever the factor.
		return fmt.Errorf("partial_rotary_factor %g is not read by transformers' Cohere2-MoE rotary embedding, which rotates all of each head; remove it", f)
	}
	if c.LogitScale == 0 {
		return fmt.Errorf("logit_scale 0 makes every logit zero (transformers multiplies the logits by it); set it to the checkpoint's value, 1.0 for none")
	}
	if c.ExpertSelectionFn != "softmax" && c.ExpertSelectionFn != "sigmoid" {
		return fmt.Errorf("expert_selection_fn %q is not one transformers has; use \"softmax\" or \"sigmoid\"", c.ExpertSelectionFn)
	}
	if c.SharedExpertCombinationStrategy != "sum" && c.SharedExpertCombinationStrategy != "average" {
		return fmt.Errorf("shared_expert_combination_strategy %q is not one transformers has; use \"sum\" or \"average\"", c.SharedExpertCombinationStrategy)
	}
	if c.NumSharedExperts < 0 || int64(c.NumSharedExperts)*int64(c.IntermediateSize) > maxDim {
		return fmt.Errorf("num_shared_experts (%d) must be between 0 and %d", c.NumSharedExperts, maxDim/max(c.IntermediateSize, 1))
	}
	if c.PrefixDenseIntermediateSize < 0 || c.PrefixDenseIntermediateSize > maxDim {
		return fmt.Errorf("prefix_dense_intermediate_size (%d) must be a positive size, or null for intermediate_size", c.PrefixDenseIntermediateSize)
	}
	return nil
}

// NormEpsilon is the epsilon of the model's norms: the family's (Family.NormEps) where it has
// its own keys for it, else rms_norm_eps. It follows those keys also when they are changed in
// code after the config was resolved.
func (c *Config) NormEpsilon() float64 {
	if f := c.Family(); f != nil && f.NormEps != nil {
		return f.NormEps(c)
	}
	return c.RMSNormEps
}
