package config

// mistral: MistralConfig. A llama-shaped decoder without biases, with a sliding attention
// window on every layer (sliding_window, null for full attention).
func init() {
	Register(Family{
		ModelType:     "mistral",
		Architectures: []string{"MistralForCausalLM", "MistralModel"},
		Keys: []string{"attention_dropout", "bos_token_id", "eos_token_id", "head_dim", "hidden_act",
			"hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings",
			"num_attention_heads", "num_hidden_layers", "num_key_value_heads", "pad_token_id",
			"rms_norm_eps", "sliding_window", "tie_word_embeddings", "use_cache", "vocab_size"},
		DefaultRopeTheta: 10000.0,
		Defaults: func(c *Config) {
			c.VocabSize = 32000
			c.HiddenSize = 4096
			c.IntermediateSize = 14336
			c.NumHiddenLayers = 32
			c.NumAttentionHeads = 32
			c.NumKeyValueHeads = 8
			c.MaxPositionEmbeddings = 131072
			c.BOSTokenID = IntPtr(1)
			c.EOSTokenIDs = []int{2}
			c.SlidingWindow = 4096
		},
		QKVBias:   never,
		OProjBias: never,
		Presets: map[string]func(*Config){
			"tiny": func(c *Config) {
				tiny(c)
				c.SlidingWindow = 0
			},
			// mistralai/Mistral-7B-v0.1
			"mistral-7b": func(c *Config) {
				c.MaxPositionEmbeddings = 32768
				c.RMSNormEps = 1e-5
				c.DType = "bfloat16"
			},
		},
	})
}

func never(*Config) bool  { return false }
func always(*Config) bool { return true }
