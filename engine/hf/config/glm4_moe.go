package config

// glm4_moe: Glm4MoeConfig (GLM-4.5, GLM-4.5-Air). A DeepSeek-V3-style decoder with GQA
// attention: biases on q, k and v when attention_bias, per-head q/k norms when use_qk_norm,
// rotary embedding over partial_rotary_factor (default 0.5) of each head. The first
// first_k_dense_replace layers have a dense SwiGLU MLP of intermediate_size; the others a
// mixture of n_routed_experts experts of moe_intermediate_size under a sigmoid router with an
// e_score_correction_bias for selection and group-limited top-k (n_group, topk_group), weights
// renormalised when norm_topk_prob and scaled by routed_scaling_factor, plus n_shared_experts
// shared experts as one MLP of n_shared_experts * moe_intermediate_size.
func init() {
	Register(Family{
		ModelType:     "glm4_moe",
		Architectures: []string{"Glm4MoeForCausalLM", "Glm4MoeModel"},
		Keys: []string{"attention_bias", "attention_dropout", "bos_token_id", "eos_token_id",
			"first_k_dense_replace", "hidden_act", "hidden_size", "initializer_range", "intermediate_size",
			"max_position_embeddings", "moe_intermediate_size", "n_group", "n_routed_experts", "n_shared_experts",
			"norm_topk_prob", "num_attention_heads", "num_experts_per_tok", "num_hidden_layers",
			"num_key_value_heads", "num_nextn_predict_layers", "pad_token_id", "rms_norm_eps",
			"routed_scaling_factor", "tie_word_embeddings", "topk_group", "use_cache", "use_qk_norm",
			"vocab_size"},
		Optional:         []string{"head_dim"},
		Aliases:          map[string]string{"num_local_experts": "n_routed_experts"},
		HeadDimFloor:     true,
		DefaultRopeTheta: 10000.0,
		Defaults: func(c *Config) {
			c.VocabSize = 151552
			c.HiddenSize = 4096
			c.IntermediateSize = 10944
			c.NumHiddenLayers = 46
			c.NumAttentionHeads = 96
			c.NumKeyValueHeads = 8
			c.MaxPositionEmbeddings = 131072
			c.RMSNormEps = 1e-5
			c.MoEIntermediateSize = 1408
			c.NumExpertsPerTok = 8
			c.NSharedExperts = 1
			c.NumExperts = 128
			c.RoutedScalingFactor = 1.0
			c.NGroup = 1
			c.TopKGroup = 1
			c.FirstKDenseReplace = 1
			c.NormTopKProb = true
			c.Rope.PartialRotaryFactor = 0.5
			c.NumNextNPredictLayers = 1
		},
		Resolve: func(c *Config) {
			if c.Rope.PartialRotaryFactor == 0 {
				c.Rope.PartialRotaryFactor = 0.5
			}
			keepTopLevelPartialRotary(c)
		},
		Validate: func(c *Config) error {
			if err := refuseUnknown(c); err != nil {
				return err
			}
			switch {
			case c.NGroup < 1 || c.NumExperts%c.NGroup != 0:
				return errorf("n_group (%d) must be at least 1 and divide n_routed_experts (%d)", c.NGroup, c.NumExperts)
			case c.TopKGroup < 1 || c.TopKGroup > c.NGroup:
				return errorf("topk_group (%d) must be between 1 and n_group (%d)", c.TopKGroup, c.NGroup)
			case c.TopKGroup*(c.NumExperts/c.NGroup) < c.NumExpertsPerTok:
				return errorf("topk_group (%d) groups of %d experts hold fewer than num_experts_per_tok (%d); raise topk_group", c.TopKGroup, c.NumExperts/c.NGroup, c.NumExpertsPerTok)
			case c.NSharedExperts < 0:
				return errorf("n_shared_experts (%d) must not be negative", c.NSharedExperts)
			case c.FirstKDenseReplace < 0:
				return errorf("first_k_dense_replace (%d) must not be negative", c.FirstKDenseReplace)
			case c.NumNextNPredictLayers < 0:
				return errorf("num_nextn_predict_layers (%d) must not be negative", c.NumNextNPredictLayers)
			}
			return positiveFloats("routed_scaling_factor", c.RoutedScalingFactor)
		},
		MoELayer: func(c *Config, i int) bool { return c.NumExperts > 0 && i >= c.FirstKDenseReplace },
		QKNormOf: func(c *Config) QKNorm {
			if c.UseQKNorm {
				return QKNormPerHead
			}
			return NoQKNorm
		},
		OProjBias: never,
		SharedExpert: func(c *Config) (int, bool) {
			return c.NSharedExperts * c.MoEIntermediateSize, false
		},
		Presets: map[string]func(*Config){
			"tiny": func(c *Config) {
				tiny(c)
				c.FirstKDenseReplace = 1
				c.NGroup, c.TopKGroup = 4, 2
				c.RoutedScalingFactor = 2.5
				c.UseQKNorm = true
				c.AttentionBias = true
				c.NumNextNPredictLayers = 0
			},
		},
	})
}
