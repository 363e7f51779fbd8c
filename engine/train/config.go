package train

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"

	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/internal/suggest"
	"github.com/halo-shell/halo-shell/internal/yamlsafe"
)

// Config is a whole training run, read from strict YAML. Key names follow Hugging Face
// TrainingArguments where one exists. Zero values are replaced by the defaults named in each
// field's comment (see Defaults).
type Config struct {
	// Method is the training method: "pretrain" (every token is a target), "sft" (only
	// assistant / completion tokens are targets) or another registered method (Methods).
	// Set by `launch METHOD`.
	Method string `yaml:"method" json:"method"`
	// Objective are the method's own keys (beta, loss_type, ...), TRL's names; a key that
	// the method does not read is refused. See ObjectiveConfig.
	Objective ObjectiveConfig `yaml:",inline" json:"objective"`

	Model   ModelConfig    `yaml:",inline" json:"model"`
	Dataset DatasetConfig  `yaml:"dataset" json:"dataset"`
	Batch   BatchConfig    `yaml:",inline" json:"batch"`
	Optim   OptimConfig    `yaml:",inline" json:"optim"`
	Sched   ScheduleConfig `yaml:",inline" json:"schedule"`
	Run     RunConfig      `yaml:",inline" json:"run"`
	// Parallel is the device list and parallel layout: devices (cpu, cpu:4, cuda:0-7),
	// tensor_parallel_size, context_parallel_size, expert_parallel_size,
	// expert_tensor_parallel_size and fsdp; the data-parallel size follows from the devices.
	// Empty means one device (run.device).
	Parallel mesh.Config `yaml:",inline" json:"parallel"`
	// GenerationEval measures exact-match accuracy of greedy generation on held-out chats at
	// the end of a run (sft with a messages dataset only).
	GenerationEval GenerationEvalConfig `yaml:"generation_eval" json:"generation_eval"`
	// PEFT are the LoRA keys (use_peft, lora_r, lora_alpha, lora_dropout,
	// lora_target_modules, use_rslora); see PEFTConfig.
	PEFT PEFTConfig `yaml:",inline" json:"peft"`
	// Quant are the 4-bit base keys (load_in_4bit, bnb_4bit_quant_type,
	// bnb_4bit_use_double_quant or use_bnb_nested_quant, bnb_4bit_compute_dtype); see
	// QuantConfig.
	Quant QuantConfig `yaml:",inline" json:"quant"`
}

// ModelConfig says where the model and tokenizer come from.
type ModelConfig struct {
	// ModelNameOrPath is a Hugging Face checkpoint directory (config.json, *.safetensors,
	// tokenizer files). Exactly one of model_name_or_path and init is set.
	ModelNameOrPath string `yaml:"model_name_or_path,omitempty" json:"model_name_or_path,omitempty"`
	// Init trains from scratch: a random model of a registered architecture.
	Init *InitConfig `yaml:"init,omitempty" json:"init,omitempty"`
	// TokenizerNameOrPath is a directory with tokenizer.json (and tokenizer_config.json for
	// chat templates). Default: model_name_or_path. Required with init.
	TokenizerNameOrPath string `yaml:"tokenizer_name_or_path,omitempty" json:"tokenizer_name_or_path,omitempty"`
}

// InitConfig describes a randomly initialised model.
type InitConfig struct {
	// Arch is the Hugging Face model_type, e.g. "qwen3".
	Arch string `yaml:"arch" json:"arch"`
	// Preset names a size preset of the architecture (e.g. "tiny"); empty for the family's
	// default shape.
	Preset string `yaml:"preset,omitempty" json:"preset,omitempty"`
	// Overrides are config.json fields that replace the preset's (hidden_size, num_hidden_layers,
	// ...). vocab_size defaults to the tokenizer's.
	Overrides map[string]any `yaml:"overrides,omitempty" json:"overrides,omitempty"`
}

// DatasetConfig names the data.
type DatasetConfig struct {
	// Path is one JSONL file or a list of them. Exactly one of path and synthetic is set.
	Path StringList `yaml:"path,omitempty" json:"path,omitempty"`
	// Synthetic generates the data in memory instead of reading files.
	Synthetic *SyntheticConfig `yaml:"synthetic,omitempty" json:"synthetic,omitempty"`
	// Format is auto (default), text, messages, prompt_completion or tokens (pre-tokenized
	// {"input_ids": [...]} records, every token a target; the tokenizer is then optional).
	Format string `yaml:"format" json:"format"`
	// Shuffle reorders the documents and micro-batches every epoch (from seed). With false
	// the data is read in file order: without packing, micro-batch i holds documents
	// i*per_device_train_batch_size onwards. Default true.
	Shuffle *bool `yaml:"shuffle" json:"shuffle"`
	// EvalSplit is the fraction of records held out for evaluation, in [0, 1). Default 0.
	EvalSplit float64 `yaml:"eval_split" json:"eval_split,omitempty"`
	// EvalPath is a separate held-out JSONL file (or list); excludes eval_split.
	EvalPath StringList `yaml:"eval_path,omitempty" json:"eval_path,omitempty"`
}

// SyntheticConfig describes a generated dataset: chats "What is 37+48?" -> "85" with a
// disjoint held-out set (see data.Arithmetic). The held-out set serves as eval data.
type SyntheticConfig struct {
	// Kind is the generator; only "arithmetic".
	Kind string `yaml:"kind" json:"kind"`
	// Seed chooses the problems. Default 1.
	Seed int64 `yaml:"seed" json:"seed"`
	// MaxOperand is the largest operand. Default 99.
	MaxOperand int `yaml:"max_operand" json:"max_operand"`
	// Train and Eval are the numbers of training and held-out chats. Defaults 8000 and 200.
	Train int `yaml:"train" json:"train"`
	Eval  int `yaml:"eval" json:"eval"`
}

// BatchConfig sets the shape of micro-batches and optimizer steps.
type BatchConfig struct {
	// MaxLength is the longest sequence in tokens; longer documents are truncated. Default 1024.
	MaxLength int `yaml:"max_length" json:"max_length"`
	// Packing packs several documents per sequence (best-fit decreasing). Default true.
	Packing *bool `yaml:"packing" json:"packing"`
	// PerDeviceTrainBatchSize is the micro-batch in sequences; with packing the micro-batch
	// token budget is per_device_train_batch_size*max_length. Default 8.
	PerDeviceTrainBatchSize int `yaml:"per_device_train_batch_size" json:"per_device_train_batch_size"`
	// PerDeviceEvalBatchSize is the eval micro-batch in sequences. Default: the train one.
	PerDeviceEvalBatchSize int `yaml:"per_device_eval_batch_size" json:"per_device_eval_batch_size"`
	// GradientAccumulationSteps is the number of micro-batches per optimizer step. Default 1.
	GradientAccumulationSteps int `yaml:"gradient_accumulation_steps" json:"gradient_accumulation_steps"`
}

// OptimConfig sets the optimizer.
type OptimConfig struct {
	// Optim is adamw_torch (fp32 master weights and moments, default), adamw_bf16 (bf16
	// weights and moments with stochastic rounding) or adamw_bf16_nearest (bf16 weights and
	// moments rounded to nearest, as torch.optim.AdamW does with bf16 parameters).
	Optim string `yaml:"optim" json:"optim"`
	// LearningRate is the peak learning rate. Default 5e-5.
	LearningRate float64 `yaml:"learning_rate" json:"learning_rate"`
	// WeightDecay is the decoupled weight decay on matrices (never on norms and biases). Default 0.
	WeightDecay float64 `yaml:"weight_decay" json:"weight_decay"`
	// AdamBeta1 default 0.9, AdamBeta2 default 0.999, AdamEpsilon default 1e-8.
	AdamBeta1   float64 `yaml:"adam_beta1" json:"adam_beta1"`
	AdamBeta2   float64 `yaml:"adam_beta2" json:"adam_beta2"`
	AdamEpsilon float64 `yaml:"adam_epsilon" json:"adam_epsilon"`
	// MaxGradNorm clips the global gradient norm; 0 disables clipping. Default 1.0.
	MaxGradNorm *float64 `yaml:"max_grad_norm" json:"max_grad_norm"`
	// MoEBalancingRate turns on aux-loss-free load balancing of mixture-of-experts routers
	// (> 0) and is its bias update rate, in units of router probability per optimizer step:
	// after each step every expert's selection bias moves by this much towards an even load
	// (up when the expert got fewer tokens than the mean over experts, down when more). The
	// bias only changes which experts are chosen, not the routing weights. Loads are counted
	// over the whole step (every micro-batch, every data and context rank). 0 (default) is
	// off. Only for MoE models; e.g. 1e-3.
	MoEBalancingRate float64 `yaml:"moe_balancing_rate" json:"moe_balancing_rate,omitempty"`
	// RouterAuxLossCoef, when set, is the weight of the MoE load-balancing (aux) loss in the
	// training objective, overriding the model's own: without it the weight is config.json's
	// (or init.overrides') router_aux_loss_coef when output_router_logits is true, else 0, as
	// transformers trains. Set 0 to train without the aux loss (e.g. with moe_balancing_rate
	// instead); both can be on together. Must be >= 0; only for MoE models.
	RouterAuxLossCoef *float64 `yaml:"router_aux_loss_coef" json:"router_aux_loss_coef,omitempty"`
}

// ScheduleConfig sets the learning-rate schedule and the run length.
type ScheduleConfig struct {
	// LRSchedulerType is linear (default), cosine, constant or constant_with_warmup.
	LRSchedulerType string `yaml:"lr_scheduler_type" json:"lr_scheduler_type"`
	// WarmupSteps is the number of linear warmup steps; overrides warmup_ratio. Default 0.
	WarmupSteps int `yaml:"warmup_steps" json:"warmup_steps"`
	// WarmupRatio is warmup as a fraction of the total steps, in [0, 1). Default 0.
	WarmupRatio float64 `yaml:"warmup_ratio" json:"warmup_ratio"`
	// MaxSteps is the number of optimizer steps; when > 0 it overrides num_train_epochs.
	// Default -1.
	MaxSteps int `yaml:"max_steps" json:"max_steps"`
	// NumTrainEpochs is the number of passes over the training data (may be fractional).
	// Default 3.
	NumTrainEpochs float64 `yaml:"num_train_epochs" json:"num_train_epochs"`
}

