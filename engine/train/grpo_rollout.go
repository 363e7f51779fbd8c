package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/models"
)

// Rollouts of GRPO: a step's prompts are sampled num_generations times each with the policy
// (models.GenerateBatch, all completions of the step in one batch), decoded, scored by every
// reward function, and laid out as micro-batches of (prompt, completion) documents whose
// targets are the completion tokens.

// grpoPrompt is one prompt of the dataset.
type grpoPrompt struct {
	ids      []int32
	text     string // the prompt as the model sees it (template applied)
	question string
	answer   string
}

// grpoSample is one completion of a step.
type grpoSample struct {
	group     int     // the prompt's index within the step
	prompt    []int32 // the prompt's tokens
	tokens    []int32 // the completion's tokens, its stop token included when it has one
	counted   int     // tokens counted in the loss: len(tokens), or 0 for a masked truncation
	truncated bool    // no stop token within max_completion_length
	reward    float64 // weighted sum over the reward functions
	perFunc   []float64
	adv       float64
	micro     int       // the micro-batch it is trained in
	offset    int       // position of its first completion token's prediction in the micro-batch
	old, ref  []float32 // log-probs of its tokens when sampled and under the reference (nil when not needed)
}

// grpoRollouts is one generation batch: the samples of a step, kept for num_iterations steps.
type grpoRollouts struct {
	samples  []grpoSample
	micro    []data.Batch // the micro-batches the samples are laid out in
	weights  []float64    // per sample: w_t of its tokens
	genTime  time.Duration
	rewTime  time.Duration
	groupStd []float64
	funcs    []string
	metrics  map[string]float64 // the rollout metrics (rewards, lengths) logged with every step trained on it
	used     int                // steps trained on these rollouts so far
}

// sampleOptions are the decoding settings of rollouts.
type sampleOptions struct {
	G                int
	MaxCompletionLen int
	Temperature      float64
	TopP             float64
	TopK             int
	MaskTruncated    bool
}

// generateRollouts samples G completions of every prompt in one batch; stop are the
// tokenizer's stop ids. seed fixes the samples (row r of the batch has its own stream).
func generateRollouts(m *models.Model, prompts []grpoPrompt, o sampleOptions, stop []int32, seed uint64) ([]grpoSample, error) {
	rows := make([][]int32, 0, len(prompts)*o.G)
	for _, p := range prompts {
		for range o.G {
			rows = append(rows, p.ids)
		}
	}
	outs, err := m.GenerateBatch(rows, models.BatchGenerateOptions{GenerateOptions: models.GenerateOptions{
		MaxNewTokens: o.MaxCompletionLen, Temperature: o.Temperature, TopP: o.TopP, TopK: o.TopK,
		Seed: seed, StopIDs: stop,
	}})
	if err != nil {
		return nil, fmt.Errorf("train: grpo: generation: %w", err)
	}
	samples := make([]grpoSample, len(rows))
	for i, out := range outs {
		s := grpoSample{group: i / o.G, prompt: rows[i], tokens: out}
		s.truncated = len(out) == 0 || !slices.Contains(stop, out[len(out)-1])
		s.counted = len(out)
		if s.truncated && o.MaskTruncated {
			s.counted = 0
		}
		samples[i] = s
	}
	return samples, nil
}

// completionText decodes a sample's completion without its stop token.
func completionText(tok *textCodec, s grpoSample) string {
	ids := s.tokens
	if !s.truncated {
		ids = ids[:len(ids)-1]
	}
	return tok.decode(ids)
}

// rewardRunner calls the reward functions of a run with their timeout and failure policy.
type rewardRunner struct {
	funcs   []RewardFunc
	weights []float64
	timeout time.Duration // per call; 0 = none
	retries int           // further attempts after a failed call
}

// score returns, per rollout, the weighted sum of the functions' rewards (NaN rewards left out,
// as TRL's nansum; a rollout no function rewards gets 0) and each function's rewards. A
// function that fails, times out or returns the wrong number of values is called again up
// to retries more times; then the error names it and what went wrong.
func (rr rewardRunner) score(ctx context.Context, rs []Rollout) (sum []float64, perFunc [][]float64, err error) {
	perFunc = make([][]float64, len(rr.funcs))
	for k, f := range rr.funcs {
		var lastErr error
		for attempt := 0; attempt <= rr.retries; attempt++ {
			if err := ctx.Err(); err != nil {
				return nil, nil, err
			}
			v, err := rr.call(ctx, f, rs)
			if err == nil {
				perFunc[k] = v
				lastErr = nil
				break
			}
			lastErr = err
			if errors.Is(err, ErrNoClientReward) {
				break // asking again cannot help
			}
		}
		if lastErr != nil {
			return nil, nil, fmt.Errorf("train: grpo: reward function %s failed after %d attempts: %w", f.Name(), rr.retries+1, lastErr)
		}
	}
	sum = make([]float64, len(rs))
	for i := range rs {
		for k := range rr.funcs {
			if v := perFunc[k][i]; !math.IsNaN(v) {
				sum[i] += rr.weights[k] * v
			}
		}
	}
	return sum, perFunc, nil
}

