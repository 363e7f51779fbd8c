package config

// qwen2_moe: Qwen2MoeConfig (Qwen1.5-MoE, Qwen2-57B-A14B). Qwen2 attention (biases on q, k and
// v when qkv_bias, never on o_proj) with a sparse MoE block in the layers qwen3_moe's rule
// picks (decoder_sparse_step, mlp_only_layers): num_experts experts of moe_intermediate_size,
// top num_experts_per_tok, plus a shared expert of shared_expert_intermediate_size whose
// output sigmoid(shared_expert_gate(x)) scales. Sliding attention only with
// use_sliding_window, on the even-numbered layers below max_window_layers.
func init() {
	Register(Family{
		ModelType:     "qwen2_moe",
		Architectures: []string{"Qwen2MoeForCausalLM", "Qwen2MoeModel"},
		Keys: []string{"attention_dropout", "bos_token_id", "decoder_sparse_step", "eos_token_id", "hidden_act",
			"hidden_size", "initializer_range", "intermediate_size", "layer_types", "max_position_embeddings",
			"max_window_layers", "mlp_only_layers", "moe_intermediate_size", "norm_topk_prob",
			"num_attention_heads", "num_experts", "num_experts_per_tok", "num_hidden_layers",
			"num_key_value_heads", "output_router_logits", "pad_token_id", "qkv_bias", "rms_norm_eps",
			"router_aux_loss_coef", "shared_expert_intermediate_size", "sliding_window",
			"tie_word_embeddings", "use_cache", "use_sliding_window", "vocab_size"},
		Optional:         []string{"head_dim"},
		DefaultRopeTheta: 10000.0,
		Defaults: func(c *Config) {
			c.VocabSize = 151936
			c.HiddenSize = 2048
			c.IntermediateSize = 5632
			c.NumHiddenLayers = 24
			c.NumAttentionHeads = 16
			c.NumKeyValueHeads = 16
			c.MaxPositionEmbeddings = 32768
			c.SlidingWindow = 4096
			c.MaxWindowLayers = 28
			c.DecoderSparseStep = 1
			c.MoEIntermediateSize = 1408
			c.SharedExpertIntermediateSize = 5632
			c.NumExpertsPerTok = 4
			c.NumExperts = 60
			c.RouterAuxLossCoef = 0.001
			c.MLPOnlyLayers = []int{}
			c.QKVBiasKey = true
		},
		Resolve: func(c *Config) {
			if c.MLPOnlyLayers == nil {
				c.MLPOnlyLayers = []int{}
			}
			if !c.UseSlidingWindow {
				c.SlidingWindow = 0
			}
			deriveLayerTypesBy(c, func(i int) bool {
				return (i+1)%2 == 1 && i < c.MaxWindowLayers && c.UseSlidingWindow
			})
		},
		Validate: func(c *Config) error {
			if err := refuseUnknown(c); err != nil {
				return err
			}
			if err := validateSparseStep(c); err != nil {
				return err
			}
			if c.SharedExpertIntermediateSize < 0 {
				return errorf("shared_expert_intermediate_size (%d) must not be negative", c.SharedExpertIntermediateSize)
			}
			return nil
		},
		SlidingWindowZero: true,
		MoELayer:          qwen3MoELayer,
		QKVBias:           func(c *Config) bool { return c.QKVBiasKey },
		OProjBias:         never,
		SharedExpert: func(c *Config) (int, bool) {
			return c.SharedExpertIntermediateSize, c.SharedExpertIntermediateSize > 0
		},
		Presets: map[string]func(*Config){
			"tiny": func(c *Config) {
				tiny(c)
				c.SharedExpertIntermediateSize = 48
			},
		},
	})
}

// qwen3MoELayer is the qwen MoE families' layer rule: sparse unless listed in mlp_only_layers
// or (i+1) is not a multiple of decoder_sparse_step.
func qwen3MoELayer(c *Config, i int) bool {
	for _, l := range c.MLPOnlyLayers {
		if l == i {
			return false
		}
	}
	return c.NumExperts > 0 && c.DecoderSparseStep > 0 && (i+1)%c.DecoderSparseStep == 0
}
