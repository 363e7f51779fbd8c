package config

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// maxDim bounds every size so that products of two sizes fit in an int.
const maxDim = 1 << 30

// HiddenActs are the hidden_act values accepted (transformers' ACT2FN names of the activations
// these families use; "swish" is transformers' alias of "silu").
var HiddenActs = []string{"gelu", "gelu_fast", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish"}

// DTypes are the dtype / torch_dtype values accepted.
var DTypes = []string{"bfloat16", "float16", "float32", "float64", "float8_e4m3fn", "float8_e5m2"}

// RopeTypes are the rope_type values accepted.
var RopeTypes = []string{"default", "dynamic", "linear", "llama3", "longrope", "proportional", "yarn"}

// Validate re-derives computed values (layer_types when it was not given explicitly, head_dim
// and num_key_value_heads when zero) and checks that the configuration describes a model that
// can be built. Errors name the key and what to change.
func (c *Config) Validate() error {
	if err := c.resolve(); err != nil {
		return fmt.Errorf("config: %s: %w", c.ModelType, err)
	}
	if err := c.validate(); err != nil {
		return fmt.Errorf("config: %s: %w", c.ModelType, err)
	}
	return nil
}

func (c *Config) validate() error {
	f := c.Family()
	if f == nil {
		_, err := Lookup(c.ModelType)
		return err
	}
	for _, s := range []struct {
		key string
		v   int
	}{
		{"vocab_size", c.VocabSize},
		{"hidden_size", c.HiddenSize},
		{"intermediate_size", c.IntermediateSize},
		{"num_hidden_layers", c.NumHiddenLayers},
		{"num_attention_heads", c.NumAttentionHeads},
		{"num_key_value_heads", c.NumKeyValueHeads},
		{"head_dim", c.HeadDim},
		{"max_position_embeddings", c.MaxPositionEmbeddings},
	} {
		if _, has := f.knows(s.key); !has && s.key == "intermediate_size" {
			continue // no dense MLP (qwen3_5_moe_text)
		}
		if s.v <= 0 {
			return fmt.Errorf("%s (%d) must be positive", s.key, s.v)
		}
		if s.v > maxDim {
			return fmt.Errorf("%s (%d) is larger than %d", s.key, s.v, maxDim)
		}
	}
	if c.NumHiddenLayers > maxLayers {
		return fmt.Errorf("num_hidden_layers (%d) is larger than %d", c.NumHiddenLayers, maxLayers)
	}
	if c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
		return fmt.Errorf("num_attention_heads (%d) is not a multiple of num_key_value_heads (%d): set num_key_value_heads to one of %v",
			c.NumAttentionHeads, c.NumKeyValueHeads, divisors(c.NumAttentionHeads))
	}
	if int64(c.NumAttentionHeads)*int64(c.HeadDim) > maxDim {
		return fmt.Errorf("num_attention_heads * head_dim (%d * %d) is larger than %d", c.NumAttentionHeads, c.HeadDim, maxDim)
	}
	if !(c.RMSNormEps > 0) || c.RMSNormEps >= 1 {
		key := "rms_norm_eps"
		if f.CenterNorm != nil && f.CenterNorm(c) {
			key = "layer_norm_eps" // the key the LayerNorms' epsilon comes from (cohere2_moe)
		}
		return fmt.Errorf("%s (%g) must be in (0, 1), typically 1e-5 or 1e-6", key, c.RMSNormEps)
	}
	if c.InitializerRange < 0 || c.InitializerRange > 1 {
		return fmt.Errorf("initializer_range (%g) must be in [0, 1], typically 0.02", c.InitializerRange)
	}
	if c.AttentionDropout < 0 || c.AttentionDropout > 1 {
		return fmt.Errorf("attention_dropout (%g) must be a probability in [0, 1]", c.AttentionDropout)
	}
	if !slices.Contains(HiddenActs, c.HiddenAct) {
		key := "hidden_act"
		if _, has := f.knows("activation_function"); has {
			key = "activation_function" // jetmoe's name of it
		}
		return fmt.Errorf("%s %q is not supported; use one of %s", key, c.HiddenAct, strings.Join(HiddenActs, ", "))
	}
	if c.DType != "" && !slices.Contains(DTypes, c.DType) {
		return fmt.Errorf("dtype %q is not supported; use one of %s", c.DType, strings.Join(DTypes, ", "))
	}
	if c.SlidingWindow < 0 {
		return fmt.Errorf("sliding_window (%d) must be positive, or null for no sliding window", c.SlidingWindow)
	}
	if c.MaxWindowLayers < 0 {
		return fmt.Errorf("max_window_layers (%d) must not be negative", c.MaxWindowLayers)
	}
	if c.PretrainingTP < 0 {
		return fmt.Errorf("pretraining_tp (%d) must not be negative", c.PretrainingTP)
	}
	if c.ClipQKV < 0 {
		return fmt.Errorf("clip_qkv (%g) must be positive, or null for no clipping", c.ClipQKV)
	}
	if c.LayerTypes != nil {
		if len(c.LayerTypes) != c.NumHiddenLayers {
			return fmt.Errorf("layer_types has %d entries but num_hidden_layers is %d: give one entry per layer", len(c.LayerTypes), c.NumHiddenLayers)
		}
		kinds := []string{FullAttention, SlidingAttention}
		if f.LayerTypes != nil {
			kinds = f.LayerTypes
		}
		for i, t := range c.LayerTypes {
			if !slices.Contains(kinds, t) {
				return fmt.Errorf("layer_types[%d] is %q; use one of %q", i, t, kinds)
			}
		}
	}
	if err := c.validateRope(); err != nil {
		return err
	}
	if f.MoELayer != nil {
		if err := c.validateMoE(); err != nil {
			return err
		}
	}
	if f.Validate != nil {
		return f.Validate(c)
	}
	return nil
}

