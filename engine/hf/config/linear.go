package config

import (
	"bytes"
	"fmt"
	"slices"
)

// LinearAttention is the layer type of gated delta-net (linear attention) layers in
// LayerTypes (qwen3_next, qwen3_5_moe_text).
const LinearAttention = "linear_attention"

// Linear are the config.json keys of the gated delta-net layers of qwen3_next and
// qwen3_5_moe_text. Each such layer projects the hidden state to LinearNumKeyHeads query and
// key heads of LinearKeyHeadDim and LinearNumValueHeads value heads of LinearValueHeadDim (each
// query/key head serves LinearNumValueHeads / LinearNumKeyHeads consecutive value heads), runs
// a depthwise causal convolution of LinearConvKernelDim taps over the concatenated q, k and v,
// and the gated delta rule over the sequence. Config embeds it; other families leave it zero.
type Linear struct {
	// LinearConvKernelDim is the causal convolution's kernel size. Default 4.
	LinearConvKernelDim int
	// LinearKeyHeadDim and LinearValueHeadDim are the key and value head widths. Default 128.
	LinearKeyHeadDim, LinearValueHeadDim int
	// LinearNumKeyHeads and LinearNumValueHeads are the head counts. Default 16 and 32.
	LinearNumKeyHeads, LinearNumValueHeads int
	// FullAttentionInterval makes every FullAttentionInterval-th layer (1-based) full
	// attention and the others linear when layer_types is absent. transformers reads the key
	// (full_attention_interval) on load and writes layer_types instead. Default 4.
	FullAttentionInterval int
}

// The keys of Linear (full_attention_interval is read by the families' Resolve: transformers
// consumes it).
var _ = addFields(map[string]field{
	"linear_conv_kernel_dim": {kInt, false, func(c *Config) any { return &c.LinearConvKernelDim }},
	"linear_key_head_dim":    {kInt, false, func(c *Config) any { return &c.LinearKeyHeadDim }},
	"linear_value_head_dim":  {kInt, false, func(c *Config) any { return &c.LinearValueHeadDim }},
	"linear_num_key_heads":   {kInt, false, func(c *Config) any { return &c.LinearNumKeyHeads }},
	"linear_num_value_heads": {kInt, false, func(c *Config) any { return &c.LinearNumValueHeads }},
})

// IsLinearLayer reports whether layer i is a gated delta-net (linear attention) layer.
func (c *Config) IsLinearLayer(i int) bool {
	return i >= 0 && i < len(c.LayerTypes) && c.LayerTypes[i] == LinearAttention
}

// linearDefaults are transformers' defaults of the gated delta-net keys.
func linearDefaults(c *Config) {
	c.LinearConvKernelDim = 4
	c.LinearKeyHeadDim, c.LinearValueHeadDim = 128, 128
	c.LinearNumKeyHeads, c.LinearNumValueHeads = 16, 32
	c.FullAttentionInterval = 4
	c.Rope.PartialRotaryFactor = 0.25
}

// resolveLinear is the families' __post_init__: it reads a full_attention_interval key of the
// file (consumed when layer_types is absent, kept beside it), derives layer_types from it when
// absent (layer i is full attention when (i+1) is a
// multiple of the interval, else linear) and sets partial_rotary_factor to 0.25 when the file
// has none, writing it at the top level too as transformers does.
func resolveLinear(c *Config) {
	for i, kv := range c.extra {
		if kv.Key != "full_attention_interval" {
			continue
		}
		if v, err := decodeInt("full_attention_interval", kv.Value); err == nil && !isNull(bytes.TrimSpace(kv.Value)) {
			c.FullAttentionInterval = v
		}
		if c.LayerTypes == nil {
			// Consumed: transformers pops it to derive layer_types.
			c.extra = slices.Delete(c.extra, i, i+1)
		} else {
			// Beside layer_types transformers keeps it as an attribute, and writes it back.
			c.extra[i].understood = true
		}
		break
	}
	if c.Rope.PartialRotaryFactor == 0 {
		c.Rope.PartialRotaryFactor = 0.25
	}
	keepTopLevelPartialRotary(c)
	n := c.FullAttentionInterval
	deriveLayerTypesAs(c, func(i int) string {
		if n > 0 && (i+1)%n == 0 {
			return FullAttention
		}
		return LinearAttention
	})
}

// validateLinear checks the gated delta-net keys and refuses keys the family does not know.
func validateLinear(c *Config) error {
	if err := refuseUnknown(c); err != nil {
		return err
	}
	if raw, ok := c.Extra("attn_output_gate"); ok && string(bytes.TrimSpace(raw)) == "false" {
		return fmt.Errorf("attn_output_gate false is not supported: transformers' %s attention always gates its output (sigmoid of q_proj's gate rows), so the checkpoint's q_proj has those rows; remove the key", c.ModelType)
	}
	for _, kv := range []struct {
		key string
		v   int
	}{{"linear_conv_kernel_dim", c.LinearConvKernelDim}, {"linear_key_head_dim", c.LinearKeyHeadDim},
		{"linear_value_head_dim", c.LinearValueHeadDim}, {"linear_num_key_heads", c.LinearNumKeyHeads},
		{"linear_num_value_heads", c.LinearNumValueHeads}} {
		if kv.v <= 0 || kv.v > maxDim {
			return fmt.Errorf("%s (%d) must be a positive size", kv.key, kv.v)
		}
	}
	if c.LinearNumValueHeads%c.LinearNumKeyHeads != 0 {
		return fmt.Errorf("linear_num_value_heads (%d) must be a multiple of linear_num_key_heads (%d): each key head serves a whole group of value heads", c.LinearNumValueHeads, c.LinearNumKeyHeads)
	}
	if c.FullAttentionInterval <= 0 {
		return fmt.Errorf("full_attention_interval (%d) must be positive", c.FullAttentionInterval)
	}
	if !slices.Contains(c.LayerTypes, FullAttention) && !slices.Contains(c.LayerTypes, LinearAttention) {
		return fmt.Errorf("layer_types must name each layer %q or %q", FullAttention, LinearAttention)
	}
	return nil
}