// RunConfig sets everything else: output, logging, checkpoints, numerics, device.
type RunConfig struct {
	// Seed fixes initialisation, shuffling and stochastic rounding. Default 42.
	Seed *int64 `yaml:"seed" json:"seed"`
	// OutputDir receives metrics.jsonl, checkpoints and the final model. Required.
	OutputDir string `yaml:"output_dir" json:"output_dir"`
	// SaveSteps writes a checkpoint every this many optimizer steps; 0 saves only at the end.
	// Default 500.
	SaveSteps *int `yaml:"save_steps" json:"save_steps"`
	// SaveTotalLimit keeps at most this many step checkpoints (oldest removed); 0 keeps all.
	SaveTotalLimit int `yaml:"save_total_limit" json:"save_total_limit"`
	// LoggingSteps prints progress every this many steps (metrics.jsonl gets every step).
	// Default 10.
	LoggingSteps int `yaml:"logging_steps" json:"logging_steps"`
	// EvalSteps computes the eval loss every this many steps; 0 only at the end. Default 0.
	EvalSteps int `yaml:"eval_steps" json:"eval_steps"`
	// BF16 keeps weights and activations in bfloat16 (fp32 accumulation). Default false.
	BF16 bool `yaml:"bf16" json:"bf16"`
	// GradientCheckpointing recomputes activations in backward to save memory. Default false.
	GradientCheckpointing bool `yaml:"gradient_checkpointing" json:"gradient_checkpointing"`
	// Device is auto (default: CUDA when available, else CPU), cpu or cuda.
	Device string `yaml:"device" json:"device"`
	// MaxDeviceMemoryGiB caps what each device may allocate, in GiB, so that a run sized for a
	// smaller GPU (a 24 GB card: 22) can be tried on a larger one or on the CPU: an allocation
	// past it fails with the out-of-memory error. 0 (default) means the device's own memory,
	// or HALO_DEVICE_MEMORY_GIB when that is set.
	MaxDeviceMemoryGiB float64 `yaml:"max_device_memory_gib,omitempty" json:"max_device_memory_gib,omitempty"`
	// ResumeFromCheckpoint is a checkpoint directory to resume from.
	ResumeFromCheckpoint string `yaml:"resume_from_checkpoint,omitempty" json:"resume_from_checkpoint,omitempty"`
}

// GenerationEvalConfig measures held-out exact-match accuracy by greedy generation.
type GenerationEvalConfig struct {
	// MaxSamples is the number of held-out chats to generate for; 0 disables. Default 0.
	MaxSamples int `yaml:"max_samples" json:"max_samples"`
	// MaxNewTokens bounds each generated reply. Default 16.
	MaxNewTokens int `yaml:"max_new_tokens" json:"max_new_tokens"`
}

// StringList is a YAML string or list of strings.
type StringList []string

// UnmarshalYAML accepts a single string or a list of strings.
func (s *StringList) UnmarshalYAML(unmarshal func(any) error) error {
	var v any
	if err := unmarshal(&v); err != nil {
		return err
	}
	switch v := v.(type) {
	case string:
		*s = StringList{v}
		return nil
	case []any:
		out := make(StringList, len(v))
		for i, e := range v {
			str, ok := e.(string)
			if !ok {
				return fmt.Errorf("item %d: expected a path (string), got %v", i, e)
			}
			out[i] = str
		}
		*s = out
		return nil
	}
	return errors.New("expected a path or a list of paths")
}

// Method names.
const (
	MethodPretrain = "pretrain"
	MethodSFT      = "sft"
)

// Choices of the enumerated keys.
var (
	optims     = []string{"adamw_torch", "adamw_bf16", "adamw_bf16_nearest"}
	schedulers = []string{"linear", "cosine", "constant", "constant_with_warmup"}
	devices    = []string{"auto", "cpu", "cuda"}
)

// zeroIsUnset are the keys whose zero value Defaults takes for "not set" and replaces, with
// the default it puts in. An explicit 0 for one of them is refused rather than silently
// replaced (per_device_train_batch_size: 0 used to train with batches of 8).
var zeroIsUnset = map[string]string{
	"max_length":                     "1024",
	"per_device_train_batch_size":    "8",
	"per_device_eval_batch_size":     "per_device_train_batch_size",
	"gradient_accumulation_steps":    "1",
	"learning_rate":                  "5e-5",
	"adam_beta1":                     "0.9",
	"adam_beta2":                     "0.999",
	"adam_epsilon":                   "1e-8",
	"max_steps":                      "-1: num_train_epochs decides",
	"num_train_epochs":               "3",
	"logging_steps":                  "10",
	"generation_eval.max_new_tokens": "16",
	"dataset.synthetic.seed":         "1",
	"dataset.synthetic.max_operand":  "99",
	"dataset.synthetic.train":        "8000",
	"dataset.synthetic.eval":         "200",
}

func zeroMsg(key string) string {
	return fmt.Sprintf("0 would be taken for unset and replaced by the default (%s): give a value in range, or remove the key for the default", zeroIsUnset[key])
}

