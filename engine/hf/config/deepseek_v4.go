package config

import (
	"fmt"
	"maps"
	"slices"
)

// deepseek_v4: DeepseekV4Config (DeepSeek-V4-Flash, -Pro). Every layer attends with one
// shared key/value head (num_key_value_heads 1, read as both key and value) of head_dim over a
// sliding_window of its own tokens, with a learned sink per head, low-rank queries (q_lora_rank)
// and a grouped output projection (o_groups groups to o_lora_rank each, then to hidden_size).
// layer_types adds compressed entries: compressed_sparse_attention pools overlapping windows of
// compress_rates[compressed_sparse_attention] tokens and keeps index_topk of them per query
// (a lightning indexer of index_n_heads heads of index_head_dim);
// heavily_compressed_attention pools windows of compress_rates[heavily_compressed_attention].
// The residual is hc_mult streams mixed by hyper-connections (hc_sinkhorn_iters Sinkhorn
// steps, hc_eps floor). Every layer is a mixture of n_routed_experts clamped-SwiGLU experts
// (swiglu_limit) of moe_intermediate_size beside one shared expert of that width, routed by
// sqrt(softplus) scores (scoring_func), top num_experts_per_tok with a selection-only
// correction bias (mlp_layer_types "moe") or by a fixed token-to-experts table (hash_moe),
// weights renormalised and scaled by routed_scaling_factor; mlp_bias gives the shared expert's
// projections biases (attention_bias is kept but builds nothing, as in transformers). rope_parameters holds two
// dictionaries: main (sliding layers, rope_theta) and compress (compressed layers, their
// compressors and indexer, compress_rope_theta), each over partial_rotary_factor of a head.
// transformers writes rope_theta, partial_rotary_factor and qk_rope_head_dim at the top level
// too. num_nextn_predict_layers counts multi-token-prediction layers transformers does not
// build.
func init() {
	Register(Family{
		ModelType:     "deepseek_v4",
		Architectures: []string{"DeepseekV4ForCausalLM", "DeepseekV4Model"},
		Keys: []string{"attention_bias", "attention_dropout", "bos_token_id", "compress_rates",
			"compress_rope_theta", "eos_token_id", "hc_eps", "hc_mult", "hc_sinkhorn_iters", "head_dim",
			"hidden_act", "hidden_size", "index_head_dim", "index_n_heads", "index_topk", "initializer_range",
			"layer_types", "max_position_embeddings", "mlp_bias", "mlp_layer_types", "moe_intermediate_size",
			"n_routed_experts", "n_shared_experts", "norm_topk_prob", "num_attention_heads",
			"num_experts_per_tok", "num_hidden_layers", "num_key_value_heads", "num_nextn_predict_layers",
			"o_groups", "o_lora_rank", "output_router_logits", "pad_token_id", "q_lora_rank", "rms_norm_eps",
			"routed_scaling_factor", "router_aux_loss_coef", "router_jitter_noise", "scoring_func",
			"sliding_window", "swiglu_limit", "tie_word_embeddings", "use_cache", "vocab_size"},
		// qk_rope_head_dim is written (int(head_dim * partial_rotary_factor)) and read as the
		// rotated width when partial_rotary_factor is absent.
		Consumed: []string{"qk_rope_head_dim"},
		Aliases: map[string]string{"num_local_experts": "n_routed_experts",
			"intermediate_size": "moe_intermediate_size"},
		FieldTypes: map[string]field{
			"qk_rope_head_dim": {kInt, false, func(c *Config) any { return &c.DeepseekV4.qkRopeHeadDim }},
		},
		RopePerLayerType: true,
		RopeTypeKeys:     [2]string{dsv4RopeCompress, dsv4RopeMain},
		LayerTypes:       []string{DSV4Sliding, DSV4CSA, DSV4HCA},
		DefaultRopeTheta: 10000,
		// Read into SlidingRope (main) when the file gives no rope_parameters.
		DefaultSlidingRopeTheta: 10000,
		Defaults: func(c *Config) {
			c.VocabSize = 129280
			c.HiddenSize = 4096
			c.MoEIntermediateSize = 2048
			c.NumHiddenLayers = 43
			c.NumAttentionHeads = 64
			c.NumKeyValueHeads = 1
			c.HeadDim = 512
			c.QLoRARank = 1024
			c.NumExpertsPerTok = 6
			c.NumExperts = 256
			c.NSharedExperts = 1
			c.ScoringFunc = "sqrtsoftplus"
			c.NormTopKProb = true
			c.RoutedScalingFactor = 1.5
			c.MaxPositionEmbeddings = 1048576
			c.CompressRopeTheta = 160000
			c.HCMult, c.HCSinkhornIters, c.HCEps = 4, 20, 1e-6
			c.SwigluLimit = 10
			c.SlidingWindow = 128
			c.OGroups, c.OLoRARank = 8, 1024
			c.IndexNHeads, c.IndexHeadDim, c.IndexTopK = 64, 128, 512
			c.NumNextNPredictLayers = 1
			c.RouterAuxLossCoef = 0.001
			c.BOSTokenID, c.EOSTokenIDs = IntPtr(0), []int{1}
		},
		Resolve: resolveDeepseekV4,
		Validate: func(c *Config) error {
			if err := refuseUnknown(c); err != nil {
				return err
			}
			return validateDeepseekV4(c)
		},
		MoELayer: func(c *Config, i int) bool { return c.NumExperts > 0 },
		SharedExpert: func(c *Config) (int, bool) {
			return c.MoEIntermediateSize, false
		},
		RouterBias: func(*Config) bool { return true },
		WriteExtra: func(c *Config, out pyObject) {
			out["rope_theta"] = floatValue(c.SlidingRope.Theta, c.intLit["rope_parameters."+dsv4RopeMain+".rope_theta"])
			out["partial_rotary_factor"] = floatValue(c.Rope.PartialRotaryFactor, false)
			out["qk_rope_head_dim"] = intValue(c.RotaryDim())
			delete(out, "intermediate_size")
		},
		Presets: map[string]func(*Config){
			// Hidden 64, 3 layers (one of each attention kind, the first hash-routed), 4 heads
			// of 16 over one key/value head, 8 rotated dims, 8 experts of 32, top-2, 2 streams.
			"tiny": func(c *Config) {
				tiny(c)
				c.NumHiddenLayers = 3
				c.NumKeyValueHeads = 1
				c.QLoRARank = 24
				c.OGroups, c.OLoRARank = 2, 16
				c.SlidingWindow = 8
				c.CompressRates = map[string]int{DSV4CSA: 4, DSV4HCA: 8}
				c.LayerTypes = []string{DSV4Sliding, DSV4CSA, DSV4HCA}
				c.MLPLayerTypes = []string{DSV4HashMoE, DSV4MoE, DSV4MoE}
				c.HCMult, c.HCSinkhornIters = 2, 5
				c.IndexNHeads, c.IndexHeadDim, c.IndexTopK = 2, 8, 2
				c.SwigluLimit = 10
				c.NumNextNPredictLayers = 0
				c.Rope.PartialRotaryFactor = 0.5
			},
		},
	})
}

