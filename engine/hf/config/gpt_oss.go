package config

import (
	"fmt"
	"math"
)

// gpt_oss: GptOssConfig (openai/gpt-oss-20b and -120b). Attention with q/k/v/o biases, a
// learned sink logit per head and alternating sliding (sliding_window tokens) and full layers
// (layer_types; when absent, even layers slide); yarn RoPE (factor 32 over 4096 positions,
// truncate false) by default; a mixture of num_local_experts experts in every layer, routed by
// a linear router with a bias (softmax over the top num_experts_per_tok logits), whose experts
// apply a clamped SwiGLU with biases: gate clamped above at 7.0, up clamped to ±7.0, out =
// (up + 1) * gate * sigmoid(1.702 * gate). swiglu_limit (in the Hub's files) and swiglu_alpha
// are kept and written back when the source has them, as transformers 5.x does (its config has
// no such attributes); its model applies those constants whatever the keys hold, and so does
// engine/models.
//
// The Hub's config.json also carries experts_per_token and initial_context_length from the
// original release, read as informational keys; other unknown keys are refused.
func init() {
	Register(Family{
		ModelType:     "gpt_oss",
		Architectures: []string{"GptOssForCausalLM", "GptOssModel"},
		Keys: []string{"attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "head_dim",
			"hidden_act", "hidden_size", "initializer_range", "intermediate_size", "layer_types",
			"max_position_embeddings", "num_attention_heads", "num_experts_per_tok", "num_hidden_layers",
			"num_key_value_heads", "num_local_experts", "output_router_logits", "pad_token_id",
			"rms_norm_eps", "router_aux_loss_coef", "sliding_window", "tie_word_embeddings",
			"use_cache", "vocab_size"},
		Optional:         []string{"swiglu_limit", "swiglu_alpha", "experts_per_token", "initial_context_length"},
		Aliases:          map[string]string{"num_experts": "num_local_experts"},
		DefaultRopeTheta: 150000,
		Sinks:            true,
		ExpertBias:       true,
		Defaults: func(c *Config) {
			c.NumHiddenLayers = 36
			c.NumExperts = 128
			c.VocabSize = 201088
			c.HiddenSize = 2880
			c.IntermediateSize = 2880
			c.HeadDim = 64
			c.NumAttentionHeads = 64
			c.NumKeyValueHeads = 8
			c.SlidingWindow = 128
			c.InitializerRange = 0.02
			c.MaxPositionEmbeddings = 131072
			c.RMSNormEps = 1e-5
			c.NumExpertsPerTok = 4
			c.SwigluLimit, c.SwigluAlpha = 7, 1.702
			c.RouterAuxLossCoef = 0.001
			c.AttentionBias = true
		},
		Resolve: func(c *Config) {
			c.NormTopKProb = true // softmax over the top-k logits: the renormalised top-k probabilities
			if len(c.Rope.src) == 0 && c.Rope.Type == "default" && c.Rope.Factor == 0 {
				// No rope key in the file: transformers' default rope_parameters.
				f := false
				c.Rope.Type, c.Rope.Factor, c.Rope.BetaFast, c.Rope.BetaSlow = "yarn", 32, 32, 1
				c.Rope.OriginalMaxPositionEmbeddings, c.Rope.Truncate = 4096, &f
			}
			deriveLayerTypesBy(c, func(i int) bool { return (i+1)%2 != 0 })
		},
		Validate: func(c *Config) error {
			if err := refuseUnknown(c); err != nil {
				return err
			}
			if !(c.SwigluLimit > 0) || math.IsInf(c.SwigluLimit, 0) {
				return fmt.Errorf("swiglu_limit (%g) must be positive (gpt-oss uses 7.0)", c.SwigluLimit)
			}
			if !(c.SwigluAlpha > 0) || math.IsInf(c.SwigluAlpha, 0) {
				return fmt.Errorf("swiglu_alpha (%g) must be positive (gpt-oss uses 1.702)", c.SwigluAlpha)
			}
			return nil
		},
		MoELayer: func(c *Config, i int) bool { return c.NumExperts > 0 },
		Presets: map[string]func(*Config){
			"tiny": func(c *Config) {
				tiny(c)
				c.SlidingWindow = 8
				c.src["swiglu_limit"] = true // written, as the Hub's files do
			},
			// openai/gpt-oss-20b
			"gpt-oss-20b": func(c *Config) {
				c.NumHiddenLayers = 24
				c.NumExperts = 32
				c.EOSTokenIDs = []int{200002}
				c.PadTokenID = IntPtr(199999)
				c.RouterAuxLossCoef = 0.9
				c.ExpertsPerToken, c.InitialContextLength = 4, 4096
				c.src["experts_per_token"], c.src["initial_context_length"], c.src["swiglu_limit"] = true, true, true
				c.DType = "bfloat16"
				c.Rope.Theta = 150000
				c.setIntLiteral("rope_parameters.rope_theta")
			},
		},
	})
}