// explicitZeros returns a FieldError for every key of zeroIsUnset that the YAML document src
// sets to 0.
func explicitZeros(src []byte) []*FieldError {
	var doc map[string]any
	if yamlsafe.Unmarshal(src, &doc) != nil {
		return nil
	}
	var errs []*FieldError
	for key := range zeroIsUnset {
		var v any = doc
		for _, part := range strings.Split(key, ".") {
			m, ok := v.(map[string]any)
			if !ok {
				v = nil
				break
			}
			v = m[part]
		}
		if isZeroNumber(v) {
			errs = append(errs, &FieldError{Key: key, Msg: zeroMsg(key)})
		}
	}
	sort.Slice(errs, func(i, j int) bool { return errs[i].Key < errs[j].Key })
	return errs
}

func isZeroNumber(v any) bool {
	switch v := v.(type) {
	case uint64:
		return v == 0
	case int64:
		return v == 0
	case int:
		return v == 0
	case float64:
		return v == 0
	}
	return false
}

// Defaults fills every unset field with its documented default.
func (c *Config) Defaults() {
	t, f := true, 1.0
	if c.Dataset.Format == "" {
		c.Dataset.Format = string(data.FormatAuto)
	}
	if c.Model.TokenizerNameOrPath == "" {
		c.Model.TokenizerNameOrPath = c.Model.ModelNameOrPath
	}
	if c.Dataset.Shuffle == nil {
		c.Dataset.Shuffle = &t
	}
	b := &c.Batch
	if b.MaxLength == 0 {
		b.MaxLength = 1024
	}
	if b.Packing == nil {
		b.Packing = &t
	}
	if b.PerDeviceTrainBatchSize == 0 {
		b.PerDeviceTrainBatchSize = 8
	}
	if b.PerDeviceEvalBatchSize == 0 {
		b.PerDeviceEvalBatchSize = b.PerDeviceTrainBatchSize
	}
	if b.GradientAccumulationSteps == 0 {
		b.GradientAccumulationSteps = 1
	}
	o := &c.Optim
	if o.Optim == "" {
		o.Optim = "adamw_torch"
	}
	if o.LearningRate == 0 {
		o.LearningRate = 5e-5
	}
	if o.AdamBeta1 == 0 {
		o.AdamBeta1 = 0.9
	}
	if o.AdamBeta2 == 0 {
		o.AdamBeta2 = 0.999
	}
	if o.AdamEpsilon == 0 {
		o.AdamEpsilon = 1e-8
	}
	if o.MaxGradNorm == nil {
		o.MaxGradNorm = &f
	}
	s := &c.Sched
	if s.LRSchedulerType == "" {
		s.LRSchedulerType = "linear"
	}
	if s.MaxSteps == 0 {
		s.MaxSteps = -1
	}
	if s.NumTrainEpochs == 0 {
		s.NumTrainEpochs = 3
	}
	r := &c.Run
	if r.Seed == nil {
		seed := int64(42)
		r.Seed = &seed
	}
	if r.SaveSteps == nil {
		n := 500
		r.SaveSteps = &n
	}
	if r.LoggingSteps == 0 {
		r.LoggingSteps = 10
	}
	if r.Device == "" {
		r.Device = "auto"
	}
	if sy := c.Dataset.Synthetic; sy != nil {
		if sy.Kind == "" {
			sy.Kind = "arithmetic"
		}
		if sy.Seed == 0 {
			sy.Seed = 1
		}
		if sy.MaxOperand == 0 {
			sy.MaxOperand = 99
		}
		if sy.Train == 0 {
			sy.Train = 8000
		}
		if sy.Eval == 0 {
			sy.Eval = 200
		}
	}
	if c.GenerationEval.MaxNewTokens == 0 {
		c.GenerationEval.MaxNewTokens = 16
	}
	c.peftDefaults()
	if spec, ok := methodRegistry[c.Method]; ok && spec.Defaults != nil {
		spec.Defaults(c)
	}
}

// FieldError is a refused configuration value. Key is the dotted YAML key; Line and Column
// locate it in the file when known (0 otherwise).
type FieldError struct {
	File         string
	Key          string
	Line, Column int
	Msg          string
}

func (e *FieldError) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d:%d", e.Line, e.Column)
		}
		b.WriteString(": ")
	}
	if e.Key != "" {
		fmt.Fprintf(&b, "%s: ", e.Key)
	}
	b.WriteString(e.Msg)
	return b.String()
}

func oneOf(key, v string, choices []string) *FieldError {
	for _, c := range choices {
		if v == c {
			return nil
		}
	}
	msg := fmt.Sprintf("%q is not one of %s", v, strings.Join(choices, ", "))
	if s := closest(v, choices); s != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", s)
	}
	return &FieldError{Key: key, Msg: msg}
}

func (c *Config) hasEvalData() bool {
	return c.Dataset.EvalSplit > 0 || len(c.Dataset.EvalPath) > 0 || (c.Dataset.Synthetic != nil && c.Dataset.Synthetic.Eval > 0)
}