// deepseek_v4's layer and routing kinds and its rope dictionaries.
const (
	DSV4Sliding      = "sliding_attention"
	DSV4CSA          = "compressed_sparse_attention"
	DSV4HCA          = "heavily_compressed_attention"
	DSV4HashMoE      = "hash_moe"
	DSV4MoE          = "moe"
	dsv4RopeMain     = "main"
	dsv4RopeCompress = "compress"
)

// DeepseekV4 holds deepseek_v4's keys.
type DeepseekV4 struct {
	// ScoringFunc is the router's activation ("sqrtsoftplus"; transformers also names
	// softmax and sigmoid).
	ScoringFunc string
	// CompressRates is the window of each compressed layer type (compress_rates).
	CompressRates map[string]int
	// CompressRopeTheta is the compressed layers' rope base when rope_parameters does not
	// give theirs.
	CompressRopeTheta float64
	// HCMult streams, HCSinkhornIters Sinkhorn iterations, HCEps their floor.
	HCMult, HCSinkhornIters int
	HCEps                   float64
	// OGroups groups of the output projection, each to OLoRARank.
	OGroups, OLoRARank int
	// The lightning indexer: IndexNHeads heads of IndexHeadDim, IndexTopK entries kept.
	IndexNHeads, IndexHeadDim, IndexTopK int

	// qkRopeHeadDim is the file's qk_rope_head_dim (0 when absent).
	qkRopeHeadDim int
}

