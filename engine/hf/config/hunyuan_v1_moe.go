package config

import "fmt"

// hunyuan_v1_moe: HunYuanMoEV1Config (Hunyuan-A13B). Llama's attention with an RMSNorm over each
// query and key head applied after RoPE (query_layernorm, key_layernorm), and in every layer a
// shared SwiGLU MLP of intermediate_size beside num_experts routed experts of the same width:
// the top moe_topk of the router's softmax, renormalised. moe_topk and num_experts also accept
// their attribute_map names num_experts_per_tok and num_local_experts; per-layer lists of
// either are refused. eod_token_id and sep_token_id are token ids the model does not read.
// transformers writes head_dim null when it equals hidden_size / num_attention_heads and the
// file did not give it (its attention then fails; this package derives it).
func init() {
	Register(Family{
		ModelType:     "hunyuan_v1_moe",
		Architectures: []string{"HunYuanMoEV1ForCausalLM", "HunYuanMoEV1Model"},
		Keys: []string{"attention_bias", "attention_dropout", "bos_token_id", "eod_token_id", "eos_token_id",
			"head_dim", "hidden_act", "hidden_size", "initializer_range", "intermediate_size",
			"max_position_embeddings", "moe_topk", "num_attention_heads", "num_experts", "num_hidden_layers",
			"num_key_value_heads", "pad_token_id", "pretraining_tp", "rms_norm_eps", "sep_token_id",
			"tie_word_embeddings", "use_cache", "vocab_size"},
		Aliases:                map[string]string{"num_experts_per_tok": "moe_topk", "num_local_experts": "num_experts"},
		HeadDimNullWhenDerived: true,
		DefaultRopeTheta:       10000.0,
		Defaults: func(c *Config) {
			c.VocabSize = 290943
			c.HiddenSize = 4096
			c.IntermediateSize = 11008
			c.NumHiddenLayers = 32
			c.NumAttentionHeads = 32
			c.MaxPositionEmbeddings = 2048
			c.RMSNormEps = 1e-5
			c.PadTokenID = IntPtr(0)
			c.BOSTokenID = IntPtr(1)
			c.EOSTokenIDs = []int{2}
			c.EODTokenID = IntPtr(3)
			c.SEPTokenID = IntPtr(4)
			c.PretrainingTP = 1
			c.NumExperts = 1
			c.NumExpertsPerTok = 1
		},
		Resolve: func(c *Config) {
			c.NormTopKProb = true // HunYuanMoEV1Moe renormalises the top-k softmax weights
		},
		Validate: func(c *Config) error {
			if err := refuseUnknown(c); err != nil {
				return err
			}
			if c.NumExperts < 1 {
				return fmt.Errorf("num_experts (%d) must be at least 1: every hunyuan_v1_moe layer routes to experts", c.NumExperts)
			}
			return nil
		},
		MoELayer: func(c *Config, i int) bool { return c.NumExperts > 0 },
		QKNorm:   QKNormPerHead,
		SharedExpert: func(c *Config) (int, bool) {
			return c.IntermediateSize, false
		},
		Presets: map[string]func(*Config){
			"tiny": func(c *Config) {
				tiny(c)
				c.EODTokenID, c.SEPTokenID = nil, nil
				// transformers' attention reads head_dim without a fallback, so the preset
				// gives it, as a file would, and it is written.
				c.src["head_dim"] = true
			},
		},
	})
}
