package config

import "fmt"

// minimax_m2: MiniMaxM2Config (MiniMax-M2). Mixtral's decoder with OLMo 2's attention (q and k
// RMS-normalised over the whole projections) and GLM-4.5's rotary embedding (partial when
// rope_parameters has partial_rotary_factor), and in every layer a mixture of
// num_local_experts experts of intermediate_size whose top num_experts_per_tok are chosen by
// the router's sigmoid plus a selection-only correction bias and weighted by the renormalised
// sigmoids. The Hub files' rotary_dim, use_qk_norm, qk_norm_type, scoring_func and
// use_routing_bias, which transformers keeps without reading, are kept likewise.
// output_router_logits is refused: transformers' load-balancing loss for this router takes a
// softmax over its logits, which is not implemented.
func init() {
	Register(Family{
		ModelType:     "minimax_m2",
		Architectures: []string{"MiniMaxM2ForCausalLM", "MiniMaxM2Model"},
		Keys: []string{"attention_dropout", "bos_token_id", "eos_token_id", "head_dim", "hidden_act",
			"hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings",
			"num_attention_heads", "num_experts_per_tok", "num_hidden_layers", "num_key_value_heads",
			"num_local_experts", "output_router_logits", "pad_token_id", "rms_norm_eps",
			"router_aux_loss_coef", "router_jitter_noise", "tie_word_embeddings", "use_cache", "vocab_size"},
		Aliases:          map[string]string{"num_experts": "num_local_experts"},
		Kept:             []string{"rotary_dim", "use_qk_norm", "qk_norm_type", "scoring_func", "use_routing_bias"},
		DefaultRopeTheta: 5000000.0,
		Defaults: func(c *Config) {
			c.VocabSize = 200064
			c.HiddenSize = 3072
			c.IntermediateSize = 1536
			c.NumHiddenLayers = 62
			c.NumAttentionHeads = 48
			c.NumKeyValueHeads = 8
			c.HeadDim = 128
			c.MaxPositionEmbeddings = 196608
			c.RMSNormEps = 1e-6
			c.BOSTokenID = IntPtr(200034)
			c.EOSTokenIDs = []int{200020}
			c.NumExperts = 256
			c.NumExpertsPerTok = 8
			c.RouterAuxLossCoef = 0.001
		},
		Resolve: func(c *Config) {
			c.NormTopKProb = true // MiniMaxM2TopKRouter renormalises the top-k sigmoids
		},
		Validate: func(c *Config) error {
			if err := refuseUnknown(c); err != nil {
				return err
			}
			if c.OutputRouterLogits {
				return fmt.Errorf("output_router_logits=true is not supported for minimax_m2: transformers' load-balancing loss takes a softmax over the sigmoid router's logits, which is not implemented; set it to false")
			}
			return nil
		},
		MoELayer:  func(c *Config, i int) bool { return c.NumExperts > 0 },
		QKNorm:    QKNormProjection,
		QKVBias:   never,
		OProjBias: never,
		Presets: map[string]func(*Config){
			"tiny": tiny,
		},
	})
}
