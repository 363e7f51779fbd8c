package config

// mixtral: MixtralConfig. Mistral attention with a sparse MoE block (num_local_experts experts
// of intermediate_size, top num_experts_per_tok, renormalised) in every layer.
func init() {
	Register(Family{
		ModelType:     "mixtral",
		Architectures: []string{"MixtralForCausalLM", "MixtralModel"},
		Keys: []string{"attention_dropout", "bos_token_id", "eos_token_id", "head_dim", "hidden_act",
			"hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings",
			"num_attention_heads", "num_experts_per_tok", "num_hidden_layers", "num_key_value_heads",
			"num_local_experts", "output_router_logits", "pad_token_id", "rms_norm_eps",
			"router_aux_loss_coef", "router_jitter_noise", "sliding_window", "tie_word_embeddings",
			"use_cache", "vocab_size"},
		HeadDimNullWhenDerived: true,
		DefaultRopeTheta:       1e6,
		Defaults: func(c *Config) {
			c.VocabSize = 32000
			c.HiddenSize = 4096
			c.IntermediateSize = 14336
			c.NumHiddenLayers = 32
			c.NumAttentionHeads = 32
			c.NumKeyValueHeads = 8
			c.MaxPositionEmbeddings = 131072
			c.RMSNormEps = 1e-5
			c.BOSTokenID = IntPtr(1)
			c.EOSTokenIDs = []int{2}
			c.NumExperts = 8
			c.NumExpertsPerTok = 2
			c.RouterAuxLossCoef = 0.001
		},
		Resolve: func(c *Config) {
			c.NormTopKProb = true // MixtralSparseMoeBlock always renormalises the top-k weights
		},
		MoELayer:  func(c *Config, i int) bool { return c.NumExperts > 0 },
		QKVBias:   never,
		OProjBias: never,
		Presets: map[string]func(*Config){
			"tiny": tiny,
			// mistralai/Mixtral-8x7B-v0.1
			"mixtral-8x7b": func(c *Config) {
				c.MaxPositionEmbeddings = 32768
				c.RouterAuxLossCoef = 0.02
				c.DType = "bfloat16"
			},
		},
	})
}
