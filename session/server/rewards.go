package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"connectrpc.com/connect/v2"

	"github.com/halo-shell/halo-shell/engine/train"
	halov1 "github.com/halo-shell/halo-shell/session/proto/halo/v1"
	"github.com/halo-shell/halo-shell/session/proto/halo/v1/halov1connect"
)

// Rewards scored by the controlling client.
//
// A GRPO config may name reward function "client": the trainer then calls rewardHub.Rewards
// (a train.RewardFunc) on the engine goroutine with the step's rollouts. The hub hands them as
// one RolloutBatch to the scorer, the client whose Rollouts stream is open, and waits for
// SubmitRewards with the batch's id, the trainer's timeout (ctx), or the scorer's end,
// whichever comes first; so a client that never answers, answers wrongly or disconnects costs
// at most the timeout and an error, and the engine goroutine never waits on a client beyond
// it. What a wrong answer is (a wrong count, an infinite value) the trainer decides; the hub
// checks only that the answer belongs to a waiting batch. Answers for a batch that no longer
// waits are refused with not_found, so the client can tell its user.

// maxRewardError bounds the client's error text kept in the trainer's error.
const maxRewardError = 2000

type rewardReply struct {
	rewards []float64
	err     error
}

// scorer is one open Rollouts stream.
type scorer struct {
	client  string
	batches chan *halov1.RolloutBatch // the handler sends them on the stream
	done    chan struct{}             // closed when the stream ends or is replaced
	once    sync.Once
	why     error // why done was closed (replaced or ended), set before closing
}

func (s *scorer) end(why error) {
	s.once.Do(func() {
		s.why = why
		close(s.done)
	})
}

type rewardHub struct {
	mu      sync.Mutex
	cur     *scorer
	changed chan struct{} // closed (and replaced) when a scorer attaches
	nextID  int64
	pending map[int64]chan rewardReply
}

func newRewardHub() *rewardHub {
	return &rewardHub{pending: map[int64]chan rewardReply{}, changed: make(chan struct{})}
}

// attachGrace is how long a batch waits for a scorer when none is attached, or when the one it
// chose is replaced before taking the batch: a client that sets a new reward function closes
// its Rollouts stream and opens the next, and a step in between must not fail for that.
const attachGrace = 2 * time.Second

// scorerFor returns the attached scorer, waiting up to the grace deadline for one to attach.
func (h *rewardHub) scorerFor(ctx context.Context, deadline time.Time) (*scorer, error) {
	for {
		h.mu.Lock()
		sc, ch := h.cur, h.changed
		h.mu.Unlock()
		if sc != nil {
			return sc, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, train.ErrNoClientReward
		}
		t := time.NewTimer(left)
		select {
		case <-ch:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		if ctx.Err() != nil {
			return nil, train.ErrNoClientReward
		}
	}
}

var _ train.RewardFunc = (*rewardHub)(nil)

// Name is the reward function's name in configs and metrics.
func (h *rewardHub) Name() string { return train.RewardClient }

var errScorerEnded = errors.New("its Rollouts stream ended (the client disconnected or stopped scoring)")

// Rewards sends rs to the scorer and waits for its answer.
func (h *rewardHub) Rewards(ctx context.Context, rs []train.Rollout) ([]float64, error) {
	grace := time.Now().Add(attachGrace)
	sc, err := h.scorerFor(ctx, grace)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.nextID++
	id := h.nextID
	reply := make(chan rewardReply, 1)
	h.pending[id] = reply
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.pending, id)
		h.mu.Unlock()
	}()
	b := &halov1.RolloutBatch{Id: id, Rollouts: make([]*halov1.Rollout, len(rs))}
	for i, r := range rs {
		b.Rollouts[i] = &halov1.Rollout{Prompt: r.Prompt, Question: r.Question, Completion: r.Completion,
			Answer: r.Answer, Group: int32(r.Group), Truncated: r.Truncated}
		b.Step = int64(r.Step)
	}
	if d, ok := ctx.Deadline(); ok {
		b.TimeoutS = max(0, time.Until(d).Seconds())
	}
	wait := func() error {
		if err := context.Cause(ctx); err != nil {
			return err
		}
		return ctx.Err()
	}
	for sent := false; !sent; {
		select {
		case sc.batches <- b:
			sent = true
		case <-sc.done:
			h.mu.Lock()
			replaced := h.cur != nil && h.cur != sc
			h.mu.Unlock()
			if !replaced || time.Now().After(grace) {
				return nil, fmt.Errorf("session: client %s stopped scoring rollouts: %w", sc.client, sc.why)
			}
			if sc, err = h.scorerFor(ctx, grace); err != nil {
				return nil, err
			}
		case <-ctx.Done():
			return nil, wait()
		}
	}
	select {
	case r := <-reply:
		return r.rewards, r.err
	case <-sc.done:
		return nil, fmt.Errorf("session: client %s stopped scoring rollouts before answering batch %d: %w", sc.client, id, sc.why)
	case <-ctx.Done():
		return nil, wait()
	}
}

