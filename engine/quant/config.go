package quant

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Config is a 4-bit loading request, with the names of transformers' BitsAndBytesConfig (the
// quantization_config of a saved 4-bit model's config.json, and the keys of a training run).
type Config struct {
	// LoadIn4bit quantises every linear weight but the LM head to NF4 at load.
	LoadIn4bit bool `json:"load_in_4bit"`
	// QuantType is the 4-bit data type: "nf4" (the only one supported; "fp4" is refused).
	QuantType string `json:"bnb_4bit_quant_type"`
	// DoubleQuant stores the block scales in 8 bits (bnb_4bit_use_double_quant; TRL calls it
	// use_bnb_nested_quant).
	DoubleQuant bool `json:"bnb_4bit_use_double_quant"`
	// ComputeDType is the dtype the weight is dequantised to for the products: bfloat16 (the
	// only one the device op writes); float32 and float16 are refused.
	ComputeDType string `json:"bnb_4bit_compute_dtype"`
	// SkipModules names modules kept unquantised besides the LM head (llm_int8_skip_modules).
	SkipModules []string `json:"llm_int8_skip_modules"`
}

// Validate checks a request and fills the defaults (nf4, bfloat16).
func (c *Config) Validate() error {
	if !c.LoadIn4bit {
		if c.QuantType != "" || c.DoubleQuant || c.ComputeDType != "" {
			return fmt.Errorf("quant: bnb_4bit_* keys are set but load_in_4bit is not: set load_in_4bit: true to load the base in 4 bits")
		}
		return nil
	}
	if c.QuantType == "" {
		c.QuantType = "nf4"
	}
	switch c.QuantType {
	case "nf4":
	case "fp4":
		return fmt.Errorf("quant: bnb_4bit_quant_type fp4 is not supported: use nf4 (QLoRA's data type)")
	default:
		return fmt.Errorf("quant: bnb_4bit_quant_type %q is not a 4-bit type: use nf4", c.QuantType)
	}
	switch c.ComputeDType {
	case "", "bfloat16", "bf16", "torch.bfloat16":
		c.ComputeDType = "bfloat16"
	default:
		return fmt.Errorf("quant: bnb_4bit_compute_dtype %q is not supported: the NF4 weight is dequantised to bfloat16 (use bfloat16)", c.ComputeDType)
	}
	return nil
}

// Quantizes reports whether the linear weight of module (its HF prefix, e.g.
// "model.layers.0.mlp.up_proj") is stored in 4 bits: every linear but the LM head and the
// modules named in SkipModules (a name matches the module or any module it is part of), as
// transformers' replace_with_bnb_linear decides. Embeddings and norms are not linears.
func (c *Config) Quantizes(module string) bool {
	if !c.LoadIn4bit {
		return false
	}
	parts := strings.Split(module, ".")
	if parts[len(parts)-1] == "lm_head" {
		return false
	}
	for _, s := range c.SkipModules {
		if s == module || slices.Contains(parts, s) || strings.HasPrefix(module, s+".") {
			return false
		}
	}
	return true
}

// FromHFConfig reads the quantization_config object of a model's config.json: nil for a model
// that has none, an error for a quantisation method other than bitsandbytes 4-bit NF4.
func FromHFConfig(raw json.RawMessage) (*Config, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var probe struct {
		Method     string `json:"quant_method"`
		LoadIn8bit bool   `json:"load_in_8bit"`
	}
	if err := json.Unmarshal(raw, &probe); err != nil {
		return nil, fmt.Errorf("quant: config.json quantization_config: %w", err)
	}
	if probe.Method != "" && probe.Method != "bitsandbytes" {
		return nil, fmt.Errorf("quant: config.json quantization_config has quant_method %q; only bitsandbytes 4-bit (nf4) checkpoints load", probe.Method)
	}
	if probe.LoadIn8bit {
		return nil, fmt.Errorf("quant: config.json asks for load_in_8bit; only bitsandbytes 4-bit (nf4) checkpoints load")
	}
	var c Config
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("quant: config.json quantization_config: %w", err)
	}
	if !c.LoadIn4bit {
		return nil, fmt.Errorf("quant: config.json quantization_config sets neither load_in_4bit nor a supported method")
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%w (config.json quantization_config)", err)
	}
	return &c, nil
}
