package train

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
)

// grpoConfig is a from-scratch tiny qwen3 on the CPU doing GRPO over synthetic arithmetic
// chats, with extra overriding keys.
func grpoConfig(t *testing.T, rewards string, extra ...string) *Config {
	t.Helper()
	y := fmt.Sprintf(`init:
  arch: qwen3
  preset: tiny
  overrides: {hidden_size: 32, intermediate_size: 64, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, num_hidden_layers: 2}
tokenizer_name_or_path: %s
dataset:
  synthetic: {kind: arithmetic, seed: 1, max_operand: 20, train: 200, eval: 20}
max_length: 32
per_device_train_batch_size: 16
gradient_accumulation_steps: 2
num_generations: 8
max_completion_length: 1
reward_funcs: %s
learning_rate: 1e-2
lr_scheduler_type: constant
max_steps: 30
seed: 7
device: cpu
output_dir: %s
`, quickTok, rewards, filepath.Join(t.TempDir(), "out"))
	cfg, err := ParseConfig([]byte(y), "grpo.yaml", MethodGRPO, extra)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestGRPORewardRises trains a random tiny model with GRPO to answer with one digit (reward
// format \d): the mean reward of the last steps is clearly above that of the first ones, and
// every step logs the method's metrics.
func TestGRPORewardRises(t *testing.T) {
	tr := newTrainer(t, grpoConfig(t, `[{name: format, pattern: '\d'}]`))
	var rewards []float64
	for i := range 30 {
		m, err := tr.Step(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		r, ok := m.Method["rewards/format/mean"]
		if !ok {
			t.Fatalf("step %d: no rewards/format/mean in %v", i+1, m.Method)
		}
		for _, k := range []string{"reward", "reward_std", "completions/mean_length", "clip_ratio/region_mean", "time/generation_s", "time/training_s", "frac_reward_zero_std"} {
			if _, ok := m.Method[k]; !ok {
				t.Fatalf("step %d: metric %s missing from %v", i+1, k, m.Method)
			}
		}
		rewards = append(rewards, r)
	}
	if sum := tr.Summary(); !strings.Contains(sum, "grpo: 4 prompts x 8 completions per step (max_completion_length 1, temperature 1), loss dapo, beta 0, rewards format") {
		t.Errorf("the summary does not describe the GRPO step:\n%s", sum)
	}
	first, last := mean(rewards[:5]), mean(rewards[25:])
	t.Logf("reward: first 5 steps %.3f, last 5 %.3f (%v)", first, last, rewards)
	if last < first+0.3 {
		t.Errorf("reward rose from %.3f to %.3f only", first, last)
	}
}

func mean(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// TestGRPOIterationsAndKL runs two optimizer steps per generation batch with a KL term to the
// frozen reference and the grpo loss type: the second step of a batch samples nothing, the KL
// is measured (zero before the first update, positive after), and the clip ratios are
// fractions.
func TestGRPOIterationsAndKL(t *testing.T) {
	tr := newTrainer(t, grpoConfig(t, `[{name: format, pattern: '\d'}]`, "--num_iterations=2", "--beta=0.04", "--loss_type=grpo", "--epsilon_high=0.28"))
	var kls []float64
	for i := range 4 {
		m, err := tr.Step(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		gen := m.Method["time/generation_s"]
		if (i%2 == 1) != (gen == 0) {
			t.Errorf("step %d: generation time %v (a batch is sampled every second step)", i+1, gen)
		}
		kl, ok := m.Method["kl"]
		if !ok {
			t.Fatalf("step %d: no kl with beta 0.04", i+1)
		}
		kls = append(kls, kl)
		for _, k := range []string{"clip_ratio/low_mean", "clip_ratio/high_mean"} {
			if v := m.Method[k]; v < 0 || v > 1 {
				t.Errorf("step %d: %s = %v", i+1, k, v)
			}
		}
	}
	if math.Abs(kls[0]) > 1e-6 || kls[3] <= 0 {
		t.Errorf("kl per step %v: want 0 at the start, > 0 after updates", kls)
	}
	if tr.obj.(*grpo).ref == nil {
		t.Error("beta > 0 without LoRA built no reference model")
	}
}

// TestGRPOGradientMatchesFiniteDifferences checks the whole objective's gradient, as the
// per-token scales reach the model, against central differences of the loss along a random
// direction of one weight: off-policy old log-probs (so ratios leave the clip range), a
// reference, the dapo normalisation and a sampling temperature of 0.7 (the log-probs are
// those of logits / 0.7).
func TestGRPOGradientMatchesFiniteDifferences(t *testing.T) {
	tr := newTrainer(t, grpoConfig(t, `[{name: format, pattern: '\d'}]`, "--beta=0.1", "--max_completion_length=3", "--epsilon=0.1", "--temperature=0.7"))
	g := tr.obj.(*grpo)
	roll, err := g.makeRollouts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	g.roll = roll
	for i := range roll.samples {
		s := &roll.samples[i]
		s.adv = float64(i%3) - 1 // every sign, whatever the rewards were
		s.old, s.ref = make([]float32, len(s.tokens)), make([]float32, len(s.tokens))
		for k := range s.tokens {
			s.old[k] = float32(-3 + 0.7*float64((i+k)%5)) // ratios far from 1 either way
			s.ref[k] = float32(-2.5 + 0.3*float64((i*k)%4))
		}
	}
	m := tr.model
	loss := func() float64 {
		total := 0.0
		for mi, b := range roll.micro {
			lp, err := m.TokenLogprobs(toModelBatch(b))
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range roll.samples {
				if s.micro != mi {
					continue
				}
				for k := range s.counted {
					total += roll.weights[i] * g.loss.token(float64(lp[s.offset+k]), float64(s.old[k]), float64(s.ref[k]), s.adv).loss
				}
			}
		}
		return total
	}
	if err := m.ZeroGrads(); err != nil {
		t.Fatal(err)
	}
	g.next = 0
	sum := 0.0
	for _, b := range roll.micro {
		s, _, err := g.ForwardBackward(m, b, 1, StepAt{})
		if err != nil {
			t.Fatal(err)
		}
		sum += s
	}
	if l := loss(); math.Abs(sum-l) > 1e-5*(1+math.Abs(l)) {
		t.Fatalf("ForwardBackward's loss %v, recomputed %v", sum, l)
	}
	const name = "model.layers.1.mlp.down_proj.weight"
	grad, _ := m.GradFloat32(name)
	p0, _ := m.ParamFloat32(name)
	dir := make([]float32, len(p0))
	analytic := 0.0
	for i := range dir {
		dir[i] = float32(math.Sin(float64(i) * 1.7))
		analytic += float64(dir[i]) * float64(grad[i])
	}
	const eps = 1e-3
	at := func(sign float64) float64 {
		p := make([]float32, len(p0))
		for i := range p {
			p[i] = p0[i] + float32(sign*eps)*dir[i]
		}
		if err := m.SetParam(name, p); err != nil {
			t.Fatal(err)
		}
		return loss()
	}
	fd := (at(1) - at(-1)) / (2 * eps)
	_ = m.SetParam(name, p0)
	t.Logf("directional derivative: analytic %.6g, finite differences %.6g", analytic, fd)
	if math.Abs(fd-analytic) > 2e-3*math.Abs(fd)+1e-6 {
		t.Errorf("analytic %v, finite differences %v", analytic, fd)
	}
}

// TestGRPORewardFailure checks reward_failure: retry fails the step with the reward error and
// leaves the data and the step count where they were; skip counts the step as done, marks it
// skipped and updates nothing.
func TestGRPORewardFailure(t *testing.T) {
	failing := &stubReward{name: "client", fn: func(context.Context, int, []Rollout) ([]float64, error) {
		return nil, fmt.Errorf("the notebook's function raised ZeroDivisionError")
	}}
	for _, policy := range []string{RewardFailureRetry, RewardFailureSkip} {
		t.Run(policy, func(t *testing.T) {
			tr := newTrainer(t, grpoConfig(t, `[{name: client}]`, "--reward_failure="+policy, "--reward_retries=2"))
			failing.calls = 0
			_, err := tr.Step(context.Background())
			if err == nil || !strings.Contains(err.Error(), "no client scores rollouts") {
				t.Fatalf("without a client: %v", err)
			}
			tr.SetClientReward(failing)
			cur := tr.Cursor()
			p0, _ := tr.model.ParamFloat32("model.norm.weight")
			m, err := tr.Step(context.Background())
			if failing.calls != 3 {
				t.Errorf("the reward function was called %d times, want 1 + 2 retries", failing.calls)
			}
			p1, _ := tr.model.ParamFloat32("model.norm.weight")
			if fmt.Sprint(p0) != fmt.Sprint(p1) {
				t.Error("a step without rewards changed the weights")
			}
			switch policy {
			case RewardFailureRetry:
				if err == nil || !strings.Contains(err.Error(), "ZeroDivisionError") || !strings.Contains(err.Error(), "after 3 attempts") {
					t.Fatalf("retry: %v", err)
				}
				if tr.Steps() != 0 || tr.Cursor() != cur {
					t.Errorf("retry: steps %d, cursor %v (was %v)", tr.Steps(), tr.Cursor(), cur)
				}
			case RewardFailureSkip:
				if err != nil || m.Method["skipped"] != 1 || tr.Steps() != 1 || tr.Cursor() == cur {
					t.Errorf("skip: err %v, metrics %v, steps %d, cursor %v", err, m.Method, tr.Steps(), tr.Cursor())
				}
			}
		})
	}
}

// TestGRPOConfigRefusals checks the GRPO-specific refusals.
func TestGRPOConfigRefusals(t *testing.T) {
	base := fmt.Sprintf("init: {arch: qwen3, preset: tiny}\ntokenizer_name_or_path: %s\ndataset: {synthetic: {kind: arithmetic, train: 50, eval: 5}}\noutput_dir: %s\nper_device_train_batch_size: 8\n", quickTok, t.TempDir())
	for _, tc := range []struct {
		yaml string
		want string
	}{
		{"reward_funcs: [{name: arithmetic}]\nnum_generations: 1\n", "num_generations 1 must be at least 2"},
		{"reward_funcs: [{name: arithmetic}]\nnum_generations: 3\n", "not a multiple of num_generations 3"},
		{"num_generations: 4\n", "needs at least one reward function"},
		{"reward_funcs: [{name: bleu}]\n", "unknown reward function \"bleu\""},
		{"reward_funcs: [{name: format, pattern: '('}]\n", "pattern"},
		{"reward_funcs: [{name: arithmetic}]\nloss_type: sigmoid\n", "loss_type \"sigmoid\""},
		{"reward_funcs: [{name: arithmetic}]\nscale_rewards: rank\n", "scale_rewards"},
		{"reward_funcs: [{name: arithmetic}]\nreward_failure: ignore\n", "reward_failure"},
		{"reward_funcs: [{name: arithmetic}]\ntemperature: 0\n", "temperature 0 must be > 0"},
		{"reward_funcs: [{name: arithmetic}]\nbeta: -1\n", "beta -1 must be >= 0"},
	} {
		_, err := ParseConfig([]byte(base+tc.yaml), "grpo.yaml", MethodGRPO, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one naming %q", tc.yaml, err, tc.want)
		}
	}
	if _, err := ParseConfig([]byte(base+"reward_funcs: [{name: arithmetic}]\n"), "sft.yaml", MethodSFT, nil); err == nil || !strings.Contains(err.Error(), "reward_funcs") {
		t.Errorf("sft with reward_funcs: %v", err)
	}
}

// TestGRPOWithLoRA runs GRPO steps on LoRA adapters with a KL term: the reference is the base
// with the adapters off (no second model), the KL is 0 before the first update and positive
// after, and the base stays frozen.
func TestGRPOWithLoRA(t *testing.T) {
	tr := newTrainer(t, grpoConfig(t, `[{name: format, pattern: '\d'}]`, "--use_peft=true", "--lora_r=4", "--beta=0.04"))
	if tr.obj.(*grpo).ref != nil {
		t.Fatal("a reference model was built under LoRA")
	}
	base0, _ := tr.model.ParamFloat32("model.layers.0.self_attn.q_proj.weight")
	var kls []float64
	for range 3 {
		m, err := tr.Step(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		kls = append(kls, m.Method["kl"])
	}
	if math.Abs(kls[0]) > 1e-6 || kls[2] <= 0 {
		t.Errorf("kl per step %v: want 0 at the start, > 0 after updates", kls)
	}
	base1, _ := tr.model.ParamFloat32("model.layers.0.self_attn.q_proj.weight")
	if fmt.Sprint(base0) != fmt.Sprint(base1) {
		t.Error("GRPO under LoRA changed the frozen base")
	}
	if !tr.model.AdaptersEnabled() {
		t.Error("the adapters stayed off after the reference log-probs")
	}
}