// errRewardTimeout is the cause of a reward call cancelled by its timeout.
var errRewardTimeout = errors.New("reward function timed out")

func (rr rewardRunner) call(ctx context.Context, f RewardFunc, rs []Rollout) ([]float64, error) {
	if rr.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, rr.timeout, fmt.Errorf("%w after %v (reward_timeout)", errRewardTimeout, rr.timeout))
		defer cancel()
	}
	v, err := f.Rewards(ctx, rs)
	if err == nil && ctx.Err() != nil {
		err = context.Cause(ctx)
	}
	if err != nil {
		if c := context.Cause(ctx); c != nil && errors.Is(c, errRewardTimeout) {
			return nil, c
		}
		return nil, err
	}
	if len(v) != len(rs) {
		return nil, fmt.Errorf("returned %d rewards for %d rollouts", len(v), len(rs))
	}
	for i, x := range v {
		if math.IsInf(x, 0) {
			return nil, fmt.Errorf("reward %d is %v (rewards must be finite, or NaN for none)", i, x)
		}
	}
	return v, nil
}

// layoutMicroBatches packs samples, perMicro at a time in order, into micro-batches of
// (prompt, completion) documents: targets are the completion tokens (the prompt's last token
// predicts the first), everything else ignored. It sets each sample's micro and offset.
func layoutMicroBatches(samples []grpoSample, perMicro int) []data.Batch {
	var out []data.Batch
	for lo := 0; lo < len(samples); lo += perMicro {
		var b data.Batch
		b.DocStarts = []int32{0}
		for i := lo; i < min(lo+perMicro, len(samples)); i++ {
			s := &samples[i]
			s.micro, s.offset = len(out), len(b.Tokens)+len(s.prompt)-1
			doc := append(slices.Clone(s.prompt), s.tokens...)
			for j, id := range doc {
				b.Tokens = append(b.Tokens, id)
				b.Positions = append(b.Positions, int32(j))
				tg := int32(data.IgnoreIndex)
				if j+1 < len(doc) && j+1 >= len(s.prompt) {
					tg = doc[j+1]
				}
				b.Targets = append(b.Targets, tg)
			}
			b.DocStarts = append(b.DocStarts, int32(len(b.Tokens)))
		}
		out = append(out, b)
	}
	return out
}

// rolloutMetrics are the step metrics of a generation batch under TRL's names: the reward's
// mean and the mean of the groups' standard deviations, each function's mean and standard
// deviation, the fraction of groups whose rewards are all equal (they carry no signal), and
// the completion lengths.
func rolloutMetrics(samples []grpoSample, perFunc [][]float64, names []string, groupStd []float64) map[string]float64 {
	ms := map[string]float64{}
	rewards := make([]float64, len(samples))
	for i, s := range samples {
		rewards[i] = s.reward
	}
	ms["reward"], _ = meanStd(rewards)
	zero := 0
	for _, s := range groupStd {
		ms["reward_std"] += s / float64(len(groupStd))
		if s == 0 {
			zero++
		}
	}
	ms["frac_reward_zero_std"] = float64(zero) / float64(len(groupStd))
	for k, name := range names {
		var vals []float64
		for _, v := range perFunc[k] {
			if !math.IsNaN(v) {
				vals = append(vals, v)
			}
		}
		if len(vals) > 0 {
			m, s := meanStd(vals)
			ms["rewards/"+name+"/mean"], ms["rewards/"+name+"/std"] = m, s
		}
	}
	var total, terminated, nTerm, truncated int
	minL, maxL := math.MaxInt, 0
	for _, s := range samples {
		l := len(s.tokens)
		total += l
		minL, maxL = min(minL, l), max(maxL, l)
		if s.truncated {
			truncated++
		} else {
			terminated += l
			nTerm++
		}
	}
	n := float64(len(samples))
	ms["completions/mean_length"] = float64(total) / n
	ms["completions/min_length"] = float64(minL)
	ms["completions/max_length"] = float64(maxL)
	ms["completions/clipped_ratio"] = float64(truncated) / n
	if nTerm > 0 {
		ms["completions/mean_terminated_length"] = float64(terminated) / float64(nTerm)
	}
	return ms
}

// uniqueNames are reward function names made unique in order (format, format_2, ...), for
// the per-function metrics of a config that names one function twice.
func uniqueNames(funcs []RewardFunc) []string {
	seen := map[string]int{}
	out := make([]string, len(funcs))
	for i, f := range funcs {
		n := f.Name()
		seen[n]++
		if seen[n] > 1 {
			n = fmt.Sprintf("%s_%d", n, seen[n])
		}
		out[i] = strings.ReplaceAll(n, "/", "_")
	}
	return out
}
