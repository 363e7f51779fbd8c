package config

import "fmt"

// smollm3: SmolLM3Config. The Llama decoder with NoPE layers: no_rope_layers[i] = 0 leaves
// layer i's queries and keys unrotated (by default every no_rope_layer_interval-th layer);
// with use_sliding_window the NoPE layers may attend over a sliding window.
func init() {
	Register(Family{
		ModelType:     "smollm3",
		Architectures: []string{"SmolLM3ForCausalLM", "SmolLM3Model"},
		Keys: []string{"attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "hidden_act",
			"hidden_size", "initializer_range", "intermediate_size", "layer_types", "max_position_embeddings",
			"mlp_bias", "no_rope_layer_interval", "no_rope_layers", "num_attention_heads", "num_hidden_layers",
			"num_key_value_heads", "pad_token_id", "rms_norm_eps", "sliding_window", "tie_word_embeddings",
			"use_cache", "use_sliding_window", "vocab_size"},
		Optional: []string{"head_dim"},
		// SmolLM3's Hub configs carry Qwen2's max_window_layers and pretraining_tp, which
		// transformers keeps and SmolLM3's model does not read.
		Kept:             []string{"max_window_layers", "pretraining_tp"},
		DefaultRopeTheta: 2000000.0,
		Defaults: func(c *Config) {
			c.VocabSize = 128256
			c.HiddenSize = 2048
			c.IntermediateSize = 11008
			c.NumHiddenLayers = 36
			c.NumAttentionHeads = 16
			c.NumKeyValueHeads = 4
			c.MaxPositionEmbeddings = 32768
			c.PadTokenID = IntPtr(128004)
			c.BOSTokenID = IntPtr(128000)
			c.EOSTokenIDs = []int{128001}
			c.TieWordEmbeddings = true
			c.NoRopeLayerInterval = 4
		},
		Resolve: func(c *Config) {
			if c.NoRopeLayers == nil && c.NoRopeLayerInterval > 0 {
				c.NoRopeLayers = make([]int, c.NumHiddenLayers)
				for i := range c.NoRopeLayers {
					if (i+1)%c.NoRopeLayerInterval != 0 {
						c.NoRopeLayers[i] = 1
					}
				}
			}
			deriveLayerTypesBy(c, func(i int) bool {
				return c.UseSlidingWindow && c.SlidingWindow > 0 && !c.UsesRoPE(i)
			})
		},
		Validate: func(c *Config) error {
			if err := refuseUnknown(c); err != nil {
				return err
			}
			if c.NoRopeLayerInterval <= 0 {
				return fmt.Errorf("no_rope_layer_interval (%d) must be at least 1", c.NoRopeLayerInterval)
			}
			if len(c.NoRopeLayers) < c.NumHiddenLayers {
				return fmt.Errorf("no_rope_layers has %d entries but num_hidden_layers is %d: give one entry (1 = RoPE, 0 = NoPE) per layer", len(c.NoRopeLayers), c.NumHiddenLayers)
			}
			for i, v := range c.NoRopeLayers {
				if v != 0 && v != 1 {
					return fmt.Errorf("no_rope_layers[%d] is %d; use 1 (RoPE) or 0 (NoPE)", i, v)
				}
			}
			if !c.UseSlidingWindow {
				for i, t := range c.LayerTypes {
					if t == SlidingAttention && c.SlidingWindow > 0 {
						return fmt.Errorf("layer_types[%d] is sliding_attention but use_sliding_window is false, so transformers attends over the full context there; set use_sliding_window to true or mark the layer full_attention", i)
					}
				}
			}
			return nil
		},
		Presets: map[string]func(*Config){"tiny": tiny},
	})
}
