package train

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/quant"
)

// QuantConfig are the 4-bit base keys of a run (QLoRA), named as transformers'
// BitsAndBytesConfig and TRL's ModelConfig name them. With load_in_4bit the base model's linear
// layers (every one but the LM head) are quantised to NF4 right after loading, and the run
// trains LoRA adapters over them (use_peft is required).
type QuantConfig struct {
	// LoadIn4bit stores the base's linear weights in NF4. Default false.
	LoadIn4bit bool `yaml:"load_in_4bit" json:"load_in_4bit,omitempty"`
	// QuantType is the 4-bit data type: nf4 (default; fp4 is refused).
	QuantType string `yaml:"bnb_4bit_quant_type" json:"bnb_4bit_quant_type,omitempty"`
	// DoubleQuant stores the block scales in 8 bits (about 0.4 bits per parameter less).
	// use_bnb_nested_quant is TRL's name for the same key. Default false.
	DoubleQuant bool `yaml:"bnb_4bit_use_double_quant" json:"bnb_4bit_use_double_quant,omitempty"`
	NestedQuant bool `yaml:"use_bnb_nested_quant" json:"use_bnb_nested_quant,omitempty"`
	// ComputeDType is the dtype the weights are dequantised to for the products: bfloat16
	// (default, the only one supported).
	ComputeDType string `yaml:"bnb_4bit_compute_dtype" json:"bnb_4bit_compute_dtype,omitempty"`
}

// quantConfig is the run's 4-bit request.
func (c *Config) quantConfig() quant.Config {
	q := c.Quant
	return quant.Config{LoadIn4bit: q.LoadIn4bit, QuantType: q.QuantType, DoubleQuant: q.DoubleQuant || q.NestedQuant, ComputeDType: q.ComputeDType}
}

// validateQuant refuses 4-bit keys without load_in_4bit, unsupported types, and a 4-bit base
// without adapters to train.
func (c *Config) validateQuant(bad func(key, format string, args ...any)) {
	qc := c.quantConfig()
	if err := qc.Validate(); err != nil {
		key := "load_in_4bit"
		switch {
		case c.Quant.QuantType != "" && c.Quant.LoadIn4bit && qc.QuantType != "nf4":
			key = "bnb_4bit_quant_type"
		case c.Quant.ComputeDType != "" && c.Quant.LoadIn4bit:
			key = "bnb_4bit_compute_dtype"
		}
		bad(key, "%v", err)
		return
	}
	if c.Quant.LoadIn4bit && !c.PEFT.UsePEFT {
		bad("load_in_4bit", "a 4-bit base is frozen: set use_peft: true to train LoRA adapters over it")
	}
}

// quantizeBase stores the base's linears in NF4 (load_in_4bit), before the adapters attach.
func quantizeBase(cfg *Config, m *models.Model) error {
	if ok, _, _ := m.Quantized(); ok || !cfg.Quant.LoadIn4bit {
		return nil // a bitsandbytes 4-bit checkpoint arrives quantised
	}
	if err := m.QuantizeBase(cfg.quantConfig()); err != nil {
		return fmt.Errorf("train: load_in_4bit: %w", err)
	}
	return nil
}
