package config

// granitemoe: GraniteMoeConfig (IBM Granite 3.0 MoE, PowerMoE). Granite's decoder and its
// four multipliers (embedding_multiplier, attention_multiplier in place of 1/sqrt(head_dim),
// residual_multiplier on each branch, logits divided by logits_scaling) with a sparse block in
// every layer: num_local_experts SwiGLU experts of intermediate_size, the top
// num_experts_per_tok by router logit, weighted by the softmax over those k logits (the
// renormalised softmax). An absent num_key_value_heads is num_attention_heads.
func init() {
	Register(Family{
		ModelType:     "granitemoe",
		Architectures: []string{"GraniteMoeForCausalLM", "GraniteMoeModel"},
		Keys: []string{"attention_bias", "attention_dropout", "attention_multiplier", "bos_token_id",
			"embedding_multiplier", "eos_token_id", "hidden_act", "hidden_size", "initializer_range",
			"intermediate_size", "logits_scaling", "max_position_embeddings", "num_attention_heads",
			"num_experts_per_tok", "num_hidden_layers", "num_key_value_heads", "num_local_experts",
			"output_router_logits", "pad_token_id", "residual_multiplier", "rms_norm_eps",
			"router_aux_loss_coef", "tie_word_embeddings", "use_cache", "vocab_size"},
		Optional:         []string{"head_dim"},
		DefaultRopeTheta: 10000.0,
		Defaults: func(c *Config) {
			graniteDefaults(c)
			c.NumExperts = 8
			c.NumExpertsPerTok = 2
			c.RouterAuxLossCoef = 0.001
		},
		Resolve: func(c *Config) {
			c.NormTopKProb = true // GraniteMoeTopKGating takes the softmax over the top-k logits
		},
		Validate: validateGranite,
		MoELayer: func(c *Config, i int) bool { return c.NumExperts > 0 },
		Presets: map[string]func(*Config){
			"tiny": func(c *Config) {
				tiny(c)
				// Every multiplier away from 1, as in granite-3.0-1b-a400m (12, 0.22,
				// 0.015625, 6).
				c.EmbeddingMultiplier = 12.0
				c.ResidualMultiplier = 0.22
				c.AttentionMultiplier = 0.125
				c.LogitsScaling = 6.0
			},
		},
	})
}