func (d DeepseekV4) clone() DeepseekV4 {
	d.CompressRates = maps.Clone(d.CompressRates)
	return d
}

var _ = addFields(map[string]field{
	"scoring_func":        {kString, false, func(c *Config) any { return &c.ScoringFunc }},
	"compress_rates":      {kIntMap, true, func(c *Config) any { return &c.CompressRates }},
	"compress_rope_theta": {kFloat, false, func(c *Config) any { return &c.CompressRopeTheta }},
	"hc_mult":             {kInt, false, func(c *Config) any { return &c.HCMult }},
	"hc_sinkhorn_iters":   {kInt, false, func(c *Config) any { return &c.HCSinkhornIters }},
	"hc_eps":              {kFloat, false, func(c *Config) any { return &c.HCEps }},
	"o_groups":            {kInt, false, func(c *Config) any { return &c.OGroups }},
	"o_lora_rank":         {kInt, false, func(c *Config) any { return &c.OLoRARank }},
	"index_n_heads":       {kInt, false, func(c *Config) any { return &c.IndexNHeads }},
	"index_head_dim":      {kInt, false, func(c *Config) any { return &c.IndexHeadDim }},
	"index_topk":          {kInt, false, func(c *Config) any { return &c.IndexTopK }},
})

// resolveDeepseekV4 is DeepseekV4Config.__post_init__: default compress_rates, layer_types
// (two heavily compressed layers, then compressed sparse and heavily compressed alternating),
// mlp_layer_types (three hash layers, then learned routing), partial_rotary_factor
// (qk_rope_head_dim / head_dim, else 64/512) and, for a file without the two rope
// dictionaries, main = rope_theta and compress = compress_rope_theta with the file's flat
// rope parameters (yarn gets attention_factor 1).
func resolveDeepseekV4(c *Config) {
	n := c.NumHiddenLayers
	// transformers reads intermediate_size as moe_intermediate_size (the shared expert's
	// width); no layer is dense.
	c.IntermediateSize = c.MoEIntermediateSize
	if c.CompressRates == nil {
		c.CompressRates = map[string]int{DSV4CSA: 4, DSV4HCA: 128}
	}
	if len(c.LayerTypes) > n {
		c.LayerTypes = c.LayerTypes[:n]
	}
	deriveLayerTypesAs(c, func(i int) string {
		if i < 2 || i%2 == 0 {
			return DSV4HCA
		}
		return DSV4CSA
	})
	if c.MLPLayerTypes == nil || (c.Latent.mlpDerived && slices.Equal(c.MLPLayerTypes, c.Latent.mlpFrom)) {
		mt := append(slices.Repeat([]string{DSV4HashMoE}, min(n, 3)), slices.Repeat([]string{DSV4MoE}, max(0, n-3))...)
		c.MLPLayerTypes, c.Latent.mlpDerived, c.Latent.mlpFrom = mt, true, slices.Clone(mt)
	}
	if len(c.MLPLayerTypes) > n {
		c.MLPLayerTypes = c.MLPLayerTypes[:n]
	}
	nested := len(c.SlidingRope.src) > 0
	partial := c.Rope.PartialRotaryFactor
	if partial == 0 {
		partial = c.SlidingRope.PartialRotaryFactor
	}
	if partial == 0 {
		partial = 64.0 / 512
		if c.qkRopeHeadDim > 0 && c.HeadDim > 0 {
			partial = float64(c.qkRopeHeadDim) / float64(c.HeadDim)
		}
	}
	if !nested {
		main := Rope{Type: "default", Theta: c.Rope.Theta, PartialRotaryFactor: partial,
			src: map[string]bool{"rope_type": true, "rope_theta": true, "partial_rotary_factor": true}}
		if c.Rope.Theta == 0 {
			main.Theta = 10000
		}
		c.SlidingRope = main
		c.Rope.Theta = c.CompressRopeTheta
		c.Rope.PartialRotaryFactor = partial
		if c.Rope.src == nil {
			c.Rope.src = map[string]bool{}
		}
		c.Rope.src["partial_rotary_factor"] = true
		if c.Rope.Type == "yarn" && c.Rope.AttentionFactor == 0 {
			c.Rope.AttentionFactor = 1
		}
	}
	for _, r := range []*Rope{&c.Rope, &c.SlidingRope} {
		if r.PartialRotaryFactor == 0 {
			r.PartialRotaryFactor = partial
		}
	}
}

