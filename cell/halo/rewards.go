package halo

import (
	"context"
	"fmt"

	"github.com/halo-shell/halo-shell/session"
)

// Rollout is one sampled completion of a GRPO step, as a reward function written in a cell
// sees it.
type Rollout struct {
	Prompt     string // the prompt as the model saw it (chat template applied)
	Question   string // the last user message, or the record's prompt
	Completion string // the decoded completion, without its stop token
	Answer     string // the dataset's reference completion ("" when none)
	Group      int    // the prompt's index within the step: a group shares a prompt
	Truncated  bool   // no stop token within max_completion_length
	Step       int    // the optimizer step being prepared
}

// SetReward makes fn the reward function of the attached session's GRPO runs whose config
// names reward function "client" (reward_funcs: [{name: client}]), and returns at once: from
// now on, in the background, this client answers every batch of rollouts the session sends
// with fn applied to each rollout, until SetReward is called again, ClearReward, or the
// interpreter ends. It takes control of the session. A panic in fn, or a run past the
// config's reward_timeout, is reported to the session, which retries or skips the step as
// the config says, and printed here (RewardErrors lists them).
func SetReward(fn func(r Rollout) float64) string {
	if fn == nil {
		fail("halo.SetReward", fmt.Errorf("fn is nil: use halo.ClearReward() to stop scoring"))
	}
	c, _, e := client("halo.SetReward")
	if err := c.Claim(e.Context()); err != nil {
		fail("halo.SetReward", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.SetScorer(cancel)
	score := func(ctx context.Context, b *session.RolloutBatch) ([]float64, error) {
		out := make([]float64, len(b.Rollouts))
		for i, r := range b.Rollouts {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("rollout %d of %d: %w (the config's reward_timeout was %.0f s)", i, len(b.Rollouts), err, b.TimeoutS)
			}
			out[i] = fn(Rollout{Prompt: r.Prompt, Question: r.Question, Completion: r.Completion, Answer: r.Answer,
				Group: int(r.Group), Truncated: r.Truncated, Step: int(b.Step)})
		}
		return out, nil
	}
	go func() {
		err := c.ScoreRollouts(ctx, score, func(id int64, err error) {
			e.RewardError(fmt.Sprintf("batch %d: %v", id, err))
		})
		if err != nil {
			e.RewardError(fmt.Sprintf("stopped scoring: %v", err))
		}
	}()
	return "reward function set: GRPO steps of " + c.Target() + " are scored here"
}

// ClearReward stops scoring rollouts (steps that need the client's rewards then fail with an
// error saying so).
func ClearReward() {
	env("halo.ClearReward").SetScorer(nil)
}

// RewardErrors returns the errors of the reward function set by SetReward, oldest first (the
// last 100).
func RewardErrors() []string {
	return env("halo.RewardErrors").RewardErrors()
}
