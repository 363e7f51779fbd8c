package config

// llama: LlamaConfig. Dense decoder; attention_bias and mlp_bias switch biases on; rope scaling
// (linear, dynamic, llama3, yarn) from rope_parameters.
func init() {
	Register(Family{
		ModelType:     "llama",
		Architectures: []string{"LlamaForCausalLM", "LlamaModel"},
		Keys: []string{"attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "head_dim",
			"hidden_act", "hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings",
			"mlp_bias", "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "pad_token_id",
			"pretraining_tp", "rms_norm_eps", "tie_word_embeddings", "use_cache", "vocab_size"},
		DefaultRopeTheta: 10000.0,
		Defaults: func(c *Config) {
			c.VocabSize = 32000
			c.HiddenSize = 4096
			c.IntermediateSize = 11008
			c.NumHiddenLayers = 32
			c.NumAttentionHeads = 32
			c.MaxPositionEmbeddings = 2048
			c.BOSTokenID = IntPtr(1)
			c.EOSTokenIDs = []int{2}
			c.PretrainingTP = 1
		},
		Presets: map[string]func(*Config){
			"tiny": tiny,
			// meta-llama/Llama-3.2-1B
			"llama-3.2-1b": func(c *Config) {
				c.VocabSize = 128256
				c.HiddenSize = 2048
				c.IntermediateSize = 8192
				c.NumHiddenLayers = 16
				c.NumAttentionHeads = 32
				c.NumKeyValueHeads = 8
				c.HeadDim = 64
				c.MaxPositionEmbeddings = 131072
				c.RMSNormEps = 1e-5
				c.BOSTokenID = IntPtr(128000)
				c.EOSTokenIDs = []int{128001}
				c.TieWordEmbeddings = true
				c.DType = "bfloat16"
				c.Rope = Rope{Type: "llama3", Theta: 500000.0, Factor: 32.0, LowFreqFactor: 1.0,
					HighFreqFactor: 4.0, OriginalMaxPositionEmbeddings: 8192}
			},
		},
	})
}

// tiny is every family's debug flavour: a few thousand parameters per layer, fast on a CPU.
func tiny(c *Config) {
	c.VocabSize = TinyVocab
	c.HiddenSize = 64
	c.IntermediateSize = 128
	c.NumHiddenLayers = 2
	c.NumAttentionHeads = 4
	c.NumKeyValueHeads = 2
	c.HeadDim = 16
	c.MaxPositionEmbeddings = 512
	c.BOSTokenID, c.EOSTokenIDs, c.PadTokenID = nil, nil, nil
	c.DType = "float32"
	if c.NumExperts > 0 {
		c.NumExperts = 8
		c.NumExpertsPerTok = 2
		if c.MoEIntermediateSize > 0 {
			c.MoEIntermediateSize = 32
		} else {
			c.IntermediateSize = 32
		}
	}
}
