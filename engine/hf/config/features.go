package config

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// Features are the config.json keys of the families whose decoders depart from Llama's beyond
// biases and q/k norms: granite's multipliers, smollm3's NoPE layers, phi3's pretraining
// context and dropouts, and the shared and group-routed experts of qwen2_moe and glm4_moe.
// Config embeds it; a family that lacks a key leaves its field at the zero value, which is
// not written.
type Features struct {
	// EmbeddingMultiplier scales the token embeddings (granite). Default 1.0.
	EmbeddingMultiplier float64
	// ResidualMultiplier scales the attention and MLP outputs before each residual add
	// (granite). Default 1.0.
	ResidualMultiplier float64
	// AttentionMultiplier is the attention score scale in place of 1/sqrt(head_dim) (granite).
	// Default 1.0.
	AttentionMultiplier float64
	// LogitsScaling divides the LM head's logits (granite). Default 1.0.
	LogitsScaling float64

	// NoRopeLayers has one entry per layer: 1 rotates queries and keys, 0 is a NoPE layer
	// (smollm3). Derived from NoRopeLayerInterval when absent.
	NoRopeLayers []int
	// NoRopeLayerInterval makes every NoRopeLayerInterval-th layer a NoPE layer when
	// no_rope_layers is absent (smollm3). Default 4.
	NoRopeLayerInterval int

	// OriginalMaxPositionEmbeddings is the pretraining context of phi3 (a top-level key there);
	// longrope switches from short_factor to long_factor past it. Default 4096.
	OriginalMaxPositionEmbeddings int
	// ResidPdrop and EmbdPdrop are phi3's dropout probabilities on the residual branches and
	// the embeddings. Default 0.0.
	ResidPdrop, EmbdPdrop float64

	// SharedExpertIntermediateSize is the width of qwen2_moe's shared expert, a SwiGLU MLP
	// beside the routed experts whose output a sigmoid gate scales. Default 5632.
	SharedExpertIntermediateSize int
	// QKVBias: qwen2_moe's q, k and v projections carry biases. Default true.
	QKVBiasKey bool

	// NSharedExperts is glm4_moe's number of shared experts, one SwiGLU MLP of
	// n_shared_experts * moe_intermediate_size beside the routed experts. Default 1.
	NSharedExperts int
	// NGroup and TopKGroup limit glm4_moe's routing to the TopKGroup best of NGroup expert
	// groups. Default 1 and 1.
	NGroup, TopKGroup int
	// RoutedScalingFactor multiplies glm4_moe's routing weights. Default 1.0.
	RoutedScalingFactor float64
	// FirstKDenseReplace: glm4_moe's first FirstKDenseReplace layers have a dense MLP.
	// Default 1.
	FirstKDenseReplace int
	// NumNextNPredictLayers is glm4_moe's and deepseek_v3's number of multi-token-prediction
	// layers after the decoder (0: none), which transformers keeps but does not build.
	// Default 1.
	NumNextNPredictLayers int
	// UseQKNorm: glm4_moe normalises each query and key head (RMSNorm of head_dim). Default
	// false.
	UseQKNorm bool
}

func (f Features) clone() Features {
	f.NoRopeLayers = slices.Clone(f.NoRopeLayers)
	return f
}

// UsesRoPE reports whether layer i rotates its queries and keys (false for smollm3's NoPE
// layers and cohere2_moe's unrotated ones, Family.RoPELayer).
func (c *Config) UsesRoPE(i int) bool {
	if f := c.Family(); f != nil && f.RoPELayer != nil {
		return f.RoPELayer(c, i)
	}
	if c.NoRopeLayers == nil || i < 0 || i >= len(c.NoRopeLayers) {
		return true
	}
	return c.NoRopeLayers[i] != 0
}

// The keys of Features, added to the package's field table before any family registers.
var _ = addFields(map[string]field{
	"embedding_multiplier":             {kFloat, false, func(c *Config) any { return &c.EmbeddingMultiplier }},
	"residual_multiplier":              {kFloat, false, func(c *Config) any { return &c.ResidualMultiplier }},
	"attention_multiplier":             {kFloat, false, func(c *Config) any { return &c.AttentionMultiplier }},
	"logits_scaling":                   {kFloat, false, func(c *Config) any { return &c.LogitsScaling }},
	"no_rope_layers":                   {kIntList, true, func(c *Config) any { return &c.NoRopeLayers }},
	"no_rope_layer_interval":           {kInt, false, func(c *Config) any { return &c.NoRopeLayerInterval }},
	"original_max_position_embeddings": {kInt, false, func(c *Config) any { return &c.OriginalMaxPositionEmbeddings }},
	"resid_pdrop":                      {kFloat, false, func(c *Config) any { return &c.ResidPdrop }},
	"embd_pdrop":                       {kFloat, false, func(c *Config) any { return &c.EmbdPdrop }},
	"shared_expert_intermediate_size":  {kInt, false, func(c *Config) any { return &c.SharedExpertIntermediateSize }},
	"qkv_bias":                         {kBool, false, func(c *Config) any { return &c.QKVBiasKey }},
	"n_shared_experts":                 {kInt, false, func(c *Config) any { return &c.NSharedExperts }},
	"n_routed_experts":                 {kInt, false, func(c *Config) any { return &c.NumExperts }},
	"n_group":                          {kInt, false, func(c *Config) any { return &c.NGroup }},
	"topk_group":                       {kInt, false, func(c *Config) any { return &c.TopKGroup }},
	"routed_scaling_factor":            {kFloat, false, func(c *Config) any { return &c.RoutedScalingFactor }},
	"first_k_dense_replace":            {kInt, false, func(c *Config) any { return &c.FirstKDenseReplace }},
	"num_nextn_predict_layers":         {kInt, false, func(c *Config) any { return &c.NumNextNPredictLayers }},
	"use_qk_norm":                      {kBool, false, func(c *Config) any { return &c.UseQKNorm }},
})

// addFields adds keys to the field table; a key defined twice is a programming error.
func addFields(fs map[string]field) bool {
	for k, f := range fs {
		if _, dup := fields[k]; dup {
			panic("config: field " + k + " is defined twice")
		}
		fields[k] = f
	}
	return true
}

// keepTopLevelPartialRotary writes partial_rotary_factor at the top level as well as in
// rope_parameters, as transformers does for the families whose config classes set it as a
// default attribute (glm4, glm4_moe).
func keepTopLevelPartialRotary(c *Config) {
	v := floatValue(c.Rope.PartialRotaryFactor, false)
	raw, err := encodePy(v)
	if err != nil {
		return
	}
	raw = []byte(strings.TrimSpace(string(raw)))
	for i, kv := range c.extra {
		if kv.Key == "partial_rotary_factor" {
			c.extra[i].Value = raw
			return
		}
	}
	c.extra = append(c.extra, rawKey{Key: "partial_rotary_factor", Value: raw, understood: true})
}

// positiveFloats refuses a zero, negative or non-finite value of any of the keys.
func positiveFloats(kv ...any) error {
	for i := 0; i+1 < len(kv); i += 2 {
		k, v := kv[i].(string), kv[i+1].(float64)
		if !(v > 0) || math.IsInf(v, 0) {
			return fmt.Errorf("%s (%g) must be a positive number", k, v)
		}
	}
	return nil
}

// probability refuses a value outside [0, 1].
func probability(key string, v float64) error {
	if !(v >= 0 && v <= 1) {
		return fmt.Errorf("%s (%g) must be a probability in [0, 1]", key, v)
	}
	return nil
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }
