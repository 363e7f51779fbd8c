package train

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/models"
)

// PEFTConfig are the LoRA keys of a run, named as TRL's ModelConfig names them. With use_peft
// the base model is frozen (no gradients, no optimizer state) and only adapters on the
// lora_target_modules train; checkpoints and the final output_dir hold the adapter in PEFT's
// format (adapter_config.json + adapter_model.safetensors) instead of the model.
type PEFTConfig struct {
	// UsePEFT trains LoRA adapters instead of the whole model. Default false.
	UsePEFT bool `yaml:"use_peft" json:"use_peft,omitempty"`
	// LoRAR is the adapter rank r. Default 16.
	LoRAR int `yaml:"lora_r" json:"lora_r,omitempty"`
	// LoRAAlpha scales the adapter output by lora_alpha/r (lora_alpha/sqrt(r) with
	// use_rslora). Default 32.
	LoRAAlpha float64 `yaml:"lora_alpha" json:"lora_alpha,omitempty"`
	// LoRADropout is the dropout probability on the adapter input during training, in [0, 1).
	// Default 0.05.
	LoRADropout *float64 `yaml:"lora_dropout" json:"lora_dropout,omitempty"`
	// LoRATargetModules are PEFT's target_modules: module names (q_proj, k_proj, v_proj,
	// o_proj, gate_proj, up_proj, down_proj) or "all-linear" (every linear layer but the LM
	// head). Default [q_proj, v_proj], PEFT's default for these families.
	LoRATargetModules StringList `yaml:"lora_target_modules" json:"lora_target_modules,omitempty"`
	// UseRSLoRA scales by lora_alpha/sqrt(r) (rank-stabilised LoRA). Default false.
	UseRSLoRA bool `yaml:"use_rslora" json:"use_rslora,omitempty"`
}

// peftDefaults fills the LoRA defaults of a run with use_peft.
func (c *Config) peftDefaults() {
	p := &c.PEFT
	if !p.UsePEFT {
		return
	}
	if p.LoRAR == 0 {
		p.LoRAR = 16
	}
	if p.LoRAAlpha == 0 {
		p.LoRAAlpha = 32
	}
	if p.LoRADropout == nil {
		d := 0.05
		p.LoRADropout = &d
	}
	if len(p.LoRATargetModules) == 0 {
		p.LoRATargetModules = StringList{"q_proj", "v_proj"}
	}
}

// loraConfig is the adapter configuration of a run with use_peft.
func (c *Config) loraConfig() models.LoRAConfig {
	p := c.PEFT
	lc := models.LoRAConfig{R: p.LoRAR, Alpha: p.LoRAAlpha, Targets: []string(p.LoRATargetModules), RSLoRA: p.UseRSLoRA}
	if p.LoRADropout != nil {
		lc.Dropout = *p.LoRADropout
	}
	if c.Run.Seed != nil {
		lc.Seed = uint64(*c.Run.Seed)
	}
	return lc
}

// validatePEFT refuses LoRA keys without use_peft, values out of range, and layouts over more
// than one device (rule mesh.RuleAdapters).
func (c *Config) validatePEFT(bad func(key, format string, args ...any)) {
	p := c.PEFT
	if !p.UsePEFT {
		for key, set := range map[string]bool{"lora_r": p.LoRAR != 0, "lora_alpha": p.LoRAAlpha != 0, "lora_dropout": p.LoRADropout != nil,
			"lora_target_modules": len(p.LoRATargetModules) > 0, "use_rslora": p.UseRSLoRA} {
			if set {
				bad(key, "is set but use_peft is false: set use_peft: true to train LoRA adapters, or remove %s", key)
			}
		}
		return
	}
	if p.LoRAR < 1 || p.LoRAR > 1<<14 {
		bad("lora_r", "%d must be in [1, 16384]", p.LoRAR)
	}
	if !(p.LoRAAlpha > 0) || math.IsInf(p.LoRAAlpha, 0) {
		bad("lora_alpha", "%v must be a finite number > 0", p.LoRAAlpha)
	}
	if d := p.LoRADropout; d != nil && !(*d >= 0 && *d < 1) {
		bad("lora_dropout", "%v must be in [0, 1)", *d)
	}
	for _, t := range p.LoRATargetModules {
		if t == models.AllLinear && len(p.LoRATargetModules) > 1 {
			bad("lora_target_modules", "%q stands alone: remove the other names", models.AllLinear)
			break
		}
	}
	if err := c.loraConfig().Validate(); err != nil && p.LoRAR > 0 && p.LoRAAlpha > 0 {
		bad("lora_target_modules", "%v", err)
	}
	if d, l, err := c.Parallel.Resolve(); err == nil {
		if err := mesh.CheckAdapters(l, d.Len()); err != nil {
			bad("use_peft", "%v", err)
		}
	}
}

// attachPEFT puts the run's adapters on m (use_peft), freezing its base, after storing the
// base in 4 bits with load_in_4bit.
func attachPEFT(cfg *Config, m *models.Model) error {
	if !cfg.PEFT.UsePEFT {
		if ok, _, _ := m.Quantized(); ok {
			return errors.New("train: the checkpoint is stored in 4 bits (bitsandbytes) and its base cannot be trained: set use_peft: true to train LoRA adapters over it")
		}
		return nil
	}
	if err := quantizeBase(cfg, m); err != nil {
		return err
	}
	if err := m.AttachLoRA(cfg.loraConfig()); err != nil {
		return fmt.Errorf("train: use_peft: %w", err)
	}
	return nil
}

// adapterBase is what a run's adapter names as base_model_name_or_path: the checkpoint it
// was trained over (absolute), or the init architecture.
func adapterBase(cfg *Config) string {
	if p := cfg.Model.ModelNameOrPath; p != "" {
		if abs, err := filepath.Abs(p); err == nil {
			return abs
		}
		return p
	}
	if in := cfg.Model.Init; in != nil {
		return in.Arch
	}
	return ""
}

func init() {
	// An explicit 0 would be replaced by the default, as with the other such keys.
	zeroIsUnset["lora_r"] = "16"
	zeroIsUnset["lora_alpha"] = "32"
}

// paramsLabel names the parameters row of the memory estimate: the model's count, and the
// adapters' (the only trained parameters) under use_peft.
func (m MemoryEstimate) paramsLabel() string {
	if m.Quantized > 0 {
		return fmt.Sprintf("parameters (%.2fM, %.2fM in NF4, + %.2fM LoRA)", float64(m.Params)/1e6, float64(m.Quantized)/1e6, float64(m.Adapters)/1e6)
	}
	if m.Adapters > 0 {
		return fmt.Sprintf("parameters (%.2fM + %.2fM LoRA)", float64(m.Params)/1e6, float64(m.Adapters)/1e6)
	}
	return fmt.Sprintf("parameters (%.2fM)", float64(m.Params)/1e6)
}

// PEFTEstimateLine is the line a dry run of a parallel layout adds under use_peft, whose mesh
// estimate counts every parameter as trained: what the run needs with the base frozen
// (gradients and optimizer state for the adapters only). "" without use_peft.
func PEFTEstimateLine(cfg *Config, mc *config.Config) (string, error) {
	if !cfg.PEFT.UsePEFT {
		return "", nil
	}
	need, err := RunMemoryNeed(cfg, mc)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("use_peft: with the base frozen (gradients and optimizer state for the LoRA adapters only) the run needs %s, %s", humanBytes(need.Bytes), need.Detail), nil
}