// Validate refuses impossible or contradictory values. It expects Defaults to have run.
func (c *Config) Validate() error {
	var errs []*FieldError
	bad := func(key, format string, args ...any) {
		errs = append(errs, &FieldError{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	check := func(e *FieldError) {
		if e != nil {
			errs = append(errs, e)
		}
	}
	if spec, ok := methodRegistry[c.Method]; !ok {
		check(oneOf("method", c.Method, Methods()))
	} else {
		c.validateObjective(spec, bad)
	}
	m := c.Model
	switch {
	case m.ModelNameOrPath == "" && m.Init == nil:
		bad("model_name_or_path", "set a checkpoint directory, or init: {arch, preset} to train from scratch")
	case m.ModelNameOrPath != "" && m.Init != nil:
		bad("init", "model_name_or_path and init exclude each other: keep one")
	case m.Init != nil && m.Init.Arch == "":
		bad("init.arch", "name the architecture (model_type), e.g. qwen3")
	case m.Init != nil && m.TokenizerNameOrPath == "":
		bad("tokenizer_name_or_path", "training from init needs a tokenizer directory")
	}
	switch sy := c.Dataset.Synthetic; {
	case len(c.Dataset.Path) == 0 && sy == nil:
		bad("dataset.path", "name at least one JSONL file (or use dataset.synthetic)")
	case len(c.Dataset.Path) > 0 && sy != nil:
		bad("dataset.synthetic", "dataset.path and dataset.synthetic exclude each other: keep one")
	case sy != nil:
		check(oneOf("dataset.synthetic.kind", sy.Kind, []string{"arithmetic"}))
		if sy.MaxOperand < 1 || sy.MaxOperand > 1_000_000 {
			bad("dataset.synthetic.max_operand", "%d must be in [1, 1000000]", sy.MaxOperand)
		}
		if sy.Train < 1 || sy.Eval < 0 || sy.Train > 10_000_000 || sy.Eval > 10_000_000 {
			bad("dataset.synthetic.train", "need train in [1, 10000000] and eval in [0, 10000000], got %d and %d", sy.Train, sy.Eval)
		} else if n := (sy.MaxOperand + 1) * (sy.MaxOperand + 1); sy.MaxOperand >= 1 && sy.MaxOperand <= 1_000_000 && sy.Train+sy.Eval > n {
			bad("dataset.synthetic.train", "%d train + %d eval chats: only %d distinct problems have operands up to %d", sy.Train, sy.Eval, n, sy.MaxOperand)
		}
		if c.Dataset.EvalSplit > 0 || len(c.Dataset.EvalPath) > 0 {
			bad("dataset.synthetic", "synthetic data brings its own held-out set: remove eval_split and eval_path")
		}
	}
	if _, err := data.ParseFormat(c.Dataset.Format); err != nil {
		formats := make([]string, len(data.Formats))
		for i, f := range data.Formats {
			formats[i] = string(f)
		}
		check(oneOf("dataset.format", c.Dataset.Format, formats))
	}
	if c.Dataset.EvalSplit < 0 || c.Dataset.EvalSplit >= 1 || math.IsNaN(c.Dataset.EvalSplit) {
		bad("dataset.eval_split", "%v must be in [0, 1)", c.Dataset.EvalSplit)
	}
	if c.Dataset.EvalSplit > 0 && len(c.Dataset.EvalPath) > 0 {
		bad("dataset.eval_split", "eval_split and eval_path exclude each other: keep one")
	}
	b := c.Batch
	if b.MaxLength < 2 || b.MaxLength > 1<<20 {
		bad("max_length", "%d must be in [2, 1048576]", b.MaxLength)
	}
	if b.PerDeviceTrainBatchSize < 1 || b.PerDeviceTrainBatchSize > 1<<16 {
		bad("per_device_train_batch_size", "%d must be in [1, 65536]", b.PerDeviceTrainBatchSize)
	}
	if b.PerDeviceEvalBatchSize < 1 || b.PerDeviceEvalBatchSize > 1<<16 {
		bad("per_device_eval_batch_size", "%d must be in [1, 65536]", b.PerDeviceEvalBatchSize)
	}
	if b.GradientAccumulationSteps < 1 || b.GradientAccumulationSteps > 1<<16 {
		bad("gradient_accumulation_steps", "%d must be in [1, 65536]", b.GradientAccumulationSteps)
	}
	o := c.Optim
	check(oneOf("optim", o.Optim, optims))
	if !(o.LearningRate > 0 && o.LearningRate < 10) {
		bad("learning_rate", "%v must be in (0, 10)", o.LearningRate)
	}
	if !(o.WeightDecay >= 0 && o.WeightDecay < 10) {
		bad("weight_decay", "%v must be in [0, 10)", o.WeightDecay)
	}
	if !(o.AdamBeta1 >= 0 && o.AdamBeta1 < 1) {
		bad("adam_beta1", "%v must be in [0, 1)", o.AdamBeta1)
	}
	if !(o.AdamBeta2 >= 0 && o.AdamBeta2 < 1) {
		bad("adam_beta2", "%v must be in [0, 1)", o.AdamBeta2)
	}
	if !(o.AdamEpsilon > 0 && o.AdamEpsilon < 1) {
		bad("adam_epsilon", "%v must be in (0, 1)", o.AdamEpsilon)
	}
	if r := o.MoEBalancingRate; !(r >= 0) || math.IsInf(r, 0) {
		bad("moe_balancing_rate", "%v must be a finite number >= 0 (0 turns aux-loss-free balancing off; e.g. 1e-3)", r)
	}
	if a := o.RouterAuxLossCoef; a != nil && (!(*a >= 0) || math.IsInf(*a, 0)) {
		bad("router_aux_loss_coef", "%v must be a finite number >= 0 (0 trains without the aux loss)", *a)
	}
	if o.MaxGradNorm != nil && !(*o.MaxGradNorm >= 0) {
		bad("max_grad_norm", "%v must be >= 0 (0 disables clipping)", *o.MaxGradNorm)
	}
	s := c.Sched
	check(oneOf("lr_scheduler_type", s.LRSchedulerType, schedulers))
	if s.WarmupSteps < 0 {
		bad("warmup_steps", "%d must be >= 0", s.WarmupSteps)
	}
	if !(s.WarmupRatio >= 0 && s.WarmupRatio < 1) {
		bad("warmup_ratio", "%v must be in [0, 1)", s.WarmupRatio)
	}
	if s.WarmupSteps > 0 && s.WarmupRatio > 0 {
		bad("warmup_ratio", "warmup_steps and warmup_ratio exclude each other: keep one")
	}
	if s.MaxSteps == 0 || s.MaxSteps < -1 {
		bad("max_steps", "%d must be positive, or -1 to use num_train_epochs", s.MaxSteps)
	}
	if s.MaxSteps > 0 && s.WarmupSteps >= s.MaxSteps && s.LRSchedulerType != "constant" {
		bad("warmup_steps", "%d warmup steps leave nothing of max_steps %d", s.WarmupSteps, s.MaxSteps)
	}
	if s.MaxSteps < 0 && !(s.NumTrainEpochs > 0 && s.NumTrainEpochs <= 1e6) {
		bad("num_train_epochs", "%v must be in (0, 1e6]", s.NumTrainEpochs)
	}
	r := c.Run
	if r.OutputDir == "" {
		bad("output_dir", "name a directory for metrics, checkpoints and the final model")
	}
	if r.SaveSteps != nil && *r.SaveSteps < 0 {
		bad("save_steps", "%d must be >= 0 (0 saves only at the end)", *r.SaveSteps)
	}
	if r.SaveTotalLimit < 0 {
		bad("save_total_limit", "%d must be >= 0 (0 keeps all)", r.SaveTotalLimit)
	}
	if r.LoggingSteps < 1 {
		bad("logging_steps", "%d must be >= 1", r.LoggingSteps)
	}
	if r.EvalSteps < 0 {
		bad("eval_steps", "%d must be >= 0 (0 evaluates only at the end)", r.EvalSteps)
	}
	if r.EvalSteps > 0 && !c.hasEvalData() {
		bad("eval_steps", "evaluation needs held-out data: set dataset.eval_split or dataset.eval_path")
	}
	check(oneOf("device", r.Device, devices))
	if !(r.MaxDeviceMemoryGiB >= 0 && r.MaxDeviceMemoryGiB < 1<<24) {
		bad("max_device_memory_gib", "%v must be a number of GiB >= 0 (0: no cap)", r.MaxDeviceMemoryGiB)
	}
	if d, l, err := c.Parallel.Resolve(); err != nil {
		bad("devices", "%v", err)
	} else if c.Parallel.Devices != "" && r.Device != "" && r.Device != "auto" && r.Device != d.Kind {
		bad("devices", "devices %s and device %s disagree: keep devices (device: auto)", c.Parallel.Devices, r.Device)
	} else if l.DP > 0 && b.GradientAccumulationSteps%l.DP != 0 {
		bad("gradient_accumulation_steps", "%d micro-batches per step cannot be dealt over %d data-parallel ranks (devices %s / tensor %d / context %d): use a multiple of %d",
			b.GradientAccumulationSteps, l.DP, d, l.TP, l.CP, l.DP)
	}
	if bf16Optim(o.Optim) && !r.BF16 {
		bad("optim", "%s keeps bf16 weights: set bf16: true, or use adamw_torch", o.Optim)
	}
	g := c.GenerationEval
	if g.MaxSamples < 0 {
		bad("generation_eval.max_samples", "%d must be >= 0", g.MaxSamples)
	}
	if g.MaxNewTokens < 1 || g.MaxNewTokens > 1<<16 {
		bad("generation_eval.max_new_tokens", "%d must be in [1, 65536]", g.MaxNewTokens)
	}
	if g.MaxSamples > 0 && !c.hasEvalData() {
		bad("generation_eval.max_samples", "generation eval needs held-out data: set dataset.eval_split or dataset.eval_path")
	}
	c.validatePEFT(bad)
	c.validateQuant(bad)
	if len(errs) == 0 {
		return nil
	}
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = e
	}
	return errors.Join(out...)
}

// LoadConfig reads a YAML config file strictly, applies --key=value overrides, fills defaults
// and validates. method, when not empty, is the method named on the command line; a config
// file that names another one is refused. Relative paths are relative to the working
// directory, as with Hugging Face tools.
func LoadConfig(path, method string, overrides []string) (*Config, error) {
	src, err := yamlsafe.ReadFile(path, 0)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return parseConfig(src, path, filepath.Dir(path), method, overrides)
}

// ParseConfig is LoadConfig on YAML bytes; name is used in error messages. Relative paths are
// left as they are (relative to the working directory).
func ParseConfig(src []byte, name, method string, overrides []string) (*Config, error) {
	return parseConfig(src, name, "", method, overrides)
}

// resolveInputs makes the config's input paths (model, tokenizer, data, checkpoint to resume)
// absolute: a relative path names a file under the working directory when one exists there,
// else one under baseDir (the config file's directory) when it exists there. So a config works
// from the repository root, from its own directory, and when a session in another directory
// loads it. Outputs (output_dir) stay relative to the working directory.
func (c *Config) resolveInputs(baseDir string) {
	fix := func(p *string) {
		if *p == "" || filepath.IsAbs(*p) {
			return
		}
		cand := *p
		if _, err := os.Stat(cand); err != nil {
			if _, err := os.Stat(filepath.Join(baseDir, cand)); err == nil {
				cand = filepath.Join(baseDir, cand)
			}
		}
		if abs, err := filepath.Abs(cand); err == nil {
			*p = abs
		}
	}
	fix(&c.Model.ModelNameOrPath)
	fix(&c.Model.TokenizerNameOrPath)
	for i := range c.Dataset.Path {
		fix(&c.Dataset.Path[i])
	}
	for i := range c.Dataset.EvalPath {
		fix(&c.Dataset.EvalPath[i])
	}
	fix(&c.Run.ResumeFromCheckpoint)
}

func parseConfig(src []byte, name, baseDir, method string, overrides []string) (*Config, error) {
	var cfg Config
	if err := decodeStrict(src, &cfg); err != nil {
		return nil, yamlError(err, name)
	}
	if zs := explicitZeros(src); len(zs) > 0 {
		parts := make([]string, len(zs))
		for i, fe := range zs {
			fe.File = name
			locate(fe, src)
			parts[i] = fe.Error()
		}
		return nil, errors.New(strings.Join(parts, "\n"))
	}
	if method != "" {
		if cfg.Method != "" && cfg.Method != method {
			fe := &FieldError{File: name, Key: "method", Msg: fmt.Sprintf("the file says %q but the command is `launch %s`", cfg.Method, method)}
			locate(fe, src)
			return nil, fe
		}
		cfg.Method = method
	}
	for _, o := range overrides {
		if err := cfg.Set(o); err != nil {
			return nil, err
		}
	}
	if baseDir != "" {
		cfg.resolveInputs(baseDir)
	}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		var parts []string
		for _, e := range unjoin(err) {
			var fe *FieldError
			if errors.As(e, &fe) {
				fe.File = name
				if !overridden(fe.Key, overrides) {
					locate(fe, src)
				} else {
					fe.File = "command line"
				}
			}
			parts = append(parts, e.Error())
		}
		return nil, errors.New(strings.Join(parts, "\n"))
	}
	return &cfg, nil
}

// decodeStrict decodes one YAML document refusing unknown keys, after yamlsafe has bounded
// its size, nesting and alias expansion. A panic inside the YAML library on hostile input
// becomes an error.
func decodeStrict(src []byte, cfg *Config) error {
	if len(bytes.TrimSpace(src)) == 0 {
		return nil
	}
	return yamlsafe.Unmarshal(src, cfg, yaml.DisallowUnknownField())
}

func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func overridden(key string, overrides []string) bool {
	for _, o := range overrides {
		k, _, _ := strings.Cut(strings.TrimLeft(o, "-"), "=")
		if k == key {
			return true
		}
	}
	return false
}

// locate fills a FieldError's line and column from the key's position in src.
func locate(fe *FieldError, src []byte) {
	file, err := parser.ParseBytes(src, 0)
	if err != nil {
		return
	}
	p, err := yaml.PathString("$." + fe.Key)
	if err != nil {
		return
	}
	node, err := p.FilterFile(file)
	if err != nil || node == nil {
		// A missing key: point at nothing, the message says what to add.
		return
	}
	tk := node.GetToken()
	if tk == nil || tk.Position == nil {
		return
	}
	fe.Line, fe.Column = tk.Position.Line, tk.Position.Column
}

// yamlError turns a go-yaml decoding error into a FieldError with position and a suggestion.
func yamlError(err error, name string) error {
	var ye yaml.Error
	if !errors.As(err, &ye) {
		return fmt.Errorf("config: %s: %v", name, err)
	}
	fe := &FieldError{File: name, Msg: ye.GetMessage()}
	if tk := ye.GetToken(); tk != nil && tk.Position != nil {
		fe.Line, fe.Column = tk.Position.Line, tk.Position.Column
	}
	var uf *yaml.UnknownFieldError
	var te *yaml.TypeError
	switch {
	case errors.As(err, &uf):
		key := ""
		if tk := uf.GetToken(); tk != nil {
			key = tk.Value
		}
		fe.Msg = fmt.Sprintf("unknown key %q", shortKey(key))
		if s := closest(key, knownKeys()); s != "" {
			fe.Msg += fmt.Sprintf(" (did you mean %q?)", s)
		}
	case errors.As(err, &te):
		field := ""
		if te.StructFieldName != nil {
			field = *te.StructFieldName
		}
		fe.Msg = fmt.Sprintf("wrong type: expected %s, got %s", goTypeWord(te.DstType), yamlTypeWord(te.SrcType, te.Token))
		if field != "" {
			fe.Key = yamlKeyOf(field[strings.LastIndex(field, ".")+1:])
		}
	}
	return fe
}

func goTypeWord(t reflect.Type) string {
	if t == nil {
		return "a value"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "an integer"
	case reflect.Float64, reflect.Float32:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Struct, reflect.Map:
		return "a mapping"
	case reflect.Slice:
		return "a list"
	}
	return t.String()
}

func yamlTypeWord(t reflect.Type, tk *token.Token) string {
	w := goTypeWord(t)
	if tk != nil {
		return fmt.Sprintf("%s (%q)", w, tk.Value)
	}
	return w
}

// yamlKeyOf maps a Go struct field name to its yaml key.
func yamlKeyOf(goField string) string {
	var found string
	walkKeys(reflect.TypeOf(Config{}), "", func(key string, f reflect.StructField) {
		if f.Name == goField && found == "" {
			found = key
		}
	})
	if found == "" {
		return goField
	}
	return found
}

// walkKeys calls fn for every yaml key of t, dotted, following inline and nested structs.
func walkKeys(t reflect.Type, prefix string, fn func(key string, f reflect.StructField)) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return
	}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if strings.Contains(opts, "inline") {
			walkKeys(f.Type, prefix, fn)
			continue
		}
		if name == "" || name == "-" {
			continue
		}
		key := prefix + name
		fn(key, f)
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct {
			walkKeys(ft, key+".", fn)
		}
	}
}

