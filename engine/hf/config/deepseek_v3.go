package config

// deepseek_v3: DeepseekV3Config (DeepSeek-V3, DeepSeek-R1). Multi-head latent attention
// (Latent: q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim; the
// rotary part of each head interleaved in the checkpoint when rope_interleave), softmax scale
// qk_head_dim^-0.5 times yarn's mscale(factor, mscale_all_dim)^2 under rope scaling. The first
// first_k_dense_replace layers have a dense SwiGLU MLP of intermediate_size; the others
// n_routed_experts experts of moe_intermediate_size under a sigmoid router whose
// e_score_correction_bias chooses only, limited to the topk_group best of n_group expert groups,
// with weights renormalised (norm_topk_prob) and scaled by routed_scaling_factor, plus
// n_shared_experts shared experts as one MLP of n_shared_experts * moe_intermediate_size.
// num_nextn_predict_layers (default 1, as transformers writes it) counts the
// multi-token-prediction layers after the decoder, which transformers does not build.
func init() {
	Register(Family{
		ModelType:        "deepseek_v3",
		Architectures:    []string{"DeepseekV3ForCausalLM", "DeepseekV3Model"},
		Keys:             append([]string{"first_k_dense_replace", "head_dim", "num_nextn_predict_layers"}, latentKeys...),
		Aliases:          map[string]string{"num_local_experts": "n_routed_experts"},
		HeadDimFloor:     true,
		DefaultRopeTheta: 10000.0,
		Defaults: func(c *Config) {
			c.VocabSize = 129280
			c.HiddenSize = 7168
			c.IntermediateSize = 18432
			c.MoEIntermediateSize = 2048
			c.NumHiddenLayers = 61
			c.NumAttentionHeads = 128
			c.NumKeyValueHeads = 128
			c.NSharedExperts = 1
			c.NumExperts = 256
			c.RoutedScalingFactor = 2.5
			c.KVLoRARank, c.QLoRARank = 512, 1536
			c.QKRopeHeadDim, c.VHeadDim, c.QKNopeHeadDim = 64, 128, 128
			c.NGroup, c.TopKGroup = 8, 4
			c.NumExpertsPerTok = 8
			c.FirstKDenseReplace = 3
			c.NormTopKProb = true
			c.MaxPositionEmbeddings = 4096
			c.BOSTokenID, c.EOSTokenIDs = IntPtr(0), []int{1}
			c.PretrainingTP = 1
			c.RopeInterleave = true
			c.NumNextNPredictLayers = 1
		},
		Resolve: resolveLatent,
		Validate: func(c *Config) error {
			if c.FirstKDenseReplace < 0 {
				return errorf("first_k_dense_replace (%d) must not be negative", c.FirstKDenseReplace)
			}
			if c.NumNextNPredictLayers < 0 {
				return errorf("num_nextn_predict_layers (%d) must not be negative", c.NumNextNPredictLayers)
			}
			return validateLatent(c)
		},
		MoELayer:  func(c *Config, i int) bool { return c.NumExperts > 0 && i >= c.FirstKDenseReplace },
		OProjBias: func(c *Config) bool { return c.AttentionBias },
		SharedExpert: func(c *Config) (int, bool) {
			return c.NSharedExperts * c.MoEIntermediateSize, false
		},
		Presets: map[string]func(*Config){
			"tiny": tinyLatent,
			// deepseek-ai/DeepSeek-V3 (its weights are fp8 with block scales; this is the shape)
			"deepseek-v3": func(c *Config) {
				c.MaxPositionEmbeddings = 163840
				c.DType = "bfloat16"
				c.Rope.Type = "yarn"
				c.Rope.Factor = 40
				c.Rope.BetaFast, c.Rope.BetaSlow = 32, 1
				c.Rope.MScale, c.Rope.MScaleAllDim = 1, 1
				c.Rope.OriginalMaxPositionEmbeddings = 4096
			},
		},
	})
}

// tinyLatent is the tiny preset of the latent-attention families: hidden 64, 2 layers (the
// first dense), 4 heads of 16+8 query/key dims and 12 value dims, q rank 24, kv rank 32, 8
// experts of 32 in 2 groups (the best one kept), top-2, one shared expert.
func tinyLatent(c *Config) {
	c.VocabSize = TinyVocab
	c.HiddenSize = 64
	c.IntermediateSize = 128
	c.NumHiddenLayers = 2
	c.NumAttentionHeads, c.NumKeyValueHeads = 4, 4
	c.HeadDim = 0
	c.MaxPositionEmbeddings = 512
	c.BOSTokenID, c.EOSTokenIDs, c.PadTokenID = nil, nil, nil
	c.DType = "float32"
	c.QLoRARank, c.KVLoRARank = 24, 32
	c.QKNopeHeadDim, c.QKRopeHeadDim, c.VHeadDim = 16, 8, 12
	c.NumExperts, c.NumExpertsPerTok, c.MoEIntermediateSize = 8, 2, 32
	c.NGroup, c.TopKGroup = 2, 1
	c.NSharedExperts = 1
	c.FirstKDenseReplace = 1
	c.MLPLayerTypes = nil
}
