package config

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Gemma4 holds the keys of gemma4_text (Gemma4TextConfig) beyond Gemma 3's: the global layers'
// own head width and key/value heads, the shared key/value projection of those layers, and
// the optional parts of the decoder (per-layer inputs, shared KV layers, the MoE block), which
// Shape describes in GlobalShape.
type Gemma4 struct {
	// GlobalHeadDim is the head width of the full-attention layers (global_head_dim); 0 means
	// head_dim. Default 512.
	GlobalHeadDim int
	// NumGlobalKeyValueHeads is the number of key/value heads of the full-attention layers when
	// AttentionKEqV is set (num_global_key_value_heads); 0 means num_key_value_heads.
	// Default none.
	NumGlobalKeyValueHeads int
	// AttentionKEqV: the full-attention layers have no v_proj; their values are the k_proj
	// output, normalised without a scale (attention_k_eq_v). Default false.
	AttentionKEqV bool
	// HiddenSizePerLayerInput is the width of the per-layer input embeddings (PLE); 0 turns
	// them off. Default 256.
	HiddenSizePerLayerInput int
	// VocabSizePerLayerInput is the vocabulary of the per-layer input embeddings. Default
	// 262144.
	VocabSizePerLayerInput int
	// NumKVSharedLayers: the last NumKVSharedLayers layers reuse the keys and values of the
	// last earlier layer of their type. Default 0.
	NumKVSharedLayers int
	// EnableMoEBlock adds a mixture of experts beside each layer's MLP. Default false.
	EnableMoEBlock bool
	// UseDoubleWideMLP doubles the MLP width of the KV-shared layers. Default false.
	UseDoubleWideMLP bool
	// TopKExperts is the MoE block's top-k (top_k_experts). Default none.
	TopKExperts int
	// FullKVHeads is the key/value heads of the full-attention layers when a file overrides
	// them (per_layer_config's num_key_value_heads, or num_global_key_value_heads under
	// attention_k_eq_v); 0 means num_key_value_heads.
	FullKVHeads int
	// perLayerErr is what was wrong with the file's per_layer_config (Validate returns it).
	perLayerErr error
	// Bidirectional is use_bidirectional_attention ("all", "vision" or none).
	Bidirectional string
}

// Gemma 4's keys. num_experts is nullable in this family (None unless the MoE block is on),
// and use_bidirectional_attention is a string there, so both are family field types.
var _ = addFields(map[string]field{
	"global_head_dim":             {kInt, true, func(c *Config) any { return &c.GlobalHeadDim }},
	"num_global_key_value_heads":  {kInt, true, func(c *Config) any { return &c.NumGlobalKeyValueHeads }},
	"attention_k_eq_v":            {kBool, false, func(c *Config) any { return &c.AttentionKEqV }},
	"hidden_size_per_layer_input": {kInt, false, func(c *Config) any { return &c.HiddenSizePerLayerInput }},
	"vocab_size_per_layer_input":  {kInt, false, func(c *Config) any { return &c.VocabSizePerLayerInput }},
	"num_kv_shared_layers":        {kInt, false, func(c *Config) any { return &c.NumKVSharedLayers }},
	"enable_moe_block":            {kBool, false, func(c *Config) any { return &c.EnableMoEBlock }},
	"use_double_wide_mlp":         {kBool, false, func(c *Config) any { return &c.UseDoubleWideMLP }},
	"top_k_experts":               {kInt, true, func(c *Config) any { return &c.TopKExperts }},
})

// gemma4Fields are gemma4_text's types of keys other families type differently.
var gemma4Fields = map[string]field{
	"num_experts":                 {kInt, true, func(c *Config) any { return &c.NumExperts }},
	"moe_intermediate_size":       {kInt, true, func(c *Config) any { return &c.MoEIntermediateSize }},
	"use_bidirectional_attention": {kString, true, func(c *Config) any { return &c.Bidirectional }},
}

