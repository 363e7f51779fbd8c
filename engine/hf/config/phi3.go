package config

import "fmt"

// phi3: Phi3Config (Phi-3, Phi-3.5, Phi-4-mini). A Llama-shaped decoder whose q, k and v are one
// qkv_proj weight and whose MLP gate and up are one gate_up_proj weight; rotary embedding
// default or longrope ("su" and "yarn" in old files mean longrope), over
// partial_rotary_factor of each head; an optional sliding window on every layer.
func init() {
	Register(Family{
		ModelType:     "phi3",
		Architectures: []string{"Phi3ForCausalLM", "Phi3Model"},
		Keys: []string{"attention_dropout", "bos_token_id", "embd_pdrop", "eos_token_id", "hidden_act",
			"hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings",
			"num_attention_heads", "num_hidden_layers", "num_key_value_heads", "original_max_position_embeddings",
			"pad_token_id", "resid_pdrop", "rms_norm_eps", "sliding_window", "tie_word_embeddings", "use_cache",
			"vocab_size"},
		// attention_bias appears in Phi-3.5 files; transformers' Phi3 has no biases whatever it
		// says, and neither does the model here (QKVBias, OProjBias).
		Optional:         []string{"attention_bias", "head_dim"},
		DefaultRopeTheta: 10000.0,
		Defaults: func(c *Config) {
			c.VocabSize = 32064
			c.HiddenSize = 3072
			c.IntermediateSize = 8192
			c.NumHiddenLayers = 32
			c.NumAttentionHeads = 32
			c.MaxPositionEmbeddings = 4096
			c.OriginalMaxPositionEmbeddings = 4096
			c.RMSNormEps = 1e-5
			c.BOSTokenID = IntPtr(1)
			c.EOSTokenIDs = []int{32000}
			c.PadTokenID = IntPtr(32000)
			c.Rope.PartialRotaryFactor = 1.0
		},
		Resolve: func(c *Config) {
			switch c.Rope.Type {
			case "su", "yarn":
				c.Rope.Type = "longrope"
			}
			if c.Rope.PartialRotaryFactor == 0 {
				c.Rope.PartialRotaryFactor = 1.0
			}
			if c.Rope.Type == "longrope" && c.Rope.OriginalMaxPositionEmbeddings == 0 {
				c.Rope.OriginalMaxPositionEmbeddings = c.OriginalMaxPositionEmbeddings
			}
		},
		Validate: func(c *Config) error {
			if err := refuseUnknown(c); err != nil {
				return err
			}
			if c.Rope.Type != "default" && c.Rope.Type != "longrope" {
				return fmt.Errorf("rope_type %q is not one phi3 has; use \"default\" or \"longrope\"", c.Rope.Type)
			}
			if c.OriginalMaxPositionEmbeddings <= 0 {
				return fmt.Errorf("original_max_position_embeddings (%d) must be positive", c.OriginalMaxPositionEmbeddings)
			}
			if err := probability("resid_pdrop", c.ResidPdrop); err != nil {
				return err
			}
			return probability("embd_pdrop", c.EmbdPdrop)
		},
		QKVBias:     never,
		OProjBias:   never,
		FusedQKV:    true,
		FusedGateUp: true,
		Presets:     map[string]func(*Config){"tiny": tiny},
	})
}