func (c *Config) validateMoE() error {
	if c.NumExperts <= 0 || c.NumExperts > maxDim {
		return fmt.Errorf("number of experts (%d) must be positive", c.NumExperts)
	}
	if c.NumExpertsPerTok <= 0 || c.NumExpertsPerTok > c.NumExperts {
		return fmt.Errorf("num_experts_per_tok (%d) must be between 1 and the number of experts (%d)", c.NumExpertsPerTok, c.NumExperts)
	}
	if e := c.ExpertIntermediateSize(); e <= 0 || e > maxDim {
		return fmt.Errorf("expert intermediate size (%d) must be positive", e)
	}
	if c.RouterAuxLossCoef < 0 || math.IsNaN(c.RouterAuxLossCoef) {
		return fmt.Errorf("router_aux_loss_coef (%g) must not be negative", c.RouterAuxLossCoef)
	}
	if c.RouterJitterNoise < 0 || c.RouterJitterNoise >= 1 {
		return fmt.Errorf("router_jitter_noise (%g) must be in [0, 1)", c.RouterJitterNoise)
	}
	return nil
}

func (c *Config) validateRope() error {
	if f := c.Family(); f != nil && f.RopePerLayerType {
		if err := c.validateRopeOf(&c.Rope); err != nil {
			return fmt.Errorf("rope_parameters.%s: %w", FullAttention, err)
		}
		if err := c.validateRopeOf(&c.SlidingRope); err != nil {
			return fmt.Errorf("rope_parameters.%s: %w", SlidingAttention, err)
		}
		return nil
	}
	return c.validateRopeOf(&c.Rope)
}

// ropeRotaryDim is RotaryDim for the rope r.
func (c *Config) ropeRotaryDim(r *Rope) int {
	if r.PartialRotaryFactor == 0 {
		return c.HeadDim
	}
	return int(float64(c.HeadDim) * r.PartialRotaryFactor)
}

func (c *Config) validateRopeOf(r *Rope) error {
	if !slices.Contains(RopeTypes, r.Type) {
		return fmt.Errorf("rope_type %q is not supported; use one of %s", r.Type, strings.Join(RopeTypes, ", "))
	}
	if !(r.Theta > 0) || math.IsInf(r.Theta, 0) {
		return fmt.Errorf("rope_theta (%g) must be positive", r.Theta)
	}
	if r.PartialRotaryFactor < 0 || r.PartialRotaryFactor > 1 {
		return fmt.Errorf("partial_rotary_factor (%g) must be in (0, 1]", r.PartialRotaryFactor)
	}
	if rd := c.ropeRotaryDim(r); r.Type != "proportional" && (rd < 2 || rd%2 != 0) {
		return fmt.Errorf("rotary dimension head_dim * partial_rotary_factor = %d must be even and at least 2: change partial_rotary_factor or head_dim", rd)
	}
	needFactor := func() error {
		if !(r.Factor > 0) {
			return fmt.Errorf("rope_type %q needs a positive factor in rope_parameters (got %g)", r.Type, r.Factor)
		}
		return nil
	}
	switch r.Type {
	case "linear", "dynamic", "yarn":
		if err := needFactor(); err != nil {
			return err
		}
	case "llama3":
		if err := needFactor(); err != nil {
			return err
		}
		if !(r.LowFreqFactor > 0) || !(r.HighFreqFactor > r.LowFreqFactor) {
			return fmt.Errorf("rope_type \"llama3\" needs 0 < low_freq_factor < high_freq_factor (got %g and %g); Llama 3 uses 1.0 and 4.0",
				r.LowFreqFactor, r.HighFreqFactor)
		}
	case "longrope":
		want := c.ropeRotaryDim(r) / 2
		if len(r.ShortFactor) != want || len(r.LongFactor) != want {
			return fmt.Errorf("rope_type \"longrope\" needs short_factor and long_factor with %d entries each (rotary dimension / 2), got %d and %d",
				want, len(r.ShortFactor), len(r.LongFactor))
		}
	}
	switch r.Type {
	case "llama3", "yarn", "longrope":
		if r.OriginalMaxPositionEmbeddings <= 0 {
			return fmt.Errorf("original_max_position_embeddings (%d) must be positive", r.OriginalMaxPositionEmbeddings)
		}
	}
	for _, v := range []struct {
		key string
		v   float64
	}{{"factor", r.Factor}, {"beta_fast", r.BetaFast}, {"beta_slow", r.BetaSlow}, {"attention_factor", r.AttentionFactor}} {
		if v.v < 0 {
			return fmt.Errorf("rope_parameters.%s (%g) must not be negative", v.key, v.v)
		}
	}
	return nil
}

// divisors lists the divisors of n in increasing order (at most 64 of them).
func divisors(n int) []int {
	var small, large []int
	for d := 1; d*d <= n; d++ {
		if n%d == 0 {
			small = append(small, d)
			if d*d != n {
				large = append(large, n/d)
			}
		}
	}
	slices.Reverse(large)
	out := append(small, large...)
	if len(out) > 64 {
		out = out[:64]
	}
	return out
}

// validateSparseStep checks qwen3_moe's layer selection keys.
func validateSparseStep(c *Config) error {
	if c.DecoderSparseStep <= 0 {
		return fmt.Errorf("decoder_sparse_step (%d) must be at least 1 (1 makes every layer sparse)", c.DecoderSparseStep)
	}
	for i, l := range c.MLPOnlyLayers {
		if l < 0 || l >= c.NumHiddenLayers {
			return fmt.Errorf("mlp_only_layers[%d] = %d is not a layer index (0..%d)", i, l, c.NumHiddenLayers-1)
		}
	}
	return nil
}
