package config

// qwen3_next: Qwen3NextConfig (Qwen3-Next-80B-A3B), and qwen3_5_moe_text: Qwen3_5MoeTextConfig
// (the text model of Qwen3.5-MoE, loaded by Qwen3_5MoeForCausalLM). Layers follow layer_types
// (when absent: every full_attention_interval-th layer, 1-based, is full attention and the
// others are gated delta-net linear attention, the Linear keys). Full attention projects q_proj
// to twice the query width (each head's queries, then its output gate), normalises queries and
// keys per head, rotates partial_rotary_factor (default 0.25) of each head and scales the
// attention output by sigmoid(gate); biases on q, k, v and o_proj with attention_bias. Every
// RMSNorm but the gated one of the linear layers multiplies by 1 + w. The feed-forward block is
// a softmax top-k mixture of num_experts experts of moe_intermediate_size plus a shared expert
// of shared_expert_intermediate_size gated by sigmoid(shared_expert_gate(x)); qwen3_next keeps
// qwen3_moe's layer rule (decoder_sparse_step, mlp_only_layers; norm_topk_prob), while
// qwen3_5_moe_text has no dense layers and always renormalises the top-k weights.
//
// Keys the families do not know are refused. Qwen3.5-MoE's Hub checkpoints are the
// vision-language model (model_type qwen3_5_moe, with text_config): not supported; a
// text_config extracted with model_type qwen3_5_moe_text is.
func init() {
	Register(Family{
		ModelType:     "qwen3_next",
		Architectures: []string{"Qwen3NextForCausalLM", "Qwen3NextModel"},
		Keys: []string{"attention_bias", "attention_dropout", "bos_token_id", "decoder_sparse_step",
			"eos_token_id", "head_dim", "hidden_act", "hidden_size", "initializer_range", "intermediate_size",
			"layer_types", "linear_conv_kernel_dim", "linear_key_head_dim", "linear_num_key_heads",
			"linear_num_value_heads", "linear_value_head_dim", "max_position_embeddings", "mlp_only_layers",
			"moe_intermediate_size", "norm_topk_prob", "num_attention_heads", "num_experts", "num_experts_per_tok",
			"num_hidden_layers", "num_key_value_heads", "output_router_logits", "pad_token_id", "rms_norm_eps",
			"router_aux_loss_coef", "shared_expert_intermediate_size", "tie_word_embeddings", "use_cache",
			"vocab_size"},
		DefaultRopeTheta: 10000.0,
		Defaults: func(c *Config) {
			c.VocabSize = 151936
			c.HiddenSize = 2048
			c.IntermediateSize = 5632
			c.NumHiddenLayers = 48
			c.NumAttentionHeads = 16
			c.NumKeyValueHeads = 2
			c.HeadDim = 256
			c.MaxPositionEmbeddings = 32768
			c.DecoderSparseStep = 1
			c.MoEIntermediateSize = 512
			c.SharedExpertIntermediateSize = 512
			c.NumExpertsPerTok = 10
			c.NumExperts = 512
			c.NormTopKProb = true
			c.RouterAuxLossCoef = 0.001
			c.MLPOnlyLayers = []int{}
			linearDefaults(c)
		},
		Resolve: func(c *Config) {
			if c.MLPOnlyLayers == nil {
				c.MLPOnlyLayers = []int{}
			}
			resolveLinear(c)
		},
		Validate: func(c *Config) error {
			if err := validateLinear(c); err != nil {
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
		MoELayer:       qwen3MoELayer,
		QKNorm:         QKNormPerHead,
		LayerTypes:     []string{LinearAttention, FullAttention},
		AttnOutputGate: true,
		SharedExpert:   sharedExpertGated,
		Kept:           linearKept,
		Presets: map[string]func(*Config){
			"tiny": tinyLinear,
			// Qwen/Qwen3-Next-80B-A3B-Instruct
			"qwen3-next-80b-a3b": func(c *Config) {
				c.IntermediateSize = 5120
				c.MaxPositionEmbeddings = 262144
				c.BOSTokenID, c.EOSTokenIDs = IntPtr(151643), []int{151645}
				c.DType = "bfloat16"
				c.Rope.Theta = 10000000
				c.setIntLiteral("rope_parameters.rope_theta")
			},
		},
	})
	Register(Family{
		ModelType:     "qwen3_5_moe_text",
		Architectures: []string{"Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextModel"},
		Keys: []string{"attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "head_dim",
			"hidden_act", "hidden_size", "initializer_range", "layer_types", "linear_conv_kernel_dim",
			"linear_key_head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_value_head_dim",
			"max_position_embeddings", "moe_intermediate_size", "num_attention_heads", "num_experts",
			"num_experts_per_tok", "num_hidden_layers", "num_key_value_heads", "output_router_logits",
			"pad_token_id", "rms_norm_eps", "router_aux_loss_coef", "shared_expert_intermediate_size",
			"tie_word_embeddings", "use_cache", "vocab_size"},
		DefaultRopeTheta: 10000.0,
		Defaults: func(c *Config) {
			c.VocabSize = 248320
			c.HiddenSize = 2048
			c.NumHiddenLayers = 40
			c.NumAttentionHeads = 16
			c.NumKeyValueHeads = 2
			c.HeadDim = 256
			c.MaxPositionEmbeddings = 32768
			c.MoEIntermediateSize = 512
			c.SharedExpertIntermediateSize = 512
			c.NumExpertsPerTok = 8
			c.NumExperts = 256
			c.RouterAuxLossCoef = 0.001
			// Not a key: the router always renormalises its top-k weights.
			c.NormTopKProb = true
			linearDefaults(c)
		},
		Resolve: func(c *Config) {
			c.NormTopKProb = true
			resolveLinear(c)
		},
		Validate: func(c *Config) error {
			if err := validateLinear(c); err != nil {
				return err
			}
			if c.SharedExpertIntermediateSize < 0 {
				return errorf("shared_expert_intermediate_size (%d) must not be negative", c.SharedExpertIntermediateSize)
			}
			return nil
		},
		MoELayer:       func(c *Config, i int) bool { return c.NumExperts > 0 },
		QKNorm:         QKNormPerHead,
		LayerTypes:     []string{LinearAttention, FullAttention},
		RopeKept:       []string{"mrope_section", "mrope_interleaved"},
		AttnOutputGate: true,
		SharedExpert:   sharedExpertGated,
		// Qwen3_5MoeTextConfig drops qwen3_next's dense-MLP keys, which files still carry
		// (the router always renormalises; every layer is sparse).
		Kept: append([]string{"decoder_sparse_step", "intermediate_size", "mlp_only_layers", "norm_topk_prob"}, linearKept...),
		Presets: map[string]func(*Config){
			"tiny": tinyLinear,
		},
	})
}

// linearKept are keys the Hub's files of these families carry that transformers keeps as
// attributes and its model does not read: use_sliding_window (Qwen3-Next has no sliding
// layers), the multi-token-prediction keys (transformers does not build those layers and
// ignores their mtp.* weights, as the model here does) and attn_output_gate (the attention
// always gates; Validate refuses false).
var linearKept = []string{"attn_output_gate", "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings", "use_sliding_window"}

// sharedExpertGated is the Qwen MoE families' shared expert: shared_expert_intermediate_size
// wide (none at 0), gated by sigmoid(shared_expert_gate(x)).
func sharedExpertGated(c *Config) (int, bool) {
	return c.SharedExpertIntermediateSize, c.SharedExpertIntermediateSize > 0
}

// tinyLinear is the tiny preset of the gated delta-net families: 4 layers alternating linear
// and full attention (full_attention_interval 2), 2 key heads serving 4 value heads of 16.
func tinyLinear(c *Config) {
	dense := c.IntermediateSize
	tiny(c)
	if dense == 0 {
		c.IntermediateSize = 0 // qwen3_5_moe_text has no dense MLP
	}
	c.NumHiddenLayers = 4
	c.FullAttentionInterval = 2
	c.LayerTypes = nil
	c.SharedExpertIntermediateSize = 48
	c.LinearKeyHeadDim, c.LinearValueHeadDim = 16, 16
	c.LinearNumKeyHeads, c.LinearNumValueHeads = 2, 4
}
