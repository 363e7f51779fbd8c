package config

// granite: GraniteConfig (IBM Granite 3). The Llama decoder with four multipliers: the
// embeddings are scaled by embedding_multiplier, attention scores by attention_multiplier (in
// place of 1/sqrt(head_dim)), each attention and MLP output by residual_multiplier before its
// residual add, and the logits divided by logits_scaling.
func init() {
	Register(Family{
		ModelType:     "granite",
		Architectures: []string{"GraniteForCausalLM", "GraniteModel"},
		Keys: []string{"attention_bias", "attention_dropout", "attention_multiplier", "bos_token_id",
			"embedding_multiplier", "eos_token_id", "hidden_act", "hidden_size", "initializer_range",
			"intermediate_size", "logits_scaling", "max_position_embeddings", "mlp_bias", "num_attention_heads",
			"num_hidden_layers", "num_key_value_heads", "pad_token_id", "residual_multiplier", "rms_norm_eps",
			"tie_word_embeddings", "use_cache", "vocab_size"},
		Optional:         []string{"head_dim"},
		DefaultRopeTheta: 10000.0,
		Defaults:         graniteDefaults,
		Validate:         validateGranite,
		Presets: map[string]func(*Config){
			"tiny": func(c *Config) {
				tiny(c)
				// Every multiplier away from 1, as Granite's are (12, 0.22, 0.0078125, 8 in
				// granite-3.0-2b), so that a model that ignored one would differ.
				c.EmbeddingMultiplier = 12.0
				c.ResidualMultiplier = 0.22
				c.AttentionMultiplier = 0.125
				c.LogitsScaling = 8.0
			},
		},
	})
}

// graniteDefaults are GraniteConfig's defaults, which GraniteMoeConfig shares.
func graniteDefaults(c *Config) {
	c.VocabSize = 32000
	c.HiddenSize = 4096
	c.IntermediateSize = 11008
	c.NumHiddenLayers = 32
	c.NumAttentionHeads = 32
	c.MaxPositionEmbeddings = 2048
	c.BOSTokenID = IntPtr(1)
	c.EOSTokenIDs = []int{2}
	c.EmbeddingMultiplier = 1.0
	c.ResidualMultiplier = 1.0
	c.AttentionMultiplier = 1.0
	c.LogitsScaling = 1.0
}

// validateGranite refuses unknown keys and multipliers that are not positive (granite and
// granitemoe).
func validateGranite(c *Config) error {
	if err := refuseUnknown(c); err != nil {
		return err
	}
	return positiveFloats("embedding_multiplier", c.EmbeddingMultiplier, "residual_multiplier", c.ResidualMultiplier,
		"attention_multiplier", c.AttentionMultiplier, "logits_scaling", c.LogitsScaling)
}
