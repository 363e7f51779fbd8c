package config

// glm4: Glm4Config (GLM-4-0414). The Llama decoder with four RMSNorms per layer (the two
// pre-norms plus post_self_attn_layernorm and post_mlp_layernorm on the attention and MLP
// outputs), biases on q, k and v (attention_bias, default true) but not on o_proj, a fused
// gate_up_proj, and a rotary embedding over partial_rotary_factor (default 0.5) of each head
// that rotates interleaved pairs (dims 2i and 2i+1).
func init() {
	Register(Family{
		ModelType:     "glm4",
		Architectures: []string{"Glm4ForCausalLM", "Glm4Model"},
		Keys: []string{"attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "head_dim",
			"hidden_act", "hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings",
			"num_attention_heads", "num_hidden_layers", "num_key_value_heads", "pad_token_id", "rms_norm_eps",
			"tie_word_embeddings", "use_cache", "vocab_size"},
		DefaultRopeTheta: 10000.0,
		Defaults: func(c *Config) {
			c.VocabSize = 151552
			c.HiddenSize = 4096
			c.IntermediateSize = 13696
			c.NumHiddenLayers = 40
			c.NumAttentionHeads = 32
			c.NumKeyValueHeads = 2
			c.HeadDim = 128
			c.MaxPositionEmbeddings = 131072
			c.RMSNormEps = 1.5625e-07
			c.PadTokenID = IntPtr(151329)
			c.EOSTokenIDs, c.eosList = []int{151329, 151336, 151338}, true
			c.AttentionBias = true
			c.Rope.PartialRotaryFactor = 0.5
		},
		Resolve: func(c *Config) {
			if c.Rope.PartialRotaryFactor == 0 {
				c.Rope.PartialRotaryFactor = 0.5
			}
			keepTopLevelPartialRotary(c)
		},
		Validate:    refuseUnknown,
		OProjBias:   never,
		Norms:       SandwichNorms,
		FusedGateUp: true,
		Presets: map[string]func(*Config){
			"tiny": func(c *Config) {
				tiny(c)
				c.EOSTokenIDs, c.PadTokenID = []int{2}, nil
			},
		},
	})
}
