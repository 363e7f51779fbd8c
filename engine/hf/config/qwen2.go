package config

// qwen2: Qwen2Config (Qwen2, Qwen2.5). Biases on q/k/v (never on o_proj); sliding attention
// only when use_sliding_window is set, for layers at or past max_window_layers.
func init() {
	Register(Family{
		ModelType:     "qwen2",
		Architectures: []string{"Qwen2ForCausalLM", "Qwen2Model"},
		Keys: []string{"attention_dropout", "bos_token_id", "eos_token_id", "hidden_act", "hidden_size",
			"initializer_range", "intermediate_size", "layer_types", "max_position_embeddings",
			"max_window_layers", "num_attention_heads", "num_hidden_layers", "num_key_value_heads",
			"pad_token_id", "rms_norm_eps", "sliding_window", "tie_word_embeddings", "use_cache",
			"use_sliding_window", "vocab_size"},
		Optional:         []string{"head_dim"},
		DefaultRopeTheta: 10000.0,
		Defaults: func(c *Config) {
			c.VocabSize = 151936
			c.HiddenSize = 4096
			c.IntermediateSize = 22016
			c.NumHiddenLayers = 32
			c.NumAttentionHeads = 32
			c.NumKeyValueHeads = 32
			c.MaxPositionEmbeddings = 32768
			c.SlidingWindow = 4096
			c.MaxWindowLayers = 28
		},
		Resolve:   resolveQwenWindow(true),
		QKVBias:   always,
		OProjBias: never,
		Presets: map[string]func(*Config){
			"tiny": tiny,
			// Qwen/Qwen2.5-0.5B
			"qwen2.5-0.5b": func(c *Config) {
				c.HiddenSize = 896
				c.IntermediateSize = 4864
				c.NumHiddenLayers = 24
				c.NumAttentionHeads = 14
				c.NumKeyValueHeads = 2
				c.MaxWindowLayers = 24
				c.BOSTokenID = IntPtr(151643)
				c.EOSTokenIDs = []int{151643}
				c.TieWordEmbeddings = true
				c.DType = "bfloat16"
				c.Rope.Theta = 1000000.0
			},
		},
	})
}

// resolveQwenWindow is the qwen families' __post_init__: sliding_window is dropped unless
// use_sliding_window is set; with layerTypes, layer_types is derived when absent.
func resolveQwenWindow(layerTypes bool) func(*Config) {
	return func(c *Config) {
		if !c.UseSlidingWindow {
			c.SlidingWindow = 0
		}
		if layerTypes {
			deriveLayerTypes(c)
		}
	}
}
