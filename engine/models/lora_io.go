package models

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Files of an adapter directory, as PEFT's save_pretrained writes them.
const (
	AdapterConfigFile  = "adapter_config.json"
	AdapterWeightsFile = "adapter_model.safetensors"
	// peftKeyPrefix is what PEFT's PeftModelForCausalLM puts before a module name in the keys
	// of adapter_model.safetensors (its base_model.model is the transformers model).
	peftKeyPrefix = "base_model.model."
)

// PEFTConfig is adapter_config.json as PEFT's LoraConfig writes it (field names of PEFT
// 0.21). Fields this engine does not implement are written with PEFT's defaults, and refused
// when an adapter being loaded sets them otherwise.
type PEFTConfig struct {
	PeftType             string         `json:"peft_type"`
	TaskType             string         `json:"task_type"`
	BaseModelNameOrPath  string         `json:"base_model_name_or_path"`
	Revision             *string        `json:"revision"`
	InferenceMode        bool           `json:"inference_mode"`
	R                    int            `json:"r"`
	LoraAlpha            float64        `json:"lora_alpha"`
	LoraDropout          float64        `json:"lora_dropout"`
	TargetModules        any            `json:"target_modules"` // a list of names, or a regex string
	ExcludeModules       any            `json:"exclude_modules"`
	UseRSLoRA            bool           `json:"use_rslora"`
	UseDoRA              bool           `json:"use_dora"`
	Bias                 string         `json:"bias"`
	LoraBias             bool           `json:"lora_bias"`
	FanInFanOut          bool           `json:"fan_in_fan_out"`
	InitLoraWeights      any            `json:"init_lora_weights"`
	ModulesToSave        []string       `json:"modules_to_save"`
	LayersToTransform    any            `json:"layers_to_transform"`
	LayersPattern        any            `json:"layers_pattern"`
	RankPattern          map[string]any `json:"rank_pattern"`
	AlphaPattern         map[string]any `json:"alpha_pattern"`
	MegatronConfig       any            `json:"megatron_config"`
	MegatronCore         string         `json:"megatron_core"`
	LoftQConfig          map[string]any `json:"loftq_config"`
	LayerReplication     any            `json:"layer_replication"`
	TargetParameters     any            `json:"target_parameters"`
	TrainableTokenIdx    any            `json:"trainable_token_indices"`
	AutoMapping          any            `json:"auto_mapping"`
	EvaConfig            any            `json:"eva_config"`
	CordaConfig          any            `json:"corda_config"`
	UseQALoRA            bool           `json:"use_qalora"`
	QALoRAGroupSize      int            `json:"qalora_group_size"`
	EnsureWeightTying    bool           `json:"ensure_weight_tying"`
	RuntimeConfig        map[string]any `json:"runtime_config,omitempty"`
	PeftVersionOfAdapter string         `json:"peft_version,omitempty"`
}

// peftConfig is the adapter_config.json of the attached adapters.
func (m *Model) peftConfig(base string) PEFTConfig {
	c := m.lora.Config
	targets := c.Targets
	if len(targets) == 1 && targets[0] == AllLinear || c.TargetPattern != "" {
		// PEFT stores the names "all-linear" resolved to; a pattern as it was given.
		set := map[string]bool{}
		for _, mod := range m.lora.Modules {
			set[mod.Name[strings.LastIndexByte(mod.Name, '.')+1:]] = true
		}
		targets = targets[:0:0]
		for n := range set {
			targets = append(targets, n)
		}
	}
	sort.Strings(targets)
	var tm any = targets
	if c.TargetPattern != "" {
		tm = c.TargetPattern
	}
	return PEFTConfig{
		PeftType: "LORA", TaskType: "CAUSAL_LM", BaseModelNameOrPath: base, InferenceMode: true,
		R: c.R, LoraAlpha: c.Alpha, LoraDropout: c.Dropout, TargetModules: tm, UseRSLoRA: c.RSLoRA,
		Bias: "none", InitLoraWeights: true, RankPattern: map[string]any{}, AlphaPattern: map[string]any{},
		MegatronCore: "megatron.core", LoftQConfig: map[string]any{}, QALoRAGroupSize: 16,
	}
}

