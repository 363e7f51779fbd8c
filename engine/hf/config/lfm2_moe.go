package config

import "fmt"

// ConvLayer is the layer_types value of LFM2's short-convolution layers.
const ConvLayer = "conv"

// LFM2 holds the keys of lfm2_moe (Lfm2MoeConfig) beyond the Llama decoder's: the short
// convolution of its conv layers and the layout of its mixture of experts.
type LFM2 struct {
	// ConvBias: the conv layers' in_proj, depthwise conv and out_proj carry biases
	// (conv_bias). Default false.
	ConvBias bool
	// ConvLCache is the depthwise convolution's number of taps (conv_L_cache). Default 3.
	ConvLCache int
	// NumDenseLayers: the first NumDenseLayers layers have a dense SwiGLU MLP, the others the
	// mixture of experts (num_dense_layers). Default 2.
	NumDenseLayers int
	// UseExpertBias: the router adds a selection-only bias [E] (the expert_bias buffer) to the
	// sigmoid scores it ranks (use_expert_bias). Default true.
	UseExpertBias bool
}

var _ = addFields(map[string]field{
	"norm_eps":         {kFloat, false, func(c *Config) any { return &c.RMSNormEps }},
	"conv_bias":        {kBool, false, func(c *Config) any { return &c.ConvBias }},
	"conv_L_cache":     {kInt, false, func(c *Config) any { return &c.ConvLCache }},
	"num_dense_layers": {kInt, false, func(c *Config) any { return &c.NumDenseLayers }},
	"use_expert_bias":  {kBool, false, func(c *Config) any { return &c.UseExpertBias }},
})

// lfm2_moe: Lfm2MoeConfig (LiquidAI LFM2-8B-A1B). layer_types names each layer's operator:
// "full_attention" layers are GQA attention with per-head q/k RMSNorms (q_layernorm,
// k_layernorm) and RoPE, "conv" layers a gated short convolution (in_proj to B, C and x;
// y = out_proj(C * causal depthwise conv(B * x)) with conv_L_cache taps). Each layer has
// operator_norm before the operator and ffn_norm before the feed-forward block, which is a
// SwiGLU MLP (w1, w3, w2) of intermediate_size in the first num_dense_layers layers and a
// mixture of num_experts experts of moe_intermediate_size after them, under a sigmoid router
// whose expert_bias (use_expert_bias) chooses only, with weights renormalised
// (norm_topk_prob) and scaled by routed_scaling_factor. The final norm is
// model.embedding_norm; the epsilon of every norm is norm_eps. transformers builds no layer
// without layer_types, so the model refuses a config without it.
func init() {
	Register(Family{
		ModelType:     "lfm2_moe",
		Architectures: []string{"Lfm2MoeForCausalLM", "Lfm2MoeModel"},
		Keys: []string{"bos_token_id", "conv_L_cache", "conv_bias", "eos_token_id", "hidden_size",
			"initializer_range", "intermediate_size", "layer_types", "max_position_embeddings",
			"moe_intermediate_size", "norm_eps", "norm_topk_prob", "num_attention_heads", "num_dense_layers",
			"num_experts", "num_experts_per_tok", "num_hidden_layers", "num_key_value_heads", "pad_token_id",
			"routed_scaling_factor", "tie_word_embeddings", "use_cache", "use_expert_bias", "vocab_size"},
		LayerTypes: []string{FullAttention, ConvLayer},
		// Lfm2MoeConfig pops tie_embedding (the original release's name) into
		// tie_word_embeddings.
		Aliases:          map[string]string{"tie_embedding": "tie_word_embeddings"},
		DefaultRopeTheta: 1e6,
		Defaults: func(c *Config) {
			c.VocabSize = 65536
			c.HiddenSize = 2048
			c.IntermediateSize = 7168
			c.MoEIntermediateSize = 1792
			c.NumHiddenLayers = 32
			c.PadTokenID, c.BOSTokenID, c.EOSTokenIDs = IntPtr(0), IntPtr(1), []int{2}
			c.TieWordEmbeddings = true
			c.MaxPositionEmbeddings = 128000
			c.RMSNormEps = 1e-5
			c.NumAttentionHeads = 32
			c.NumKeyValueHeads = 8
			c.ConvLCache = 3
			c.NumDenseLayers = 2
			c.NumExpertsPerTok = 4
			c.NumExperts = 32
			c.UseExpertBias = true
			c.RoutedScalingFactor = 1.0
			c.NormTopKProb = true
		},
		Validate: func(c *Config) error {
			if err := refuseUnknown(c); err != nil {
				return err
			}
			switch {
			case c.ConvLCache < 1 || c.ConvLCache > 1<<10:
				return fmt.Errorf("conv_L_cache (%d) must be in [1, 1024] (the short convolution's taps)", c.ConvLCache)
			case c.NumDenseLayers < 0:
				return fmt.Errorf("num_dense_layers (%d) must not be negative", c.NumDenseLayers)
			}
			return positiveFloats("routed_scaling_factor", c.RoutedScalingFactor)
		},
		MoELayer:   func(c *Config, i int) bool { return c.NumExperts > 0 && i >= c.NumDenseLayers },
		QKNorm:     QKNormPerHead,
		RouterBias: func(c *Config) bool { return c.UseExpertBias },
		Presets: map[string]func(*Config){
			// A conv layer then an attention layer, one dense layer first, the expert bias on.
			"tiny": func(c *Config) {
				tiny(c)
				c.NumHiddenLayers = 3
				c.LayerTypes = []string{ConvLayer, FullAttention, ConvLayer}
				c.src["layer_types"] = true
				c.HeadDim = 0
				c.NumDenseLayers = 1
				c.RoutedScalingFactor = 1.5
				c.ConvBias = true
			},
		},
	})
}

// IsConvLayer reports whether layer i is a short-convolution layer (lfm2_moe's "conv").
func (c *Config) IsConvLayer(i int) bool {
	return i >= 0 && i < len(c.LayerTypes) && c.LayerTypes[i] == ConvLayer
}
