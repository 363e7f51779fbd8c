package config

import (
	"fmt"
	"slices"
)

// laguna: LagunaConfig (poolside Laguna). Qwen2-MoE's config without its sparse-step, qkv_bias,
// norm_topk_prob and sliding switches: attention with per-head q/k norms before RoPE, a
// per-head output gate softplus(g_proj(x)) (gating, true by default), sliding-window layers where layer_types says
// sliding_attention, and rope_parameters keyed by layer type (full layers rotate half of each
// head with base 500000, sliding layers all of it with base 10000, by default); the layers
// mlp_layer_types marks sparse (all but the first, by default) route to num_experts experts of
// moe_intermediate_size by sigmoid plus a selection-only correction bias, renormalised and
// scaled by moe_routed_scaling_factor, beside an ungated shared expert of
// shared_expert_intermediate_size. Refused: gating=false (attention without the gate),
// per-layer head counts that differ from
// num_attention_heads, moe_apply_router_weight_on_input (transformers refuses it too),
// moe_router_logit_softcapping and output_router_logits (the load-balancing loss of
// transformers takes a softmax over this sigmoid router's logits), none of which is
// implemented.
func init() {
	Register(Family{
		ModelType:     "laguna",
		Architectures: []string{"LagunaForCausalLM", "LagunaModel"},
		Keys: []string{"attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "gating", "head_dim",
			"hidden_act", "hidden_size", "initializer_range", "intermediate_size", "layer_types",
			"max_position_embeddings", "mlp_layer_types", "moe_apply_router_weight_on_input",
			"moe_intermediate_size", "moe_routed_scaling_factor", "moe_router_logit_softcapping",
			"num_attention_heads", "num_attention_heads_per_layer", "num_experts", "num_experts_per_tok",
			"num_hidden_layers", "num_key_value_heads", "output_router_logits", "pad_token_id",
			"rms_norm_eps", "router_aux_loss_coef", "shared_expert_intermediate_size", "sliding_window",
			"tie_word_embeddings", "use_cache", "vocab_size"},
		DefaultRopeTheta:        500000.0,
		RopePerLayerType:        true,
		DefaultSlidingRopeTheta: 10000.0,
		Defaults: func(c *Config) {
			c.VocabSize = 100352
			c.HiddenSize = 2048
			c.IntermediateSize = 8192
			c.NumHiddenLayers = 40
			c.NumAttentionHeads = 48
			c.NumKeyValueHeads = 8
			c.HeadDim = 128
			c.MaxPositionEmbeddings = 131072
			c.SlidingWindow = 512
			c.MoEIntermediateSize = 512
			c.SharedExpertIntermediateSize = 512
			c.NumExpertsPerTok = 8
			c.NumExperts = 256
			c.RouterAuxLossCoef = 0.001
			c.RoutedScalingFactor = 1.0
			c.Gating = true
			c.Rope.PartialRotaryFactor = 0.5
			c.SlidingRope.PartialRotaryFactor = 1.0
		},
		Resolve: func(c *Config) {
			// A file's rope_parameters replace the default dictionary whole: a layer type
			// without partial_rotary_factor rotates all of each head.
			for _, r := range []*Rope{&c.Rope, &c.SlidingRope} {
				if len(r.src) > 0 && !r.src["partial_rotary_factor"] {
					r.PartialRotaryFactor = 0
				}
			}
			c.NormTopKProb = true // the top-k sigmoid weights are always renormalised
			deriveLayerTypesBy(c, func(int) bool { return false })
			if c.MLPLayerTypes == nil || (c.Latent.mlpDerived && slices.Equal(c.MLPLayerTypes, c.Latent.mlpFrom)) {
				lt := slices.Repeat([]string{"sparse"}, c.NumHiddenLayers)
				if len(lt) > 0 {
					lt[0] = "dense"
				}
				c.MLPLayerTypes, c.Latent.mlpDerived, c.Latent.mlpFrom = lt, true, slices.Clone(lt)
			}
			if c.NumAttentionHeadsPerLayer == nil || (c.headsDerived && slices.Equal(c.NumAttentionHeadsPerLayer, c.headsFrom)) {
				h := slices.Repeat([]int{c.NumAttentionHeads}, c.NumHiddenLayers)
				c.NumAttentionHeadsPerLayer, c.headsDerived, c.headsFrom = h, true, slices.Clone(h)
			}
		},
		Validate: func(c *Config) error {
			if err := refuseUnknown(c); err != nil {
				return err
			}
			for _, l := range []struct {
				key string
				n   int
			}{{"layer_types", len(c.LayerTypes)}, {"mlp_layer_types", len(c.MLPLayerTypes)},
				{"num_attention_heads_per_layer", len(c.NumAttentionHeadsPerLayer)}} {
				if l.n != c.NumHiddenLayers {
					return fmt.Errorf("%s has %d entries but num_hidden_layers is %d: give one entry per layer", l.key, l.n, c.NumHiddenLayers)
				}
			}
			for i, t := range c.MLPLayerTypes {
				if t != "dense" && t != "sparse" {
					return fmt.Errorf("mlp_layer_types[%d] is %q; use \"dense\" or \"sparse\"", i, t)
				}
			}
			for i, h := range c.NumAttentionHeadsPerLayer {
				if h != c.NumAttentionHeads {
					return fmt.Errorf("num_attention_heads_per_layer[%d] is %d but num_attention_heads is %d: layers with their own head counts are not supported; give every layer num_attention_heads", i, h, c.NumAttentionHeads)
				}
			}
			if !c.Gating {
				return fmt.Errorf("gating=false (attention without the per-head output gate) is not supported; set it to true")
			}
			if c.MoEApplyRouterWeightOnInput {
				return fmt.Errorf("moe_apply_router_weight_on_input=true is not supported (transformers refuses it too); set it to false")
			}
			if c.MoERouterLogitSoftcapping != 0 {
				return fmt.Errorf("moe_router_logit_softcapping %g is not supported (the router's tanh cap is not implemented); set it to 0.0", c.MoERouterLogitSoftcapping)
			}
			if c.OutputRouterLogits {
				return fmt.Errorf("output_router_logits=true is not supported for laguna: transformers' load-balancing loss takes a softmax over the sigmoid router's logits, which is not implemented; set it to false")
			}
			return nil
		},
		MoELayer: func(c *Config, i int) bool {
			return c.NumExperts > 0 && i < len(c.MLPLayerTypes) && c.MLPLayerTypes[i] == "sparse"
		},
		QKNorm:          QKNormPerHead,
		RouterBiasParam: true,
		HeadGate:        true,
		SharedExpert: func(c *Config) (int, bool) {
			return c.SharedExpertIntermediateSize, false
		},
		Presets: map[string]func(*Config){
			"tiny": func(c *Config) {
				tiny(c)
				c.SharedExpertIntermediateSize = 32
				c.SlidingWindow = 8
				c.LayerTypes = []string{SlidingAttention, FullAttention}
				c.MLPLayerTypes = []string{"sparse", "sparse"}
			},
		},
	})
}