// SaveAdapter writes the attached adapters as PEFT's save_pretrained does: adapter_config.json
// and adapter_model.safetensors with keys base_model.model.<module>.lora_A.weight [r,in] and
// .lora_B.weight [out,r], stored in F32 (PEFT keeps adapters in fp32 over a bf16 base). base
// is written as base_model_name_or_path. Each file goes to a temporary name and is renamed.
func (m *Model) SaveAdapter(dir, base string) error {
	if m.lora == nil {
		return errors.New("models: SaveAdapter: no adapters attached")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("models: SaveAdapter: %w", err)
	}
	ts, err := m.AdapterTensors(tensor.F32)
	if err != nil {
		return err
	}
	for i := range ts {
		ts[i].Name = peftKeyPrefix + ts[i].Name
	}
	if err := safetensors.Save(filepath.Join(dir, AdapterWeightsFile), ts, map[string]string{"format": "pt"}); err != nil {
		return fmt.Errorf("models: SaveAdapter %s: %w", dir, err)
	}
	raw, err := json.MarshalIndent(m.peftConfig(base), "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, AdapterConfigFile+".tmp")
	if err := os.WriteFile(tmp, append(raw, '\n'), 0o644); err != nil {
		return fmt.Errorf("models: SaveAdapter: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, AdapterConfigFile)); err != nil {
		return fmt.Errorf("models: SaveAdapter: %w", err)
	}
	return nil
}

// AdapterTensors returns the adapter parameters as safetensors tensors (names without PEFT's
// prefix, in spec order), converted to dt, downloaded when a writer asks for them.
func (m *Model) AdapterTensors(dt tensor.DType) ([]safetensors.Tensor, error) {
	if m.lora == nil {
		return nil, errors.New("models: no adapters attached")
	}
	return arenaTensors(m, m.lora.Specs, m.lora.Params, dt)
}

// ReadAdapterConfig reads dir/adapter_config.json and returns the LoRA hyperparameters,
// refusing what this engine does not implement with the field that asks for it.
func ReadAdapterConfig(dir string) (LoRAConfig, PEFTConfig, error) {
	path := filepath.Join(dir, AdapterConfigFile)
	raw, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return LoRAConfig{}, PEFTConfig{}, fmt.Errorf("models: %s has no %s: an adapter directory is what PEFT's save_pretrained (or a LoRA run's output_dir) writes", dir, AdapterConfigFile)
		}
		return LoRAConfig{}, PEFTConfig{}, fmt.Errorf("models: %w", err)
	}
	var pc PEFTConfig
	pc.Bias = "none"
	if err := json.Unmarshal(raw, &pc); err != nil {
		return LoRAConfig{}, PEFTConfig{}, fmt.Errorf("models: %s: %w", path, err)
	}
	refuse := func(field, why string) error {
		return fmt.Errorf("models: %s: %s is not supported (%s)", path, field, why)
	}
	switch {
	case pc.PeftType != "LORA":
		return LoRAConfig{}, pc, refuse(fmt.Sprintf("peft_type %q", pc.PeftType), "only LORA adapters load")
	case pc.TaskType != "" && pc.TaskType != "CAUSAL_LM":
		return LoRAConfig{}, pc, refuse(fmt.Sprintf("task_type %q", pc.TaskType), "the models here are causal LMs")
	case pc.UseDoRA:
		return LoRAConfig{}, pc, refuse("use_dora", "DoRA's magnitude vectors are not implemented")
	case pc.Bias != "none" || pc.LoraBias:
		return LoRAConfig{}, pc, refuse(fmt.Sprintf("bias %q / lora_bias", pc.Bias), `only bias "none" without lora_bias`)
	case pc.FanInFanOut:
		return LoRAConfig{}, pc, refuse("fan_in_fan_out", "the targets are nn.Linear layers")
	case len(pc.ModulesToSave) > 0:
		return LoRAConfig{}, pc, refuse("modules_to_save", "fully trained copies of modules are not loaded")
	case len(pc.RankPattern) > 0 || len(pc.AlphaPattern) > 0:
		return LoRAConfig{}, pc, refuse("rank_pattern / alpha_pattern", "every module has the same r and lora_alpha")
	case pc.LayersToTransform != nil || pc.LayerReplication != nil || pc.TargetParameters != nil || pc.TrainableTokenIdx != nil || pc.ExcludeModules != nil:
		return LoRAConfig{}, pc, refuse("layers_to_transform / layer_replication / target_parameters / trainable_token_indices / exclude_modules", "targets are chosen by target_modules alone")
	case pc.UseQALoRA:
		return LoRAConfig{}, pc, refuse("use_qalora", "QA-LoRA pooling is not implemented")
	}
	c := LoRAConfig{R: pc.R, Alpha: pc.LoraAlpha, Dropout: pc.LoraDropout, RSLoRA: pc.UseRSLoRA}
	switch t := pc.TargetModules.(type) {
	case string:
		if t == AllLinear {
			c.Targets = []string{AllLinear}
		} else {
			c.TargetPattern = t
		}
	case []any:
		for _, x := range t {
			s, ok := x.(string)
			if !ok {
				return LoRAConfig{}, pc, fmt.Errorf("models: %s: target_modules holds %v, not a module name", path, x)
			}
			c.Targets = append(c.Targets, s)
		}
	default:
		return LoRAConfig{}, pc, fmt.Errorf("models: %s: target_modules must be a list of module names or a regular expression, got %v", path, pc.TargetModules)
	}
	if err := c.Validate(); err != nil {
		return LoRAConfig{}, pc, fmt.Errorf("%w (%s)", err, path)
	}
	return c, pc, nil
}