// attach makes a new scorer for client, ending the previous one.
func (h *rewardHub) attach(client string) *scorer {
	sc := &scorer{client: client, batches: make(chan *halov1.RolloutBatch), done: make(chan struct{})}
	h.mu.Lock()
	old := h.cur
	h.cur = sc
	close(h.changed)
	h.changed = make(chan struct{})
	h.mu.Unlock()
	if old != nil {
		old.end(fmt.Errorf("replaced by a newer Rollouts stream of client %s", client))
	}
	return sc
}

// detach ends sc and forgets it if it is still the scorer.
func (h *rewardHub) detach(sc *scorer, why error) {
	h.mu.Lock()
	if h.cur == sc {
		h.cur = nil
	}
	h.mu.Unlock()
	sc.end(why)
}

// submit delivers an answer to the batch waiting for it.
func (h *rewardHub) submit(r *halov1.SubmitRewardsRequest) error {
	h.mu.Lock()
	reply, ok := h.pending[r.Id]
	if ok {
		delete(h.pending, r.Id)
	}
	h.mu.Unlock()
	if !ok {
		return connect.Errorf(connect.CodeNotFound, "session: no rollout batch %d is waiting for rewards: it was answered already, timed out (the config's reward_timeout), or its step ended", r.Id)
	}
	if r.Error != "" {
		msg := r.Error
		if len(msg) > maxRewardError {
			msg = msg[:maxRewardError] + "..."
		}
		reply <- rewardReply{err: fmt.Errorf("the client's reward function failed: %s", msg)}
		return nil
	}
	reply <- rewardReply{rewards: r.Rewards}
	return nil
}

// Rollouts streams the rollouts to score to the controlling client.
func (h *handler) Rollouts(ctx context.Context, _ *halov1.RolloutsRequest, st halov1connect.SessionServiceRolloutsServerStream) error {
	if err := h.s.requireControl(ctx); err != nil {
		return err
	}
	hub := h.s.eng.rewards
	sc := hub.attach(clientID(ctx))
	h.s.log.Info("client scores rollouts", "client", sc.client)
	for {
		select {
		case b := <-sc.batches:
			if err := st.Send(b); err != nil {
				hub.detach(sc, fmt.Errorf("sending batch %d: %v", b.Id, err))
				return err
			}
		case <-sc.done:
			return connect.Errorf(connect.CodeAborted, "session: %v", sc.why)
		case <-ctx.Done():
			hub.detach(sc, errScorerEnded)
			return nil
		case <-h.s.closed:
			hub.detach(sc, errors.New("the session is stopping"))
			return nil
		}
	}
}

// SubmitRewards answers a RolloutBatch.
func (h *handler) SubmitRewards(ctx context.Context, r *halov1.SubmitRewardsRequest) (*halov1.SubmitRewardsResponse, error) {
	if err := h.s.requireControl(ctx); err != nil {
		return nil, err
	}
	if len(r.Rewards) > 0 && r.Error != "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, "session: SubmitRewards carries rewards or an error, not both")
	}
	for i, v := range r.Rewards {
		if math.IsInf(v, 0) {
			// Refused here too, so the client hears it; the batch still waits for a good answer.
			return nil, connect.Errorf(connect.CodeInvalidArgument, "session: reward %d is %v: rewards must be finite, or NaN for none", i, v)
		}
	}
	if err := h.s.eng.rewards.submit(r); err != nil {
		return nil, err
	}
	return &halov1.SubmitRewardsResponse{}, nil
}
