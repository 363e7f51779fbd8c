package config

// flex_olmo: FlexOlmoConfig (FlexOlmo). OLMo 2's decoder — RMSNorms on the attention and
// feed-forward outputs, q and k RMS-normalised over the whole projection — with OLMoE's sparse
// block in every layer: num_experts experts of intermediate_size, top num_experts_per_tok,
// renormalised when norm_topk_prob. num_local_experts is read as num_experts (transformers'
// attribute_map).
func init() {
	Register(Family{
		ModelType:     "flex_olmo",
		Architectures: []string{"FlexOlmoForCausalLM", "FlexOlmoModel"},
		Keys: []string{"attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "hidden_act",
			"hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings",
			"norm_topk_prob", "num_attention_heads", "num_experts", "num_experts_per_tok", "num_hidden_layers",
			"num_key_value_heads", "output_router_logits", "pad_token_id", "rms_norm_eps",
			"router_aux_loss_coef", "tie_word_embeddings", "use_cache", "vocab_size"},
		Optional:         []string{"head_dim"},
		Aliases:          map[string]string{"num_local_experts": "num_experts"},
		DefaultRopeTheta: 500000.0,
		Defaults: func(c *Config) {
			c.VocabSize = 100352
			c.HiddenSize = 4096
			c.IntermediateSize = 11008
			c.NumHiddenLayers = 32
			c.NumAttentionHeads = 32
			c.MaxPositionEmbeddings = 4096
			c.RMSNormEps = 1e-6
			c.PadTokenID = IntPtr(100277)
			c.EOSTokenIDs = []int{100257}
			c.NumExperts = 7
			c.NumExpertsPerTok = 5
			c.RouterAuxLossCoef = 0.01
		},
		Validate: refuseUnknown,
		MoELayer: func(c *Config, i int) bool { return c.NumExperts > 0 },
		QKNorm:   QKNormProjection,
		Norms:    PostNorms,
		Presets:  map[string]func(*Config){"tiny": tiny},
	})
}
