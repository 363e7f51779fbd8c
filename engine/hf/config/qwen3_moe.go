package config

// qwen3_moe: Qwen3MoeConfig. Qwen3 attention (q/k norm) with a sparse MoE block in layer i
// unless i is in mlp_only_layers or (i+1) is not a multiple of decoder_sparse_step; experts of
// moe_intermediate_size; num_experts is written as num_local_experts by transformers 5.
func init() {
	Register(Family{
		ModelType:     "qwen3_moe",
		Architectures: []string{"Qwen3MoeForCausalLM", "Qwen3MoeModel"},
		Keys: []string{"attention_bias", "attention_dropout", "bos_token_id", "decoder_sparse_step",
			"eos_token_id", "hidden_act", "hidden_size", "initializer_range", "intermediate_size",
			"max_position_embeddings", "mlp_only_layers", "moe_intermediate_size", "norm_topk_prob",
			"num_attention_heads", "num_experts_per_tok", "num_hidden_layers", "num_key_value_heads",
			"num_local_experts", "output_router_logits", "pad_token_id", "rms_norm_eps",
			"router_aux_loss_coef", "sliding_window", "tie_word_embeddings", "use_cache",
			"use_sliding_window", "vocab_size"},
		Optional:         []string{"head_dim"},
		Aliases:          map[string]string{"num_experts": "num_local_experts"},
		DefaultRopeTheta: 10000.0,
		Defaults: func(c *Config) {
			c.VocabSize = 151936
			c.HiddenSize = 2048
			c.IntermediateSize = 6144
			c.NumHiddenLayers = 24
			c.NumAttentionHeads = 32
			c.NumKeyValueHeads = 4
			c.MaxPositionEmbeddings = 32768
			c.SlidingWindow = 4096
			c.DecoderSparseStep = 1
			c.MoEIntermediateSize = 768
			c.NumExpertsPerTok = 8
			c.NumExperts = 128
			c.RouterAuxLossCoef = 0.001
			c.MLPOnlyLayers = []int{}
		},
		Resolve: func(c *Config) {
			resolveQwenWindow(false)(c)
			if c.MLPOnlyLayers == nil {
				c.MLPOnlyLayers = []int{}
			}
		},
		Validate: validateSparseStep,
		MoELayer: func(c *Config, i int) bool {
			for _, l := range c.MLPOnlyLayers {
				if l == i {
					return false
				}
			}
			return c.NumExperts > 0 && c.DecoderSparseStep > 0 && (i+1)%c.DecoderSparseStep == 0
		},
		QKNorm: QKNormPerHead,
		Presets: map[string]func(*Config){
			"tiny": tiny,
			// Qwen/Qwen3-30B-A3B
			"qwen3-moe-30b-a3b": func(c *Config) {
				c.NumHiddenLayers = 48
				c.HeadDim = 128
				c.MaxPositionEmbeddings = 40960
				c.NormTopKProb = true
				c.BOSTokenID = IntPtr(151643)
				c.EOSTokenIDs = []int{151645}
				c.DType = "bfloat16"
				c.Rope.Theta = 1000000.0
			},
		},
	})
}
