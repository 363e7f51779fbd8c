package config

import (
	"fmt"
	"math"
)

// phimoe: PhimoeConfig (Phi-3.5-MoE). Mixtral's layout (block_sparse_moe with
// num_local_experts SwiGLU experts w1/w3/w2 and a gate router) with nn.LayerNorm (weight and
// bias, eps rms_norm_eps) in place of every RMSNorm, optional biases on q/k/v/o
// (attention_bias) and on lm_head (lm_head_bias), and the sparsemixer router: two experts chosen
// in two stages, router_jitter_noise being the stages' relative threshold. Rotary embedding
// default or longrope. Under longrope transformers 5's PhimoeRotaryEmbedding computes the
// frequencies without the sequence length, so short_factor applies at every length and
// long_factor never does, and multiplies cos and sin by short_mscale or long_mscale
// (rope_parameters; long_mscale once the batch's longest position + 1 exceeds
// original_max_position_embeddings) instead of the longrope attention factor.
func init() {
	Register(Family{
		ModelType:     "phimoe",
		Architectures: []string{"PhimoeForCausalLM", "PhimoeModel"},
		Keys: []string{"attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "hidden_act",
			"hidden_size", "initializer_range", "input_jitter_noise", "intermediate_size", "lm_head_bias",
			"max_position_embeddings", "num_attention_heads", "num_experts_per_tok", "num_hidden_layers",
			"num_key_value_heads", "num_local_experts", "output_router_logits",
			"pad_token_id", "rms_norm_eps", "router_aux_loss_coef", "router_jitter_noise", "sliding_window",
			"tie_word_embeddings", "use_cache", "vocab_size"},
		Optional: []string{"head_dim"},
		// PhimoeConfig copies rope_scaling's original_max_position_embeddings to an attribute,
		// which its files then carry; the model reads the rope dictionary's.
		Kept:             []string{"original_max_position_embeddings"},
		RopeKept:         []string{"short_mscale", "long_mscale"},
		DefaultRopeTheta: 1e6,
		Defaults: func(c *Config) {
			c.VocabSize = 32064
			c.HiddenSize = 4096
			c.IntermediateSize = 6400
			c.NumHiddenLayers = 32
			c.NumAttentionHeads = 32
			c.NumKeyValueHeads = 8
			c.MaxPositionEmbeddings = 4096 * 32
			c.RMSNormEps = 1e-5
			c.BOSTokenID = IntPtr(1)
			c.EOSTokenIDs = []int{2}
			c.NumExperts = 16
			c.NumExpertsPerTok = 2
			c.RouterAuxLossCoef = 0.001
			c.RouterJitterNoise = 0.01
		},
		Validate: func(c *Config) error {
			if err := refuseUnknown(c); err != nil {
				return err
			}
			if c.Rope.Type != "default" && c.Rope.Type != "longrope" {
				return fmt.Errorf("rope_type %q is not one phimoe has; use \"default\" or \"longrope\"", c.Rope.Type)
			}
			if c.Rope.Type == "longrope" {
				if _, err := phimoeMScale(c); err != nil {
					return err
				}
			}
			if c.InputJitterNoise != 0 {
				return fmt.Errorf("input_jitter_noise %v scales the MoE inputs by random noise in training, which is not reproduced here; set it to 0.0", c.InputJitterNoise)
			}
			if c.NumExpertsPerTok != 2 {
				return fmt.Errorf("num_experts_per_tok %d: the sparsemixer router always picks 2 experts; set it to 2", c.NumExpertsPerTok)
			}
			if c.NumExperts < 2 {
				return fmt.Errorf("num_local_experts %d: the sparsemixer router needs at least 2 experts", c.NumExperts)
			}
			return nil
		},
		MoELayer:             func(c *Config, i int) bool { return c.NumExperts > 0 },
		SparseMixer:          true,
		LayerNorm:            true,
		RopeAttentionFactor:  phimoeAttentionFactor,
		RopeShortFactorsOnly: true,
		Presets: map[string]func(*Config){
			"tiny": tiny,
			// microsoft/Phi-3.5-MoE-instruct, without its longrope tables.
			"phi-3.5-moe": func(c *Config) {
				c.AttentionBias = true
				c.LMHeadBias = true
				c.SlidingWindow = 131072
				c.EOSTokenIDs = []int{32000}
				c.DType = "bfloat16"
			},
		},
	})
}

// phimoeMScale returns the factor PhimoeRotaryEmbedding multiplies cos and sin by under
// longrope: short_mscale up to original_max_position_embeddings tokens, long_mscale past it.
// The model here applies one factor at every length, so the two must be equal (they are in
// Phi-3.5-MoE's files); a file with two different ones is refused.
func phimoeMScale(c *Config) (float64, error) {
	var v [2]float64
	for i, key := range []string{"short_mscale", "long_mscale"} {
		raw, ok := c.Rope.keptRaw(key)
		if !ok {
			return 0, fmt.Errorf("rope_parameters.%s is missing: phimoe's longrope needs short_mscale and long_mscale", key)
		}
		f, _, err := decodeFloat("rope_parameters."+key, raw)
		if err != nil {
			return 0, err
		}
		if !(f > 0) || math.IsInf(f, 0) {
			return 0, fmt.Errorf("rope_parameters.%s is %v; it must be a finite positive number", key, f)
		}
		v[i] = f
	}
	if v[0] != v[1] {
		return 0, fmt.Errorf("rope_parameters.short_mscale %v and long_mscale %v differ: the model applies one longrope scale at every length; make them equal", v[0], v[1])
	}
	return v[0], nil
}

// phimoeAttentionFactor is RopeAttentionFactor of phimoe: the mscale under longrope (checked by
// Validate), 0 (the rope type's own, 1 for default) otherwise.
func phimoeAttentionFactor(c *Config) float64 {
	if c.Rope.Type != "longrope" {
		return 0
	}
	f, err := phimoeMScale(c)
	if err != nil {
		return 0
	}
	return f
}

// keptRaw returns a rope_parameters key kept as read (Family.RopeKept), and whether it is there.
func (r *Rope) keptRaw(key string) ([]byte, bool) {
	for _, kv := range r.extra {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return nil, false
}
