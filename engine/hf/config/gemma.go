package config

import (
	"fmt"
	"math"
)

// gemma3_text: Gemma3TextConfig, the decoder of Gemma 3 (Gemma3ForCausalLM checkpoints such as
// google/gemma-3-1b-pt and -270m). Layers follow layer_types (when absent: every
// sliding_window_pattern-th layer, 1-based, is full attention and the others slide over
// sliding_window tokens); rope_parameters holds one dictionary per layer type (4.x files:
// rope_theta and rope_scaling for the full layers, rope_local_base_freq for the sliding ones).
// Queries and keys are RMS-normalised per head; scores are scaled by query_pre_attn_scalar^-0.5;
// each layer has four RMSNorms (input, post-attention, pre- and post-feedforward); the MLP is
// gated by hidden_activation (gelu_pytorch_tanh); final_logit_softcapping and
// attn_logit_softcapping cap logits and scores with tanh when set.
//
// Keys this package does not know are refused (Validate) rather than kept, since any of them
// could change the model.
func init() {
	Register(Family{
		ModelType:     "gemma3_text",
		Architectures: []string{"Gemma3ForCausalLM", "Gemma3TextModel"},
		Keys: []string{"_sliding_window_pattern", "attention_bias", "attention_dropout", "attn_logit_softcapping", "bos_token_id",
			"eos_token_id", "final_logit_softcapping", "head_dim", "hidden_activation", "hidden_size",
			"initializer_range", "intermediate_size", "layer_types", "max_position_embeddings",
			"num_attention_heads", "num_hidden_layers", "num_key_value_heads", "pad_token_id",
			"query_pre_attn_scalar", "rms_norm_eps", "sliding_window", "tie_word_embeddings",
			"use_bidirectional_attention", "use_cache", "vocab_size"},
		Optional:                []string{"sliding_window_pattern", "cache_implementation"},
		DefaultRopeTheta:        1e6,
		RopePerLayerType:        true,
		DefaultSlidingRopeTheta: 1e4,
		SlidingRopeThetaKey:     "rope_local_base_freq",
		Norms:                   SandwichNorms,
		QKNorm:                  QKNormPerHead,
		Defaults: func(c *Config) {
			c.VocabSize = 262208
			c.HiddenSize = 2304
			c.IntermediateSize = 9216
			c.NumHiddenLayers = 26
			c.NumAttentionHeads = 8
			c.NumKeyValueHeads = 4
			c.HeadDim = 256
			c.HiddenAct = "gelu_pytorch_tanh"
			c.MaxPositionEmbeddings = 131072
			c.PadTokenID = IntPtr(0)
			c.EOSTokenIDs = []int{1}
			c.BOSTokenID = IntPtr(2)
			c.TieWordEmbeddings = true
			c.QueryPreAttnScalar = 256
			c.setIntLiteral("query_pre_attn_scalar")
			c.SlidingWindow = 4096
			c.SlidingWindowPattern = 6
		},
		Resolve: func(c *Config) {
			p := c.SlidingWindowPattern
			if !c.src["_sliding_window_pattern"] || c.src["sliding_window_pattern"] {
				c.SavedSlidingWindowPattern = p
			}
			deriveLayerTypesBy(c, func(i int) bool { return p > 0 && (i+1)%p != 0 })
		},
		Validate: validateGemma,
		Presets: map[string]func(*Config){
			"tiny": func(c *Config) {
				tiny(c)
				c.QueryPreAttnScalar = 16
				c.SlidingWindow = 8
				c.SlidingWindowPattern = 2
				c.src["sliding_window_pattern"] = true // written, so that edits re-derive layer_types by it
				c.PadTokenID = IntPtr(0)
			},
			// google/gemma-3-1b-pt
			"gemma-3-1b": func(c *Config) {
				c.VocabSize = 262144
				c.HiddenSize = 1152
				c.IntermediateSize = 6912
				c.NumHiddenLayers = 26
				c.NumAttentionHeads = 4
				c.NumKeyValueHeads = 1
				c.HeadDim = 256
				c.MaxPositionEmbeddings = 32768
				c.SlidingWindow = 512
				c.CacheImplementation = "hybrid"
				c.src["cache_implementation"], c.src["sliding_window_pattern"] = true, true
				c.DType = "bfloat16"
				c.setIntLiteral("rope_parameters." + FullAttention + ".rope_theta")
				c.setIntLiteral("rope_parameters." + SlidingAttention + ".rope_theta")
			},
		},
	})
}

// validateGemma checks gemma3_text's own keys, and refuses keys it does not know.
func validateGemma(c *Config) error {
	if err := refuseUnknown(c); err != nil {
		return err
	}
	if !(c.QueryPreAttnScalar > 0) || math.IsInf(c.QueryPreAttnScalar, 0) {
		return fmt.Errorf("query_pre_attn_scalar (%g) must be positive (scores are scaled by its inverse square root; Gemma 3 uses head_dim)", c.QueryPreAttnScalar)
	}
	for _, v := range []struct {
		key string
		v   float64
	}{{"final_logit_softcapping", c.FinalLogitSoftcapping}, {"attn_logit_softcapping", c.AttnLogitSoftcapping}} {
		if v.v < 0 || math.IsInf(v.v, 0) || math.IsNaN(v.v) {
			return fmt.Errorf("%s (%g) must be a positive cap, or null for none", v.key, v.v)
		}
	}
	if c.SavedSlidingWindowPattern < 0 {
		return fmt.Errorf("_sliding_window_pattern (%d) must be positive", c.SavedSlidingWindowPattern)
	}
	if c.SlidingWindowPattern < 0 {
		return fmt.Errorf("sliding_window_pattern (%d) must be positive", c.SlidingWindowPattern)
	}
	return nil
}