// gemma4_text: Gemma4TextConfig, the text decoder of Gemma 4 (Gemma4ForCausalLM). Layers
// follow layer_types (when absent every sixth layer, 1-based, is full attention; the last
// layer is always full attention, as transformers forces it). The sliding layers attend over
// sliding_window tokens with heads of head_dim; the full layers use heads of global_head_dim
// and, with attention_k_eq_v, num_global_key_value_heads key/value heads whose values are the
// keys' projection. transformers 5.15 on folds those two keys into per_layer_config
// ({"<full layer>": {"head_dim", "num_key_value_heads"}}), which is what it writes and what
// this package writes; both dialects are read. Queries and keys are RMS-normalised per head and values without a scale;
// scores are not scaled (scaling 1.0); every norm multiplies by w itself (weights start at
// one); embeddings are scaled by sqrt(hidden_size); rope_parameters holds one dictionary per
// layer type (default: theta 10000 on the sliding layers, proportional RoPE over a quarter of
// each head with theta 1e6 on the full ones); each layer's output is multiplied by its
// layer_scalar buffer; final_logit_softcapping caps the logits.
//
// Keys this package does not know are refused. The per-layer inputs
// (hidden_size_per_layer_input, on by default), the shared KV layers (num_kv_shared_layers:
// the last ones reuse the keys and values of the last earlier layer of their type) and the MoE
// block are read into Shape's GlobalShape; bidirectional attention of every token is read but
// refused by the model with the key named.
func init() {
	Register(Family{
		ModelType:     "gemma4_text",
		Architectures: []string{"Gemma4ForCausalLM", "Gemma4TextModel"},
		Keys: []string{"attention_bias", "attention_dropout", "attention_k_eq_v", "bos_token_id",
			"enable_moe_block", "eos_token_id", "final_logit_softcapping", "head_dim",
			"hidden_activation", "hidden_size", "hidden_size_per_layer_input", "initializer_range",
			"intermediate_size", "layer_types", "max_position_embeddings", "moe_intermediate_size",
			"num_attention_heads", "num_experts", "num_hidden_layers",
			"num_key_value_heads", "num_kv_shared_layers", "pad_token_id", "rms_norm_eps", "sliding_window",
			"tie_word_embeddings", "top_k_experts", "use_bidirectional_attention", "use_cache",
			"use_double_wide_mlp", "vocab_size", "vocab_size_per_layer_input"},
		// transformers (5.15 on) folds the flat keys of older files into per_layer_config
		// and writes only that.
		Consumed:                []string{"global_head_dim", "num_global_key_value_heads"},
		Kept:                    []string{"per_layer_config"},
		WriteExtra:              writeGemma4PerLayer,
		FieldTypes:              gemma4Fields,
		DefaultRopeTheta:        1e6,
		RopePerLayerType:        true,
		DefaultSlidingRopeTheta: 1e4,
		Norms:                   SandwichNorms,
		QKNorm:                  QKNormPerHead,
		Defaults: func(c *Config) {
			c.VocabSize = 262144
			c.HiddenSize = 2304
			c.IntermediateSize = 9216
			c.NumHiddenLayers = 30
			c.NumAttentionHeads = 8
			c.NumKeyValueHeads = 4
			c.HeadDim = 256
			c.GlobalHeadDim = 512
			c.HiddenAct = "gelu_pytorch_tanh"
			c.MaxPositionEmbeddings = 131072
			c.PadTokenID = IntPtr(0)
			c.EOSTokenIDs = []int{1}
			c.BOSTokenID = IntPtr(2)
			c.TieWordEmbeddings = true
			c.SlidingWindow = 512
			c.VocabSizePerLayerInput = 262144
			c.HiddenSizePerLayerInput = 256
			c.Rope.Type = "proportional"
			c.Rope.PartialRotaryFactor = 0.25
		},
		Resolve: func(c *Config) {
			if len(c.Rope.src) > 0 {
				// A file's full_attention parameters replace the default dictionary whole.
				if !c.Rope.src["rope_type"] && !c.Rope.src["type"] {
					c.Rope.Type = "default"
				}
				if !c.Rope.src["partial_rotary_factor"] {
					c.Rope.PartialRotaryFactor = 0
				}
			}
			deriveLayerTypesBy(c, func(i int) bool { return (i+1)%6 != 0 })
			if n := len(c.LayerTypes); n > 0 && c.LayerTypes[n-1] != FullAttention {
				// transformers forces the last layer to full attention (with a warning).
				c.LayerTypes[n-1] = FullAttention
			}
			resolveGemma4PerLayer(c) // after layer_types: its entries are checked against them
		},
		Validate: validateGemma4,
		Presets: map[string]func(*Config){
			// Both head widths, the shared key/value projection on the full layers and a
			// window shorter than the tiny context.
			"tiny": func(c *Config) {
				tiny(c)
				c.VocabSizePerLayerInput = TinyVocab
				c.HiddenSizePerLayerInput = 0
				c.GlobalHeadDim = 32
				c.NumGlobalKeyValueHeads = 1
				c.AttentionKEqV = true
				c.SlidingWindow = 8
				c.NumHiddenLayers = 2
				c.LayerTypes = []string{SlidingAttention, FullAttention}
				c.src["layer_types"] = true
				c.FinalLogitSoftcapping = 30
				c.PadTokenID = IntPtr(0)
			},
		},
	})
}

