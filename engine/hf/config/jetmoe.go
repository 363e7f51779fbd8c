package config

import "fmt"

// The keys of JetMoeConfig that other families spell differently.
var _ = addFields(map[string]field{
	// kv_channels is the width of each attention head (head_dim is its attribute_map alias).
	"kv_channels": {kInt, false, func(c *Config) any { return &c.HeadDim }},
	// activation_function is the experts' GLU activation.
	"activation_function": {kString, false, func(c *Config) any { return &c.HiddenAct }},
	// aux_loss_coef weighs the load-balancing loss.
	"aux_loss_coef": {kFloat, false, func(c *Config) any { return &c.RouterAuxLossCoef }},
})

// jetmoe: JetMoeConfig (jetmoe/jetmoe-8b). A decoder whose attention and feed-forward blocks
// are both mixtures of experts over num_local_experts experts, each token routed to the top
// num_experts_per_tok by a linear router without bias, weighted by the softmax over those k
// logits. The attention (a mixture of attention heads) shares one kv_proj [2·NKV·kv_channels,
// C] and gives each expert its own query projection [NKV·kv_channels, C] and output projection
// [C, NKV·kv_channels], plus a bias [C] on the block's output; the k chosen experts' queries
// are the num_attention_heads = num_key_value_heads · num_experts_per_tok query heads, always
// derived so (a file's num_attention_heads is overwritten, as __post_init__ does). The
// feed-forward experts are GLUs of intermediate_size (activation_function) with a bias [C] on
// the block's output. head_dim is read as kv_channels (JetMoeConfig's attribute_map).
func init() {
	Register(Family{
		ModelType:     "jetmoe",
		Architectures: []string{"JetMoeForCausalLM", "JetMoeModel"},
		Keys: []string{"activation_function", "attention_dropout", "aux_loss_coef", "bos_token_id",
			"eos_token_id", "hidden_size", "initializer_range", "intermediate_size", "kv_channels",
			"max_position_embeddings", "num_attention_heads", "num_experts_per_tok", "num_hidden_layers",
			"num_key_value_heads", "num_local_experts", "output_router_logits", "pad_token_id",
			"rms_norm_eps", "tie_word_embeddings", "use_cache", "vocab_size"},
		Aliases:          map[string]string{"head_dim": "kv_channels"},
		DefaultRopeTheta: 10000.0,
		FieldTypes: map[string]field{
			// num_attention_heads is derived from it: null is not a head count here.
			"num_key_value_heads": {kInt, false, func(c *Config) any { return &c.NumKeyValueHeads }},
		},
		Defaults: func(c *Config) {
			c.VocabSize = 32000
			c.HiddenSize = 2048
			c.NumHiddenLayers = 12
			c.NumKeyValueHeads = 16
			c.HeadDim = 128
			c.IntermediateSize = 5632
			c.MaxPositionEmbeddings = 4096
			c.NumExperts = 8
			c.NumExpertsPerTok = 2
			c.NumAttentionHeads = 16 * 2
			c.RouterAuxLossCoef = 0.01
			c.BOSTokenID = IntPtr(1)
			c.EOSTokenIDs = []int{2}
			c.TieWordEmbeddings = true
			c.RMSNormEps = 1e-6
			c.InitializerRange = 0.01
		},
		Resolve: func(c *Config) {
			if c.NumKeyValueHeads > 0 && c.NumExpertsPerTok > 0 {
				c.NumAttentionHeads = c.NumKeyValueHeads * c.NumExpertsPerTok
			}
			c.NormTopKProb = true // JetMoeTopKGating takes the softmax over the top-k logits
		},
		Validate: func(c *Config) error {
			if err := refuseUnknown(c); err != nil {
				return err
			}
			if c.HiddenAct != "silu" {
				return fmt.Errorf("activation_function %q is not supported for jetmoe: its experts are implemented as SiLU GLUs; set it to \"silu\"", c.HiddenAct)
			}
			if c.OutputRouterLogits {
				return fmt.Errorf("output_router_logits=true is not supported for jetmoe: its load-balancing loss (over the attention and the feed-forward routers) is not implemented; set it to false")
			}
			if want := c.NumKeyValueHeads * c.NumExpertsPerTok; c.NumAttentionHeads != want {
				return fmt.Errorf("num_attention_heads (%d) must be num_key_value_heads * num_experts_per_tok (%d) for jetmoe", c.NumAttentionHeads, want)
			}
			return nil
		},
		MoELayer:  func(c *Config, i int) bool { return c.NumExperts > 0 },
		MoA:       true,
		QKVBias:   never,
		OProjBias: never,
		Presets: map[string]func(*Config){
			"tiny": func(c *Config) {
				tiny(c) // 2 key/value heads, top-2: 4 query heads
				c.InitializerRange = 0.02
			},
		},
	})
}
