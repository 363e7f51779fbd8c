package config

// qwen3: Qwen3Config. Explicit head_dim (default 128), per-head RMSNorm on q and k, biases when
// attention_bias is set; sliding attention as in qwen2.
func init() {
	Register(Family{
		ModelType:     "qwen3",
		Architectures: []string{"Qwen3ForCausalLM", "Qwen3Model"},
		Keys: []string{"attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "head_dim",
			"hidden_act", "hidden_size", "initializer_range", "intermediate_size", "layer_types",
			"max_position_embeddings", "max_window_layers", "num_attention_heads", "num_hidden_layers",
			"num_key_value_heads", "pad_token_id", "rms_norm_eps", "sliding_window",
			"tie_word_embeddings", "use_cache", "use_sliding_window", "vocab_size"},
		DefaultRopeTheta: 10000.0,
		Defaults: func(c *Config) {
			c.VocabSize = 151936
			c.HiddenSize = 4096
			c.IntermediateSize = 22016
			c.NumHiddenLayers = 32
			c.NumAttentionHeads = 32
			c.NumKeyValueHeads = 32
			c.HeadDim = 128
			c.MaxPositionEmbeddings = 32768
			c.SlidingWindow = 4096
			c.MaxWindowLayers = 28
		},
		Resolve: resolveQwenWindow(true),
		QKNorm:  QKNormPerHead,
		Presets: map[string]func(*Config){
			"tiny": tiny,
			// Qwen/Qwen3-0.6B
			"qwen3-0.6b": func(c *Config) {
				c.HiddenSize = 1024
				c.IntermediateSize = 3072
				c.NumHiddenLayers = 28
				c.NumAttentionHeads = 16
				c.NumKeyValueHeads = 8
				c.HeadDim = 128
				c.MaxPositionEmbeddings = 40960
				c.MaxWindowLayers = 28
				c.BOSTokenID = IntPtr(151643)
				c.EOSTokenIDs = []int{151645}
				c.TieWordEmbeddings = true
				c.DType = "bfloat16"
				c.Rope.Theta = 1000000
				c.setIntLiteral("rope_parameters.rope_theta") // the Hub file writes 1000000
			},
		},
	})
}
