package server

import (
	"context"
	"errors"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect/v2"

	"github.com/halo-shell/halo-shell/engine/train"
	"github.com/halo-shell/halo-shell/session"
	halov1 "github.com/halo-shell/halo-shell/session/proto/halo/v1"
)

// Tests of the reward protocol (Rollouts out, SubmitRewards back) against real clients. They
// call the engine's reward function directly, as a GRPO step does on the engine goroutine.

func testRollouts(n int) []train.Rollout {
	rs := make([]train.Rollout, n)
	for i := range rs {
		rs[i] = train.Rollout{Prompt: "p", Completion: strings.Repeat("x", i), Answer: "2", Group: i / 2, Step: 3}
	}
	return rs
}

// scoring runs ScoreRollouts of c with score in the background until the test ends, and
// collects the errors reported to the client.
type scoring struct {
	mu   sync.Mutex
	errs []error
	done chan error
}

func startScoring(t *testing.T, c *session.Client, score session.ScoreFunc) (*scoring, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sc := &scoring{done: make(chan error, 1)}
	go func() {
		sc.done <- c.ScoreRollouts(ctx, score, func(_ int64, err error) {
			sc.mu.Lock()
			sc.errs = append(sc.errs, err)
			sc.mu.Unlock()
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-sc.done
	})
	return sc, cancel
}

func (s *scoring) reported() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.errs...)
}

// waitScorer waits until the session has a scorer attached.
func waitScorer(t *testing.T, s *testServer) {
	waitFor(t, "the scorer to attach", func() bool {
		h := s.eng.rewards
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.cur != nil
	})
}

// TestClientRewardsRoundTrip checks that the scorer receives the rollouts with their fields
// and the step, and that its rewards (NaN included) come back in order.
func TestClientRewardsRoundTrip(t *testing.T) {
	s := startServer(t, Options{})
	c := dial(t, s.Socket(), "notebook")
	var got *session.RolloutBatch
	startScoring(t, c, func(_ context.Context, b *session.RolloutBatch) ([]float64, error) {
		got = b
		out := make([]float64, len(b.Rollouts))
		for i, r := range b.Rollouts {
			out[i] = float64(len(r.Completion))
		}
		out[1] = math.NaN()
		return out, nil
	})
	waitScorer(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := s.eng.rewards.Rewards(ctx, testRollouts(4))
	if err != nil {
		t.Fatal(err)
	}
	if len(v) != 4 || v[0] != 0 || !math.IsNaN(v[1]) || v[3] != 3 {
		t.Errorf("rewards %v, want [0 NaN 2 3]", v)
	}
	if got.Step != 3 || got.Rollouts[2].Group != 1 || got.Rollouts[0].Answer != "2" || got.TimeoutS <= 0 || got.TimeoutS > 10 {
		t.Errorf("batch as received: step %d, group %d, answer %q, timeout %v", got.Step, got.Rollouts[2].Group, got.Rollouts[0].Answer, got.TimeoutS)
	}
}

// TestClientRewardWithoutScorer checks the immediate error when no client scores.
func TestClientRewardWithoutScorer(t *testing.T) {
	s := startServer(t, Options{})
	_, err := s.eng.rewards.Rewards(context.Background(), testRollouts(2))
	if !errors.Is(err, train.ErrNoClientReward) {
		t.Fatalf("error %v, want ErrNoClientReward", err)
	}
}

// TestClientRewardNeverAnswers checks that a scorer that never answers costs the step its
// timeout and an error, and that its late answer is refused and reported in the client.
func TestClientRewardNeverAnswers(t *testing.T) {
	s := startServer(t, Options{})
	c := dial(t, s.Socket(), "slow notebook")
	release := make(chan struct{})
	sc, _ := startScoring(t, c, func(context.Context, *session.RolloutBatch) ([]float64, error) {
		<-release // ignores its context: answers only when released
		return []float64{1, 1}, nil
	})
	waitScorer(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.eng.rewards.Rewards(ctx, testRollouts(2))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want the deadline", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("returned after %v, the timeout was 200ms", el)
	}
	close(release)
	waitFor(t, "the late answer to be refused", func() bool { return len(sc.reported()) > 0 })
	if err := sc.reported()[0]; connect.CodeOf(errors.Unwrap(err)) != connect.CodeNotFound || !strings.Contains(err.Error(), "timed out") {
		t.Errorf("late answer: %v, want not_found naming the timeout", err)
	}
}

// TestClientRewardGarbage checks answers that cannot be used: a failing or panicking reward
// function, the wrong number of rewards, infinite rewards, an unknown batch id, both rewards
// and an error, and bytes that are no message at all. Each gives an error, and the session
// keeps serving.
func TestClientRewardGarbage(t *testing.T) {
	s := startServer(t, Options{})
	c := dial(t, s.Socket(), "buggy notebook")
	calls := 0
	sc, _ := startScoring(t, c, func(_ context.Context, b *session.RolloutBatch) ([]float64, error) {
		calls++
		switch calls {
		case 1:
			return nil, errors.New("KeyError: 'answer'")
		case 2:
			panic("index out of range")
		case 3:
			return []float64{1}, nil
		default:
			return []float64{1, math.Inf(-1), 0}, nil
		}
	})
	waitScorer(t, s)
	for i, want := range []string{"the client's reward function failed: KeyError: 'answer'", "panicked: index out of range",
		"returned 1 rewards for 3 rollouts", "-Inf for rollout 1"} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := s.eng.rewards.Rewards(ctx, testRollouts(3))
		cancel()
		mustContain(t, err, want)
		if n := len(sc.reported()); n != i+1 {
			t.Errorf("after answer %d the client reported %d errors", i+1, n)
		}
	}

	ctx := ctxT(t)
	for _, tc := range []struct {
		req  *halov1.SubmitRewardsRequest
		code connect.Code
	}{
		{&halov1.SubmitRewardsRequest{Id: 999, Rewards: []float64{1}}, connect.CodeNotFound},
		{&halov1.SubmitRewardsRequest{Id: 1, Rewards: []float64{math.Inf(1)}}, connect.CodeInvalidArgument},
		{&halov1.SubmitRewardsRequest{Id: 1, Rewards: []float64{1}, Error: "x"}, connect.CodeInvalidArgument},
	} {
		if err := c.SubmitRewards(ctx, tc.req); connect.CodeOf(err) != tc.code {
			t.Errorf("%v: error %v, want code %v", tc.req, err, tc.code)
		}
	}
	raw := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", s.Socket())
	}}}
	req, _ := http.NewRequest("POST", "http://session/halo.v1.SessionService/SubmitRewards", strings.NewReader("\xff\xff garbage"))
	req.Header.Set("Content-Type", "application/proto")
	req.Header.Set(session.HeaderClientID, c.ID())
	resp, err := raw.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		t.Errorf("garbage bytes answered 200")
	}
	if st := status(t, c); st == nil {
		t.Fatal("the session stopped answering")
	}
}