// validateGemma4 checks gemma4_text's own keys, and refuses keys it does not know.
func validateGemma4(c *Config) error {
	if err := refuseUnknown(c); err != nil {
		return err
	}
	if c.perLayerErr != nil {
		return c.perLayerErr
	}
	v := c.FinalLogitSoftcapping
	if v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return fmt.Errorf("final_logit_softcapping (%g) must be a positive cap, or null for none", v)
	}
	switch c.Bidirectional {
	case "", "all", "vision":
	default:
		return fmt.Errorf("use_bidirectional_attention %q must be \"all\", \"vision\" or null", c.Bidirectional)
	}
	for _, s := range []struct {
		key string
		v   int
	}{{"global_head_dim", c.GlobalHeadDim}, {"num_global_key_value_heads", c.NumGlobalKeyValueHeads},
		{"hidden_size_per_layer_input", c.HiddenSizePerLayerInput}, {"vocab_size_per_layer_input", c.VocabSizePerLayerInput},
		{"num_kv_shared_layers", c.NumKVSharedLayers}} {
		if s.v < 0 || s.v > maxDim {
			return fmt.Errorf("%s (%d) must be in [0, %d]", s.key, s.v, maxDim)
		}
	}
	if c.NumKVSharedLayers >= c.NumHiddenLayers && c.NumKVSharedLayers > 0 {
		return fmt.Errorf("num_kv_shared_layers (%d) must be below num_hidden_layers (%d): the first layer computes its own keys", c.NumKVSharedLayers, c.NumHiddenLayers)
	}
	if kv := c.GlobalKVHeads(); kv <= 0 || c.NumAttentionHeads%kv != 0 {
		return fmt.Errorf("num_global_key_value_heads (%d) must divide num_attention_heads (%d)", kv, c.NumAttentionHeads)
	}
	return nil
}

// GlobalHead is the head width of gemma4_text's full-attention layers: global_head_dim, or
// head_dim when it is 0; head_dim for other families.
func (c *Config) GlobalHead() int {
	if c.ModelType == "gemma4_text" && c.GlobalHeadDim > 0 {
		return c.GlobalHeadDim
	}
	return c.HeadDim
}

// GlobalKVHeads is the number of key/value heads of gemma4_text's full-attention layers:
// num_global_key_value_heads when attention_k_eq_v sets it, else num_key_value_heads.
func (c *Config) GlobalKVHeads() int {
	if c.FullKVHeads > 0 {
		return c.FullKVHeads
	}
	if c.AttentionKEqV && c.NumGlobalKeyValueHeads > 0 {
		return c.NumGlobalKeyValueHeads
	}
	return c.NumKeyValueHeads
}

