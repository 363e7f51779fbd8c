package train

import (
	"reflect"
	"slices"
	"strings"
)

// ObjectiveConfig holds the keys of the methods beyond pretrain and sft, under TRL's names
// (DPOConfig, KTOConfig, RewardConfig) where TRL has one. Each method reads only its own keys
// (MethodSpec.Keys); setting a key that the run's method does not read is refused. Unset
// (nil) values take the method's default, given per field.
type ObjectiveConfig struct {
	// Beta is the strength of the preference signal: the inverse temperature of DPO's and
	// KTO's implicit reward (default 0.1), the scale of SMPO's mean log-prob reward (default
	// 1.2). Must be > 0.
	Beta *float64 `yaml:"beta,omitempty" json:"beta,omitempty"`
	// LossType chooses the loss of the method: DPO sigmoid (default) or ipo; KTO kto
	// (default).
	LossType string `yaml:"loss_type,omitempty" json:"loss_type,omitempty"`
	// LabelSmoothing is DPO's conservative-DPO label noise epsilon in [0, 0.5): the loss
	// assumes a pair's labels are flipped with this probability. Default 0 (sigmoid only).
	LabelSmoothing float64 `yaml:"label_smoothing,omitempty" json:"label_smoothing,omitempty"`
	// PrecomputeRefLogProbs computes the reference model's log-probs of every training and
	// held-out completion once, before the first step, and frees the reference (default
	// true; TRL's default is false, with the same results, since the reference is frozen
	// and runs without dropout). With false the reference stays in memory and runs every
	// micro-batch. Under LoRA the reference is the base with the adapters off, either way.
	PrecomputeRefLogProbs *bool `yaml:"precompute_ref_log_probs,omitempty" json:"precompute_ref_log_probs,omitempty"`
	// RefModelNameOrPath is the reference model's checkpoint directory. Default: the model
	// the run starts from (model_name_or_path, or the init model of seed), which is the
	// policy itself before the first step. Under LoRA it must stay unset (the base is the
	// reference).
	RefModelNameOrPath string `yaml:"ref_model_name_or_path,omitempty" json:"ref_model_name_or_path,omitempty"`
	// TargetMargin is SMPO's target gap between the chosen and rejected rewards (beta times
	// the mean-token log-probs). Default 0.35.
	TargetMargin *float64 `yaml:"target_margin,omitempty" json:"target_margin,omitempty"`
	// MarginRampRatio is the fraction of the planned steps over which SMPO's margin ramps
	// linearly from 0 to target_margin, in [0, 1]; 0 uses the target from the first step.
	// Default 1 (the whole run).
	MarginRampRatio *float64 `yaml:"margin_ramp_ratio,omitempty" json:"margin_ramp_ratio,omitempty"`
	// AnchorWeight is the weight of SMPO's cross-entropy anchor, the mean-token negative
	// log-likelihood of the chosen completion. Default 1; 0 turns the anchor off.
	AnchorWeight *float64 `yaml:"anchor_weight,omitempty" json:"anchor_weight,omitempty"`
	// DesirableWeight and UndesirableWeight weigh KTO's losses of desirable (label true)
	// and undesirable examples, to make up for an imbalance between them. Default 1 each.
	DesirableWeight   *float64 `yaml:"desirable_weight,omitempty" json:"desirable_weight,omitempty"`
	UndesirableWeight *float64 `yaml:"undesirable_weight,omitempty" json:"undesirable_weight,omitempty"`
	// CenterRewardsCoefficient adds coef * mean((r_chosen + r_rejected)^2) to the reward
	// model's loss, which keeps its scores centred on 0 (TRL's RewardConfig). Default 0.
	CenterRewardsCoefficient *float64 `yaml:"center_rewards_coefficient,omitempty" json:"center_rewards_coefficient,omitempty"`

	// GRPO's keys (TRL's GRPOConfig). beta is the weight of the KL to the reference (default 0:
	// no reference is built) and loss_type one of grpo, bnpo, dr_grpo, dapo (default dapo).
	// per_device_train_batch_size counts completions; a step samples
	// per_device_train_batch_size * gradient_accumulation_steps completions,
	// num_generations per prompt, and max_length bounds the prompts.

	// NumGenerations is the number of completions sampled per prompt (G), at least 2.
	// Default 8.
	NumGenerations *int `yaml:"num_generations,omitempty" json:"num_generations,omitempty"`
	// MaxCompletionLength is the most tokens a completion may have. Default 256.
	MaxCompletionLength *int `yaml:"max_completion_length,omitempty" json:"max_completion_length,omitempty"`
	// Temperature, TopP and TopK are the sampling settings of the completions. Defaults 1,
	// 1 (off) and 0 (off).
	Temperature *float64 `yaml:"temperature,omitempty" json:"temperature,omitempty"`
	TopP        *float64 `yaml:"top_p,omitempty" json:"top_p,omitempty"`
	TopK        *int     `yaml:"top_k,omitempty" json:"top_k,omitempty"`
	// Epsilon and EpsilonHigh are the clip range of the importance ratio, [1-epsilon,
	// 1+epsilon_high]. Defaults 0.2 and epsilon (DAPO uses 0.28).
	Epsilon     *float64 `yaml:"epsilon,omitempty" json:"epsilon,omitempty"`
	EpsilonHigh *float64 `yaml:"epsilon_high,omitempty" json:"epsilon_high,omitempty"`
	// ScaleRewards divides the advantages by the rewards' standard deviation within each
	// group (group, the default), over the step (batch), or not at all (none).
	ScaleRewards string `yaml:"scale_rewards,omitempty" json:"scale_rewards,omitempty"`
	// NumIterations is the number of optimizer steps taken on each generation batch (mu).
	// Default 1.
	NumIterations *int `yaml:"num_iterations,omitempty" json:"num_iterations,omitempty"`
	// MaskTruncatedCompletions leaves completions that hit max_completion_length without a
	// stop token out of the loss.
	MaskTruncatedCompletions bool `yaml:"mask_truncated_completions,omitempty" json:"mask_truncated_completions,omitempty"`
	// RewardFuncs are the reward functions, summed with their weights. Required.
	RewardFuncs []RewardSpec `yaml:"reward_funcs,omitempty" json:"reward_funcs,omitempty"`
	// RewardTimeout is how long one call of a reward function may take, in seconds. Default
	// 60.
	RewardTimeout *float64 `yaml:"reward_timeout,omitempty" json:"reward_timeout,omitempty"`
	// RewardRetries is how many more times a failed reward call is made. Default 1.
	RewardRetries *int `yaml:"reward_retries,omitempty" json:"reward_retries,omitempty"`
	// RewardFailure says what a step does when its rewards still fail after the retries:
	// retry (the default: the step fails with the error, nothing is updated and the data
	// stays where it was, so running the step again retries it) or skip (the step's prompts
	// are dropped, no update is made, and the step counts as done with metric skipped = 1).
	RewardFailure string `yaml:"reward_failure,omitempty" json:"reward_failure,omitempty"`
}

// setObjectiveKeys lists the keys of Config.Objective that c sets (non-zero).
func (c *Config) setObjectiveKeys() []string {
	var keys []string
	v := reflect.ValueOf(c.Objective)
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if !v.Field(i).IsZero() {
			keys = append(keys, name)
		}
	}
	return keys
}

// validateObjective refuses the method keys that the run's method does not read, then runs
// the method's own checks.
func (c *Config) validateObjective(spec *MethodSpec, bad func(key, format string, args ...any)) {
	owners := objectiveKeyOwners()
	for _, k := range c.setObjectiveKeys() {
		if !slices.Contains(spec.Keys, k) {
			who := "no registered method"
			if o := owners[k]; len(o) > 0 {
				who = "methods " + strings.Join(o, ", ")
			}
			bad(k, "method %s does not read %s (a key of %s): remove it", spec.Name, k, who)
		}
	}
	if spec.Validate != nil {
		spec.Validate(c, bad)
	}
}

// defaultFloat sets *p to v when it is unset.
func defaultFloat(p **float64, v float64) {
	if *p == nil {
		*p = &v
	}
}
