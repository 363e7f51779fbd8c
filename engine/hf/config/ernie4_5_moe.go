package config

import "fmt"

// ernie4_5_moe: Ernie4_5_MoeConfig (ERNIE-4.5-21B-A3B). Llama's attention with GLM's interleaved
// rotary pairs; the layers moe_layer_start_index..moe_layer_end_index whose (i+1) is a multiple
// of moe_layer_interval are sparse: moe_num_experts experts of moe_intermediate_size, the top
// moe_k of the router's softmax plus a selection-only correction bias
// (mlp.moe_statics.e_score_correction_bias), renormalised, beside a shared SwiGLU MLP of
// moe_num_shared_experts * moe_intermediate_size; the other layers have a dense MLP of
// intermediate_size. num_experts and num_experts_per_tok are read as moe_num_experts and
// moe_k. use_bias (biases on every projection and the LM head) is refused.
func init() {
	Register(Family{
		ModelType:     "ernie4_5_moe",
		Architectures: []string{"Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeModel"},
		Keys: []string{"bos_token_id", "eos_token_id", "hidden_act", "hidden_size", "initializer_range",
			"intermediate_size", "max_position_embeddings", "moe_intermediate_size", "moe_k",
			"moe_layer_end_index", "moe_layer_interval", "moe_layer_start_index", "moe_norm_min",
			"moe_num_experts", "moe_num_shared_experts", "num_attention_heads", "num_hidden_layers",
			"num_key_value_heads", "output_router_logits", "pad_token_id", "rms_norm_eps",
			"router_aux_loss_coef", "tie_word_embeddings", "use_bias", "use_cache", "vocab_size"},
		Optional:         []string{"head_dim"},
		Aliases:          map[string]string{"num_experts": "moe_num_experts", "num_experts_per_tok": "moe_k"},
		DefaultRopeTheta: 500000.0,
		Defaults: func(c *Config) {
			c.VocabSize = 103424
			c.PadTokenID = IntPtr(0)
			c.BOSTokenID = IntPtr(1)
			c.EOSTokenIDs = []int{2}
			c.HiddenSize = 2560
			c.IntermediateSize = 12288
			c.NumHiddenLayers = 28
			c.NumAttentionHeads = 20
			c.NumKeyValueHeads = 4
			c.MaxPositionEmbeddings = 131072
			c.RMSNormEps = 1e-5
			c.TieWordEmbeddings = true
			c.MoEIntermediateSize = 1536
			c.NumExpertsPerTok = 6
			c.NumExperts = 64
			c.MoENumSharedExperts = 2
			c.MoELayerStartIndex = 1
			c.MoELayerEndIndex = -1
			c.MoELayerInterval = 1
			c.MoENormMin = 1e-12
			c.RouterAuxLossCoef = 0.001
		},
		Resolve: func(c *Config) {
			if c.MoELayerEndIndex == -1 {
				c.MoELayerEndIndex = c.NumHiddenLayers - 1
			}
			c.NormTopKProb = true // the top-k weights are always renormalised
		},
		Validate: func(c *Config) error {
			if err := refuseUnknown(c); err != nil {
				return err
			}
			if c.UseBias {
				return fmt.Errorf("use_bias=true (biases on every projection and on the LM head) is not supported for ernie4_5_moe; the released ERNIE 4.5 checkpoints have use_bias false")
			}
			if c.MoELayerInterval < 1 {
				return fmt.Errorf("moe_layer_interval (%d) must be at least 1", c.MoELayerInterval)
			}
			if c.MoELayerStartIndex < 0 {
				return fmt.Errorf("moe_layer_start_index (%d) must not be negative", c.MoELayerStartIndex)
			}
			if c.MoENumSharedExperts < 0 {
				return fmt.Errorf("moe_num_shared_experts (%d) must not be negative", c.MoENumSharedExperts)
			}
			return nil
		},
		MoELayer: func(c *Config, i int) bool {
			return c.NumExperts > 0 && (i+1)%max(c.MoELayerInterval, 1) == 0 &&
				i >= c.MoELayerStartIndex && i <= c.MoELayerEndIndex
		},
		SharedExpert: func(c *Config) (int, bool) {
			return c.MoENumSharedExperts * c.MoEIntermediateSize, false
		},
		RouterBiasParam: true,
		Presets: map[string]func(*Config){
			"tiny": func(c *Config) {
				tiny(c)
				c.MoENumSharedExperts = 1
				c.MoELayerStartIndex, c.MoELayerEndIndex = 0, 1
			},
		},
	})
}
