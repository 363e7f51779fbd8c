package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	halov1 "github.com/halo-shell/halo-shell/session/proto/halo/v1"
)

// Rollout and RolloutBatch are GRPO's rollouts as the session sends them to its scorer.
type (
	Rollout      = halov1.Rollout
	RolloutBatch = halov1.RolloutBatch
)

// ScoreFunc scores one batch of rollouts: one reward per rollout, in order (NaN for none). ctx
// ends when the session stops waiting for this batch (its timeout) or scoring stops.
type ScoreFunc func(ctx context.Context, b *RolloutBatch) ([]float64, error)

// ScoreRollouts makes this client the session's reward scorer (a control call) and answers
// every RolloutBatch with score, one batch at a time, until ctx ends (then it returns nil) or
// the stream ends (another Rollouts stream replaced it, the session stopped or control was
// lost: the error says which). A score that fails or panics is sent to the session as the
// batch's error, which fails or skips that step as the run's config says, and passed to
// onErr (when set) with the batch's id; so are answers the session refuses (a batch that
// timed out before the answer came, a wrong value).
func (c *Client) ScoreRollouts(ctx context.Context, score ScoreFunc, onErr func(id int64, err error)) error {
	st, err := c.rpc.Rollouts(ctx, &halov1.RolloutsRequest{})
	if err != nil {
		return err
	}
	defer st.Close()
	report := func(id int64, err error) {
		if onErr != nil && err != nil {
			onErr(id, err)
		}
	}
	for first := true; ; first = false {
		b, err := st.Receive()
		if first {
			c.holdLease(err)
		}
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("session: scoring rollouts: %w", err)
		}
		rewards, serr := scoreOne(ctx, score, b)
		req := &halov1.SubmitRewardsRequest{Id: b.Id}
		if serr != nil {
			req.Error = serr.Error()
			report(b.Id, serr)
		} else {
			req.Rewards = rewards
		}
		if _, err := c.rpc.SubmitRewards(ctx, req); err != nil {
			report(b.Id, fmt.Errorf("session: the session refused the rewards of batch %d: %w", b.Id, err))
		}
	}
}

// scoreOne runs score on one batch under the batch's timeout, turning a panic into an error
// and checking the number and values of the rewards.
func scoreOne(ctx context.Context, score ScoreFunc, b *RolloutBatch) (rewards []float64, err error) {
	if b.TimeoutS > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(b.TimeoutS*float64(time.Second)))
		defer cancel()
	}
	defer func() {
		if r := recover(); r != nil {
			rewards, err = nil, fmt.Errorf("reward function panicked: %v", r)
		}
	}()
	rewards, err = score(ctx, b)
	if err != nil {
		return nil, err
	}
	if len(rewards) != len(b.Rollouts) {
		return nil, fmt.Errorf("reward function returned %d rewards for %d rollouts", len(rewards), len(b.Rollouts))
	}
	for i, v := range rewards {
		if math.IsInf(v, 0) {
			return nil, fmt.Errorf("reward function returned %v for rollout %d (rewards must be finite, or NaN for none)", v, i)
		}
	}
	return rewards, nil
}

// SubmitRewardsRequest answers a RolloutBatch.
type SubmitRewardsRequest = halov1.SubmitRewardsRequest

// SubmitRewards answers a RolloutBatch by hand (ScoreRollouts does it for each batch): one
// reward per rollout, or the error of the reward function. The session refuses an id that no
// batch waits for (not_found) and infinite rewards (invalid_argument).
func (c *Client) SubmitRewards(ctx context.Context, req *SubmitRewardsRequest) error {
	_, err := c.rpc.SubmitRewards(ctx, req)
	return err
}