// LoadAdapter attaches the adapter saved in dir (PEFT's format: adapter_config.json +
// adapter_model.safetensors) over this model's weights. Every adapted module must be in the
// file with PEFT's shapes, and every tensor of the file must belong to an adapted module.
func (m *Model) LoadAdapter(dir string) error {
	c, _, err := ReadAdapterConfig(dir)
	if err != nil {
		return err
	}
	path := filepath.Join(dir, AdapterWeightsFile)
	if _, err := os.Stat(path); err != nil {
		if _, e := os.Stat(filepath.Join(dir, "adapter_model.bin")); e == nil {
			return fmt.Errorf("models: %s holds adapter_model.bin (a pickle): save the adapter with safetensors (PEFT's default, safe_serialization=True)", dir)
		}
		return fmt.Errorf("models: adapter %s: %w", dir, err)
	}
	f, err := safetensors.Open(path)
	if err != nil {
		return fmt.Errorf("models: adapter %s: %w", dir, err)
	}
	defer f.Close()
	if err := m.AttachLoRA(c); err != nil {
		return err
	}
	if err := m.loadAdapterTensors(f, path); err != nil {
		m.DetachLoRA()
		return err
	}
	return nil
}

func (m *Model) loadAdapterTensors(src safetensors.Source, path string) error {
	ad := m.lora
	want := make(map[string]bool, len(ad.Specs))
	for i, s := range ad.Specs {
		key := peftKeyPrefix + s.Name
		want[key] = true
		info, ok := src.Tensor(key)
		if !ok {
			return fmt.Errorf("models: adapter %s has no tensor %q (adapter_config.json's target_modules select %s)", path, key, ad.Modules[i/2].Name)
		}
		if !slices.Equal(info.Shape, s.Shape) {
			return fmt.Errorf("models: adapter tensor %q in %s has shape %v, the model and r=%d imply %v", key, path, info.Shape, ad.Config.R, s.Shape)
		}
		if err := m.uploadTensor(ad.Params.Views[i], info); err != nil {
			return fmt.Errorf("models: adapter tensor %q in %s: %w", key, path, err)
		}
	}
	for _, n := range src.Names() {
		if !want[n] {
			return fmt.Errorf("models: adapter %s holds %q, which is no adapter of the modules target_modules selects on this %s model", path, n, m.Arch.ModelType)
		}
	}
	return nil
}

// targetPattern compiles PEFT's regex form of target_modules (a full match of the module
// name, as Python's re.fullmatch).
func targetPattern(p string) (*regexp.Regexp, error) {
	re, err := regexp.Compile(`^(?:` + p + `)$`)
	if err != nil {
		return nil, fmt.Errorf("models: lora target_modules pattern %q: %w", p, err)
	}
	return re, nil
}
