package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/session"
)

// GRPO in a live session with the reward function in the controlling client: the real
// trainer steps on the engine goroutine and asks the client for rewards.

// grpoYAML is the tiny GRPO run of these tests: one-token completions, rewards from the client.
func grpoYAML(t *testing.T, extra string) string {
	return fmt.Sprintf(`init:
  arch: qwen3
  preset: tiny
  overrides: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, tie_word_embeddings: true}
tokenizer_name_or_path: ../../examples/quickstart/tokenizer
dataset:
  synthetic: {kind: arithmetic, seed: 1, max_operand: 20, train: 64, eval: 8}
max_length: 32
per_device_train_batch_size: 8
gradient_accumulation_steps: 1
num_generations: 4
max_completion_length: 2
reward_funcs: [{name: client}]
reward_timeout: 1
reward_retries: 0
learning_rate: 1e-2
max_steps: 100
seed: 7
save_steps: 0
output_dir: %s
device: cpu
%s`, t.TempDir(), extra)
}

func loadGRPO(t *testing.T, extra string) (*testServer, *session.Client) {
	t.Helper()
	s := startServer(t, Options{})
	c := dial(t, s.Socket(), "notebook")
	if _, err := c.LoadYAML(ctxT(t), grpoYAML(t, extra), "grpo"); err != nil {
		t.Fatal(err)
	}
	return s, c
}

var digit = regexp.MustCompile(`^\d`)

// TestGRPOStepsScoredByClient runs GRPO steps whose rewards come from the client and checks
// that the step metrics carry them (rewards/client/mean, reward) over the RPC.
func TestGRPOStepsScoredByClient(t *testing.T) {
	s, c := loadGRPO(t, "")
	batches := 0
	startScoring(t, c, func(_ context.Context, b *session.RolloutBatch) ([]float64, error) {
		batches++
		out := make([]float64, len(b.Rollouts))
		for i, r := range b.Rollouts {
			if digit.MatchString(r.Completion) {
				out[i] = 1
			}
		}
		return out, nil
	})
	waitScorer(t, s)
	ms, err := c.Step(ctxT(t), 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 3 || batches != 3 {
		t.Fatalf("%d steps, %d batches scored", len(ms), batches)
	}
	for _, m := range ms {
		if _, ok := m.Method["rewards/client/mean"]; !ok {
			t.Fatalf("step %d metrics carry no rewards/client/mean: %v", m.Step, m.Method)
		}
		if v := m.Method["completions/mean_length"]; v < 1 || v > 2 {
			t.Errorf("step %d: completions/mean_length %v", m.Step, v)
		}
	}
}

// TestGRPOClientThatNeverAnswers checks that a step whose scorer never answers fails after
// reward_timeout with an error that says so, leaves the session idle and usable, and that the
// step then runs once a working scorer attaches.
func TestGRPOClientThatNeverAnswers(t *testing.T) {
	s, c := loadGRPO(t, "")
	release := make(chan struct{})
	defer close(release)
	_, stop := startScoring(t, c, func(context.Context, *session.RolloutBatch) ([]float64, error) {
		<-release
		return nil, errors.New("released")
	})
	waitScorer(t, s)
	start := time.Now()
	_, err := c.Step(ctxT(t), 1)
	mustContain(t, err, "reward function client failed", "timed out", "reward_timeout")
	if el := time.Since(start); el > 20*time.Second {
		t.Errorf("the step took %v with a 1 s reward timeout", el)
	}
	if st := status(t, c); st.State != session.StateIdle || st.Step != 0 {
		t.Errorf("after the failed step: state %v at step %d, want idle at 0", st.State, st.Step)
	}
	stop()
	waitFor(t, "the hanging scorer to go", func() bool {
		h := s.eng.rewards
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.cur == nil
	})
	startScoring(t, c, func(_ context.Context, b *session.RolloutBatch) ([]float64, error) {
		return make([]float64, len(b.Rollouts)), nil
	})
	waitScorer(t, s)
	if ms, err := c.Step(ctxT(t), 1); err != nil || len(ms) != 1 || ms[0].Step != 1 {
		t.Fatalf("the step after a working scorer attached: %v, %v", ms, err)
	}
}

// TestGRPOClientGarbageAndDisconnect checks a scorer that answers garbage (wrong count, NaN
// for every rollout is allowed, infinite values are not) and one that disconnects while a
// step waits: each step fails with its reason, and with reward_failure skip the step is
// skipped instead.
func TestGRPOClientGarbageAndDisconnect(t *testing.T) {
	s, c := loadGRPO(t, "")
	_, stop := startScoring(t, c, func(_ context.Context, b *session.RolloutBatch) ([]float64, error) {
		return []float64{1, 2}, nil
	})
	waitScorer(t, s)
	_, err := c.Step(ctxT(t), 1)
	mustContain(t, err, "returned 2 rewards for 8 rollouts")
	stop()

	entered := make(chan struct{}, 1)
	_, stop = startScoring(t, c, func(ctx context.Context, _ *session.RolloutBatch) ([]float64, error) {
		entered <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	waitScorer(t, s)
	go func() { <-entered; stop() }()
	start := time.Now()
	_, err = c.Step(ctxT(t), 1)
	mustContain(t, err, "stopped scoring")
	if time.Since(start) > 20*time.Second {
		t.Error("the disconnect was not noticed before the timeout")
	}

	s2, c2 := loadGRPO(t, "reward_failure: skip\n")
	startScoring(t, c2, func(_ context.Context, b *session.RolloutBatch) ([]float64, error) {
		out := make([]float64, len(b.Rollouts))
		out[0] = math.Inf(1)
		return out, nil
	})
	waitScorer(t, s2)
	ms, err := c2.Step(ctxT(t), 2)
	if err != nil || len(ms) != 2 || ms[0].Method["skipped"] != 1 {
		t.Fatalf("skip policy: %v, %v", ms, err)
	}
	if st := status(t, c2); st.Step != 2 {
		t.Errorf("skipped steps count as steps: at %d, want 2", st.Step)
	}
}