// knownKeys lists every key of the config tree, both as last component and dotted.
func knownKeys() []string {
	seen := map[string]bool{}
	var keys []string
	walkKeys(reflect.TypeOf(Config{}), "", func(key string, _ reflect.StructField) {
		for _, k := range []string{key, key[strings.LastIndex(key, ".")+1:]} {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	})
	sort.Strings(keys)
	return keys
}

// closest is the candidate nearest to s, for "did you mean" (internal/suggest).
func closest(s string, candidates []string) string { return suggest.Closest(s, candidates) }

// shortKey shortens a key or value taken from the input for an error message.
func shortKey(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return fmt.Sprintf("%s... (%d bytes)", s[:n], len(s))
}

// Set applies one command-line override "key=value" (leading dashes allowed; key dotted for
// nested fields, e.g. init.preset=tiny). The value is parsed as YAML into the field's type, so
// it gets the same checks as the file.
func (c *Config) Set(override string) error {
	kv := strings.TrimLeft(override, "-")
	key, value, ok := strings.Cut(kv, "=")
	if !ok || key == "" {
		return &FieldError{File: "command line", Key: shortKey(override), Msg: "overrides look like --key=value"}
	}
	v := reflect.ValueOf(c).Elem()
	parts := strings.Split(key, ".")
	for i, part := range parts {
		f, ok := fieldByKey(v, part)
		if !ok {
			fe := &FieldError{File: "command line", Key: shortKey(key), Msg: "unknown key"}
			if s := closest(strings.Join(parts[:i+1], "."), knownKeys()); s != "" {
				fe.Msg += fmt.Sprintf(" (did you mean %q?)", s)
			}
			return fe
		}
		if i == len(parts)-1 {
			w := wrapField(part, f.Type())
			if err := yamlsafe.Unmarshal([]byte(part+": "+yamlScalar(value)), w.Interface(), yaml.DisallowUnknownField()); err != nil {
				return &FieldError{File: "command line", Key: key, Msg: fmt.Sprintf("bad value %q: %s", shortKey(value), typeMsg(err, f.Type()))}
			}
			if _, ok := zeroIsUnset[key]; ok && w.Elem().Field(0).IsZero() {
				return &FieldError{File: "command line", Key: key, Msg: zeroMsg(key)}
			}
			f.Set(w.Elem().Field(0))
			return nil
		}
		if f.Kind() == reflect.Pointer {
			if f.IsNil() {
				f.Set(reflect.New(f.Type().Elem()))
			}
			f = f.Elem()
		}
		if f.Kind() != reflect.Struct {
			return &FieldError{File: "command line", Key: key, Msg: fmt.Sprintf("%s is not a mapping", strings.Join(parts[:i+1], "."))}
		}
		v = f
	}
	return nil
}

func typeMsg(err error, t reflect.Type) string {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		return "expected " + goTypeWord(t)
	}
	var ye yaml.Error
	if errors.As(err, &ye) {
		return ye.GetMessage()
	}
	return err.Error()
}

// yamlScalar leaves a value as the user typed it; an empty value becomes an empty string.
func yamlScalar(v string) string {
	if v == "" {
		return `""`
	}
	return v
}

// wrapField builds a pointer to a one-field struct {V T `yaml:"<key>"`} to decode a value into.
func wrapField(key string, t reflect.Type) reflect.Value {
	st := reflect.StructOf([]reflect.StructField{{
		Name: "V",
		Type: t,
		Tag:  reflect.StructTag(fmt.Sprintf(`yaml:"%s"`, key)),
	}})
	return reflect.New(st)
}

// fieldByKey finds the field of struct v whose yaml key is key, looking through inline structs.
func fieldByKey(v reflect.Value, key string) (reflect.Value, bool) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if strings.Contains(opts, "inline") {
			if r, ok := fieldByKey(v.Field(i), key); ok {
				return r, true
			}
			continue
		}
		if name == key {
			return v.Field(i), true
		}
	}
	return reflect.Value{}, false
}
