package config

import "fmt"

// olmo2: Olmo2Config. A Llama-shaped decoder whose RMSNorms sit on the outputs of attention
// and MLP (post_attention_layernorm, post_feedforward_layernorm) instead of their inputs, with
// q and k RMS-normalised over the whole projection.
func init() {
	Register(Family{
		ModelType:     "olmo2",
		Architectures: []string{"Olmo2ForCausalLM", "Olmo2Model"},
		Keys: []string{"attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "hidden_act",
			"hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings",
			"num_attention_heads", "num_hidden_layers", "num_key_value_heads", "pad_token_id", "rms_norm_eps",
			"tie_word_embeddings", "use_cache", "vocab_size"},
		Optional:         []string{"head_dim"},
		DefaultRopeTheta: 10000.0,
		Defaults:         olmoDefaults,
		Validate:         refuseUnknown,
		QKNorm:           QKNormProjection,
		Norms:            PostNorms,
		Presets:          map[string]func(*Config){"tiny": tiny},
	})
}

// olmoDefaults are Olmo2Config's and Olmo3Config's class defaults.
func olmoDefaults(c *Config) {
	c.VocabSize = 50304
	c.HiddenSize = 4096
	c.IntermediateSize = 11008
	c.NumHiddenLayers = 32
	c.NumAttentionHeads = 32
	c.MaxPositionEmbeddings = 2048
	c.RMSNormEps = 1e-5
	c.PadTokenID = IntPtr(1)
	c.EOSTokenIDs = []int{50279}
}

// olmo3: Olmo3Config. OLMo 2's decoder with sliding-window attention on the layers layer_types
// marks sliding_attention (by default three of every four: layer i is full when (i+1) % 4 ==
// 0). rope_parameters holds one dictionary per layer type, as transformers 5.17 writes it; a
// 4.x file's rope_scaling and rope_theta are the full-attention layers' (its sliding layers
// rotate with the default type), and a sliding_attention rope_theta the file does not give is
// 500000, the class default, as transformers 5.17 standardises it.
func init() {
	Register(Family{
		ModelType:     "olmo3",
		Architectures: []string{"Olmo3ForCausalLM", "Olmo3Model"},
		Keys: []string{"attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "hidden_act",
			"hidden_size", "initializer_range", "intermediate_size", "layer_types", "max_position_embeddings",
			"num_attention_heads", "num_hidden_layers", "num_key_value_heads", "pad_token_id", "rms_norm_eps",
			"sliding_window", "tie_word_embeddings", "use_cache", "vocab_size"},
		Optional:                []string{"head_dim"},
		DefaultRopeTheta:        500000.0,
		RopePerLayerType:        true,
		DefaultSlidingRopeTheta: 500000.0,
		Defaults: func(c *Config) {
			olmoDefaults(c)
			c.SlidingWindow = 4096
		},
		Resolve: func(c *Config) {
			deriveLayerTypesBy(c, func(i int) bool { return (i+1)%4 != 0 })
		},
		Validate: func(c *Config) error {
			if err := refuseUnknown(c); err != nil {
				return err
			}
			if c.SlidingWindow <= 0 {
				return fmt.Errorf("sliding_window must be a positive number of tokens for olmo3 (its sliding_attention layers use it)")
			}
			return nil
		},
		QKNorm: QKNormProjection,
		Norms:  PostNorms,
		Presets: map[string]func(*Config){
			"tiny": func(c *Config) {
				tiny(c)
				c.SlidingWindow = 8
			},
		},
	})
}