// TestClientRewardDisconnects checks that a scorer that goes away while a batch waits fails
// the batch at once, not at its timeout: a client that cancels its stream, and a client
// process that is SIGKILLed while its reward function runs.
func TestClientRewardDisconnects(t *testing.T) {
	s := startServer(t, Options{})
	c := dial(t, s.Socket(), "leaving notebook")
	entered := make(chan struct{}, 1)
	_, stop := startScoring(t, c, func(ctx context.Context, _ *session.RolloutBatch) ([]float64, error) {
		entered <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	waitScorer(t, s)
	go func() {
		<-entered
		stop()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err := s.eng.rewards.Rewards(ctx, testRollouts(2))
	mustContain(t, err, "stopped scoring")
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("took %v: the disconnect was not noticed", el)
	}

	// Control passes to the helper process once c lets go.
	if err := c.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	cmd, _ := startHelper(t, "score-and-hang", s.Socket(), "")
	waitScorer(t, s)
	errc := make(chan error, 1)
	go func() {
		_, err := s.eng.rewards.Rewards(ctx, testRollouts(2))
		errc <- err
	}()
	waitFor(t, "the batch to reach the helper", func() bool {
		h := s.eng.rewards
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.pending) == 1
	})
	time.Sleep(50 * time.Millisecond)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	select {
	case err := <-errc:
		mustContain(t, err, "stopped scoring")
	case <-time.After(20 * time.Second):
		t.Fatal("a killed scorer was not noticed within 20s")
	}
	if st := status(t, dial(t, s.Socket(), "after")); st == nil {
		t.Fatal("no status")
	}
}

// TestSecondScorerReplacesFirst checks that a new Rollouts stream takes the batches and the
// old one ends with an error that says so.
func TestSecondScorerReplacesFirst(t *testing.T) {
	s := startServer(t, Options{})
	c := dial(t, s.Socket(), "notebook")
	first, _ := startScoring(t, c, func(context.Context, *session.RolloutBatch) ([]float64, error) { return []float64{1}, nil })
	waitScorer(t, s)
	startScoring(t, c, func(context.Context, *session.RolloutBatch) ([]float64, error) { return []float64{2}, nil })
	select {
	case err := <-first.done:
		mustContain(t, err, "replaced")
		first.done <- err // for the cleanup
	case <-time.After(20 * time.Second):
		t.Fatal("the first scorer did not end")
	}
	v, err := s.eng.rewards.Rewards(ctxT(t), testRollouts(1))
	if err != nil || v[0] != 2 {
		t.Fatalf("rewards %v, %v: want the second scorer's 2", v, err)
	}
}