// resolveGemma4PerLayer reads per_layer_config, transformers' (5.15 on) record of the layers
// whose attention differs: {"<layer>": {"head_dim": ..., "num_key_value_heads": ...}}. The
// full-attention layers must agree on one head width and key/value head count, which become
// GlobalHeadDim and FullKVHeads; a sliding layer may only restate head_dim and
// num_key_value_heads. The key is then dropped: Write makes it again from the fields
// (writeGemma4PerLayer). Files without it keep global_head_dim (default 512) and
// num_global_key_value_heads (under attention_k_eq_v) as transformers synthesises them.
func resolveGemma4PerLayer(c *Config) {
	raw, ok := c.Extra("per_layer_config")
	if !ok {
		return
	}
	c.RemoveExtra("per_layer_config")
	bad := func(format string, args ...any) {
		c.perLayerErr = fmt.Errorf("per_layer_config: "+format, args...)
	}
	if isNull(raw) {
		return
	}
	var entries map[string]map[string]json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil {
		bad("want an object of layer index -> {head_dim, num_key_value_heads}: %v", err)
		return
	}
	head, kv := 0, 0
	// In layer order (then the keys that are not indices), so that a conflict is reported the
	// same way every time.
	keys := slices.SortedFunc(maps.Keys(entries), func(a, b string) int {
		ia, ea := strconv.Atoi(a)
		ib, eb := strconv.Atoi(b)
		switch {
		case ea == nil && eb == nil && ia != ib:
			return cmp.Compare(ia, ib)
		case (ea == nil) != (eb == nil):
			if ea == nil {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	for _, k := range keys {
		e := entries[k]
		i, err := strconv.Atoi(k)
		// Decimal digits only; transformers writes them zero-padded ("05" of 30 layers).
		if err != nil || i < 0 || i >= c.NumHiddenLayers || strings.Trim(k, "0123456789") != "" {
			bad("key %q is not a layer index in [0, %d)", k, c.NumHiddenLayers)
			return
		}
		kind := SlidingAttention
		if i < len(c.LayerTypes) {
			kind = c.LayerTypes[i]
		}
		full := kind == FullAttention
		for _, name := range slices.Sorted(maps.Keys(e)) {
			v := e[name]
			n, err := decodeInt("per_layer_config."+k+"."+name, v)
			if err != nil {
				c.perLayerErr = fmt.Errorf("per_layer_config: %w", err)
				return
			}
			base := map[string]int{"head_dim": c.HeadDim, "num_key_value_heads": c.NumKeyValueHeads, "num_attention_heads": c.NumAttentionHeads}
			want, known := base[name]
			switch {
			case !known:
				bad("layer %d: %q is not supported (head_dim, num_key_value_heads and num_attention_heads are)", i, name)
				return
			case name == "num_attention_heads" && n != want, !full && n != want:
				bad("layer %d (%s): %s %d differs from the model's %d, which is not supported", i, kind, name, n, want)
				return
			case !full:
			case name == "head_dim":
				if head != 0 && n != head {
					bad("the full-attention layers have head_dim %d and %d; one width for all of them is supported", head, n)
					return
				}
				head = n
			case name == "num_key_value_heads":
				if kv != 0 && n != kv {
					bad("the full-attention layers have %d and %d key/value heads; one count for all of them is supported", kv, n)
					return
				}
				kv = n
			}
		}
	}
	c.GlobalHeadDim = head
	if head == 0 {
		c.GlobalHeadDim = c.HeadDim // the full layers keep head_dim
	}
	c.FullKVHeads = kv
}

// writeGemma4PerLayer writes per_layer_config as transformers synthesises it: each
// full-attention layer's head_dim (global_head_dim) and, when overridden, its
// num_key_value_heads.
func writeGemma4PerLayer(c *Config, out pyObject) {
	per := pyIntKeys{}
	for i, t := range c.LayerTypes {
		if t != FullAttention {
			continue
		}
		e := pyObject{"head_dim": intValue(c.GlobalHead())}
		if kv := c.GlobalKVHeads(); kv != c.NumKeyValueHeads || c.FullKVHeads > 0 || (c.AttentionKEqV && c.NumGlobalKeyValueHeads > 0) {
			e["num_key_value_heads"] = intValue(kv)
		}
		per[i] = e
	}
	out["per_layer_config"] = per
}

// UnfoldConsumed returns the family's Consumed keys with the values c resolves them to, and
// the key they are folded into (gemma4_text: global_head_dim and num_global_key_value_heads,
// folded into per_layer_config); nil for families without such keys. An edit of one of them
// (models.ApplyOverrides) replaces the folded key with these, so that the edit is not lost to
// the folded key, which transformers prefers.
func (c *Config) UnfoldConsumed() (flat map[string]any, folded string) {
	if c.ModelType != "gemma4_text" {
		return nil, ""
	}
	flat = map[string]any{"global_head_dim": c.GlobalHead()}
	if kv := c.GlobalKVHeads(); kv != c.NumKeyValueHeads || c.AttentionKEqV {
		flat["num_global_key_value_heads"] = kv
	}
	return flat, "per_layer_config"
}