func validateDeepseekV4(c *Config) error {
	n := c.NumHiddenLayers
	for _, l := range []struct {
		key   string
		types []string
		ok    []string
	}{{"layer_types", c.LayerTypes, []string{DSV4Sliding, DSV4CSA, DSV4HCA}},
		{"mlp_layer_types", c.MLPLayerTypes, []string{DSV4HashMoE, DSV4MoE}}} {
		if len(l.types) != n {
			return fmt.Errorf("%s has %d entries but num_hidden_layers is %d: give one entry per layer", l.key, len(l.types), n)
		}
		for i, t := range l.types {
			if !slices.Contains(l.ok, t) {
				return fmt.Errorf("%s[%d] is %q; use one of %q", l.key, i, t, l.ok)
			}
		}
	}
	for i, t := range c.LayerTypes {
		if t != DSV4Sliding && c.CompressRates[t] <= 0 {
			return fmt.Errorf("layer %d is %s but compress_rates has no positive rate for it (%v)", i, t, c.CompressRates)
		}
	}
	if c.ScoringFunc != "sqrtsoftplus" {
		return fmt.Errorf("scoring_func %q is not supported; deepseek_v4 routes by \"sqrtsoftplus\"", c.ScoringFunc)
	}
	if !c.NormTopKProb {
		return fmt.Errorf("norm_topk_prob false is not supported: transformers' deepseek_v4 router always renormalises the top-k weights; set it to true")
	}
	if c.NumKeyValueHeads != 1 {
		return fmt.Errorf("num_key_value_heads %d: deepseek_v4 attends with one shared key/value head; set it to 1", c.NumKeyValueHeads)
	}
	if c.NSharedExperts != 1 {
		return fmt.Errorf("n_shared_experts %d: transformers' deepseek_v4 builds exactly one shared expert; set it to 1", c.NSharedExperts)
	}
	for _, p := range []struct {
		key string
		v   int
	}{{"hc_mult", c.HCMult}, {"hc_sinkhorn_iters", c.HCSinkhornIters}, {"o_groups", c.OGroups},
		{"o_lora_rank", c.OLoRARank}, {"q_lora_rank", c.QLoRARank}, {"index_n_heads", c.IndexNHeads},
		{"index_head_dim", c.IndexHeadDim}, {"index_topk", c.IndexTopK}, {"sliding_window", c.SlidingWindow},
		{"n_routed_experts", c.NumExperts}, {"moe_intermediate_size", c.MoEIntermediateSize}} {
		if p.v <= 0 {
			return fmt.Errorf("%s (%d) must be positive", p.key, p.v)
		}
	}
	if c.NumExpertsPerTok <= 0 || c.NumExpertsPerTok > c.NumExperts {
		return fmt.Errorf("num_experts_per_tok (%d) must be between 1 and n_routed_experts (%d)", c.NumExpertsPerTok, c.NumExperts)
	}
	if (c.NumAttentionHeads*c.HeadDim)%c.OGroups != 0 {
		return fmt.Errorf("o_groups (%d) must divide num_attention_heads * head_dim (%d)", c.OGroups, c.NumAttentionHeads*c.HeadDim)
	}
	rd := c.RotaryDim()
	if rd%2 != 0 || rd > c.HeadDim || rd > c.IndexHeadDim {
		return fmt.Errorf("the rotated width int(head_dim * partial_rotary_factor) = %d must be even and at most head_dim (%d) and index_head_dim (%d)", rd, c.HeadDim, c.IndexHeadDim)
	}
	if c.SlidingRope.PartialRotaryFactor != c.Rope.PartialRotaryFactor {
		return fmt.Errorf("rope_parameters main and compress rotate different fractions (%g, %g); transformers sizes both by the same head width, give them one partial_rotary_factor",
			c.SlidingRope.PartialRotaryFactor, c.Rope.PartialRotaryFactor)
	}
	return nil
}
