package config

import "slices"

// MoEKeys are the config.json keys of further mixture-of-experts families that no other family
// has: HunYuan's extra token ids, ERNIE 4.5's layer pattern, shared experts and biases, and
// Laguna's per-layer head counts and router options.
// Config embeds it; a family that lacks a key leaves its field at the zero value, which is not
// written.
type MoEKeys struct {
	// EODTokenID and SEPTokenID are HunYuan's end-of-document and separator token ids, which
	// the model does not read (tokenizer metadata kept in config.json). Default 3 and 4.
	EODTokenID, SEPTokenID *int

	// MoELayerStartIndex, MoELayerEndIndex and MoELayerInterval pick ERNIE 4.5's sparse layers:
	// layer i is sparse when start <= i <= end and (i+1) % interval == 0. An end of -1 is the
	// last layer (resolved so, as transformers writes it). Default 1, -1, 1.
	MoELayerStartIndex, MoELayerEndIndex, MoELayerInterval int
	// MoENumSharedExperts is ERNIE 4.5's number of shared experts: one SwiGLU MLP of
	// MoENumSharedExperts * moe_intermediate_size beside the routed experts (0: none).
	// Default 2.
	MoENumSharedExperts int
	// MoENormMin is the floor of ERNIE 4.5's renormalisation sum. Default 1e-12.
	MoENormMin float64
	// UseBias: ERNIE 4.5's projections (attention, MLPs, the LM head) carry biases. Default
	// false.
	UseBias bool

	// NumAttentionHeadsPerLayer is Laguna's query-head count of each layer (derived as
	// num_attention_heads everywhere when absent; only that uniform form is supported).
	NumAttentionHeadsPerLayer []int
	// MoEApplyRouterWeightOnInput: Laguna would weight each expert's input rather than its
	// output (transformers refuses true). Default false.
	MoEApplyRouterWeightOnInput bool
	// MoERouterLogitSoftcapping caps Laguna's router logits with tanh (0: none). Default 0.
	MoERouterLogitSoftcapping float64
	// Gating: Laguna's attention scales each head's output by softplus(g_proj(x)) (one gate
	// per head; only true is supported). Default true.
	Gating bool

	// headsDerived: NumAttentionHeadsPerLayer was derived (as headsFrom) and follows
	// num_attention_heads and num_hidden_layers until it is changed.
	headsDerived bool
	headsFrom    []int
}

func (k MoEKeys) clone() MoEKeys {
	k.NumAttentionHeadsPerLayer = slices.Clone(k.NumAttentionHeadsPerLayer)
	k.headsFrom = slices.Clone(k.headsFrom)
	for _, p := range []**int{&k.EODTokenID, &k.SEPTokenID} {
		if *p != nil {
			*p = IntPtr(**p)
		}
	}
	return k
}

// The keys of MoEKeys and the further spellings of shared fields, added to the package's field
// table before any family registers.
var _ = addFields(map[string]field{
	"eod_token_id": {kOptInt, true, func(c *Config) any { return &c.EODTokenID }},
	"sep_token_id": {kOptInt, true, func(c *Config) any { return &c.SEPTokenID }},
	// HunYuan's top-k (num_experts_per_tok is its attribute_map alias).
	"moe_topk": {kInt, false, func(c *Config) any { return &c.NumExpertsPerTok }},
	// ERNIE 4.5's (num_experts and num_experts_per_tok are their attribute_map aliases).
	"moe_k":                  {kInt, false, func(c *Config) any { return &c.NumExpertsPerTok }},
	"moe_num_experts":        {kInt, false, func(c *Config) any { return &c.NumExperts }},
	"moe_num_shared_experts": {kInt, false, func(c *Config) any { return &c.MoENumSharedExperts }},
	"moe_layer_start_index":  {kInt, false, func(c *Config) any { return &c.MoELayerStartIndex }},
	"moe_layer_end_index":    {kInt, false, func(c *Config) any { return &c.MoELayerEndIndex }},
	"moe_layer_interval":     {kInt, false, func(c *Config) any { return &c.MoELayerInterval }},
	"moe_norm_min":           {kFloat, false, func(c *Config) any { return &c.MoENormMin }},
	"use_bias":               {kBool, false, func(c *Config) any { return &c.UseBias }},
	// Laguna's.
	"num_attention_heads_per_layer":    {kIntList, true, func(c *Config) any { return &c.NumAttentionHeadsPerLayer }},
	"moe_routed_scaling_factor":        {kFloat, false, func(c *Config) any { return &c.RoutedScalingFactor }},
	"moe_apply_router_weight_on_input": {kBool, false, func(c *Config) any { return &c.MoEApplyRouterWeightOnInput }},
	"moe_router_logit_softcapping":     {kFloat, false, func(c *Config) any { return &c.MoERouterLogitSoftcapping }},
	"gating":                           {kBool, false, func(c *Config) any { return &c.Gating }},
})
