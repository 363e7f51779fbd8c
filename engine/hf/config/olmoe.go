package config

// olmoe: OlmoeConfig. A sparse MoE block (num_experts experts of intermediate_size, top
// num_experts_per_tok) in every layer; q and k are RMS-normalised over the whole projection;
// clip_qkv optionally clamps q, k and v.
func init() {
	Register(Family{
		ModelType:     "olmoe",
		Architectures: []string{"OlmoeForCausalLM", "OlmoeModel"},
		Keys: []string{"attention_bias", "attention_dropout", "bos_token_id", "clip_qkv", "eos_token_id",
			"hidden_act", "hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings",
			"norm_topk_prob", "num_attention_heads", "num_experts", "num_experts_per_tok",
			"num_hidden_layers", "num_key_value_heads", "output_router_logits", "pad_token_id",
			"rms_norm_eps", "router_aux_loss_coef", "tie_word_embeddings", "use_cache", "vocab_size"},
		Optional:         []string{"head_dim"},
		DefaultRopeTheta: 10000.0,
		Defaults: func(c *Config) {
			c.VocabSize = 50304
			c.HiddenSize = 2048
			c.IntermediateSize = 2048
			c.NumHiddenLayers = 16
			c.NumAttentionHeads = 16
			c.MaxPositionEmbeddings = 4096
			c.RMSNormEps = 1e-5
			c.EOSTokenIDs = []int{50279}
			c.PadTokenID = IntPtr(1)
			c.NumExperts = 64
			c.NumExpertsPerTok = 8
			c.RouterAuxLossCoef = 0.01
		},
		MoELayer: func(c *Config, i int) bool { return c.NumExperts > 0 },
		QKNorm:   QKNormProjection,
		Presets: map[string]func(*Config){
			"tiny": tiny,
			// allenai/OLMoE-1B-7B-0924
			"olmoe-1b-7b": func(c *Config) {
				c.IntermediateSize = 1024
				c.DType = "bfloat16"
			},
		},
	})
}
