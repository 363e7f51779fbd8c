package train

import (
	"errors"
	"fmt"
	"sort"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// InitModelConfig resolves init: {arch, preset, overrides} into a config.json: the preset (or
// the family's defaults), vocab_size set to the tokenizer's size unless overridden, then the
// overrides as config.json keys, checked by the config.json parser. A key the family's model
// does not read is refused (a misspelt num_hidden_layers would train the preset's depth and be
// written into config.json), and so is a vocab_size below the tokenizer's.
func InitModelConfig(in *InitConfig, tokenizerVocab int) (*config.Config, error) {
	var base *config.Config
	var err error
	if in.Preset != "" {
		base, err = config.Preset(in.Arch, in.Preset)
	} else {
		base, err = config.New(in.Arch)
	}
	if err != nil {
		return nil, fmt.Errorf("train: init: %w", err)
	}
	if f := base.Family(); f != nil {
		keys := make([]string, 0, len(in.Overrides))
		for k := range in.Overrides {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if f.Understands(k) {
				continue
			}
			msg := fmt.Sprintf("train: init.overrides: unknown key %q: the %s model reads no such config.json key", shortKey(k), f.ModelType)
			if s := closest(k, f.KnownKeys()); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			}
			return nil, errors.New(msg)
		}
	}
	// Override re-validates, applies rope_theta inside rope_parameters and derives
	// layer_types again for a new depth, exactly as the config package reads config.json.
	set := make(map[string]any, len(in.Overrides)+1)
	for k, v := range in.Overrides {
		set[k] = v
	}
	_, vocabGiven := set["vocab_size"]
	if tokenizerVocab > 0 && !vocabGiven {
		set["vocab_size"] = tokenizerVocab
	}
	c, err := base.Override(set, "init.overrides")
	if err != nil {
		return nil, fmt.Errorf("train: init.overrides: %w", err)
	}
	if vocabGiven && tokenizerVocab > 0 && c.VocabSize < tokenizerVocab {
		return nil, fmt.Errorf("train: init.overrides: vocab_size %d is smaller than the tokenizer's %d tokens: give at least %d (a larger one pads the embedding), or remove it to use the tokenizer's", c.VocabSize, tokenizerVocab, tokenizerVocab)
	}
	if len(c.Architectures) == 0 {
		if f, err := models.Lookup(in.Arch); err == nil {
			c.Architectures = []string{f.Architectures[0]}
		}
	}
	return c, nil
}

// buildModel loads model_name_or_path, or builds and randomly initialises init with seed;
// with use_peft it attaches the run's LoRA adapters, freezing the base.
func buildModel(cfg *Config, b backend.Backend, dt tensor.DType, tokenizerVocab int) (*models.Model, error) {
	opts := models.Options{DType: dt, Recompute: cfg.Run.GradientCheckpointing}
	if cfg.PEFT.UsePEFT && cfg.Quant.LoadIn4bit {
		// Quantise while reading: the full-precision base never reaches the device whole.
		qc := cfg.quantConfig()
		opts.QuantizeOnLoad = &qc
	}
	if cfg.Method == MethodReward {
		opts.NumLabels = 1 // a reward model: the score head replaces the LM head
	}
	if cfg.Model.Init == nil {
		m, err := models.Load(cfg.Model.ModelNameOrPath, b, opts)
		if err != nil {
			return nil, fmt.Errorf("train: model_name_or_path: %w", err)
		}
		if err := attachPEFT(cfg, m); err != nil {
			m.Close()
			return nil, err
		}
		return m, nil
	}
	c, err := InitModelConfig(cfg.Model.Init, tokenizerVocab)
	if err != nil {
		return nil, err
	}
	m, err := models.New(c, b, opts)
	if err != nil {
		return nil, fmt.Errorf("train: init: %w", err)
	}
	if err := m.InitRandom(uint64(*cfg.Run.Seed)); err != nil {
		m.Close()
		return nil, fmt.Errorf("train: init: %w", err)
	}
	if err := attachPEFT(cfg, m); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// saveModel writes the Hugging Face model files into dir (weights in the model's dtype), or,
// when m carries LoRA adapters, the adapter in PEFT's format naming base as its base model.
func saveModel(m *models.Model, dir, base string) error {
	if m.LoRA() != nil {
		return m.SaveAdapter(dir, base)
	}
	return m.Save(dir, models.SaveOptions{})
}

// loadModelWeights replaces the model's parameters with a checkpoint's (the adapters' with
// a checkpoint of a run with use_peft).
func loadModelWeights(m *models.Model, dir string) error {
	if m.LoRA() != nil {
		return m.LoadAdapterWeights(dir)
	}
	ck, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		return err
	}
	defer ck.Close()
	if _, err := m.LoadWeights(ck); err != nil {
		return err
	}
	return nil
}
