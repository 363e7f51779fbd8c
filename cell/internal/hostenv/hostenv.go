// Package hostenv holds the host-side state behind the interpreted halo API: the attached
// session client, the context of the evaluation in progress, where output and displays go, and
// the history of step metrics. The cell package configures it; the halo package reads it.
// Interpreted code never sees this package.
package hostenv

import (
	"context"
	"fmt"
	"io"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/halo-shell/halo-shell/session"
)

// Dialer attaches to a session by name or address.
type Dialer func(ctx context.Context, target string) (*session.Client, error)

// Env is the state of one interpreter's halo API. Its methods may be called from any goroutine.
type Env struct {
	mu      sync.Mutex
	dial    Dialer
	target  string
	client  *session.Client
	ctx     context.Context
	stdout  io.Writer
	display func(map[string][]byte)
	history []*session.StepMetrics // sorted by step, one entry per step
	stopEv  context.CancelFunc
	// scorer stops the background reward scorer; rewardErrs are its errors.
	scorer     context.CancelFunc
	rewardErrs []string
}

var current atomic.Pointer[Env]

// New returns an Env that attaches to target with dial on first use.
func New(dial Dialer, target string) *Env {
	return &Env{dial: dial, target: target, ctx: context.Background(), stdout: io.Discard}
}

// Activate makes e the Env that the halo API uses.
func Activate(e *Env) { current.Store(e) }

// Current returns the active Env (nil when none).
func Current() *Env { return current.Load() }

// SetEval sets the context, standard output and display sink of the evaluation that starts
// now; Eval ends with SetEval(context.Background(), io.Discard, nil).
func (e *Env) SetEval(ctx context.Context, stdout io.Writer, display func(map[string][]byte)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ctx, e.stdout, e.display = ctx, stdout, display
}

// Context is the context of the evaluation in progress (cancelled on interrupt).
func (e *Env) Context() context.Context {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ctx
}

// Stdout is where the API writes progress text during an evaluation.
func (e *Env) Stdout() io.Writer {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stdout
}

// Display sends a MIME bundle to the evaluation's display sink.
func (e *Env) Display(b map[string][]byte) {
	e.mu.Lock()
	d := e.display
	e.mu.Unlock()
	if d != nil {
		d(b)
	}
}

// Target names the session this Env attaches to.
func (e *Env) Target() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.target
}

// Attached reports whether a client is connected.
func (e *Env) Attached() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.client != nil
}

// Client returns the attached client, dialling the target on first use.
func (e *Env) Client() (*session.Client, error) {
	e.mu.Lock()
	c := e.client
	target, dial, ctx := e.target, e.dial, e.ctx
	e.mu.Unlock()
	if c != nil {
		return c, nil
	}
	if dial == nil {
		return nil, fmt.Errorf("no session attached: attach one with :attach NAME")
	}
	c, err := dial(ctx, target)
	if err != nil {
		return nil, fmt.Errorf("attaching to session %q: %w", target, err)
	}
	e.setClient(c, target)
	return c, nil
}

// Attach replaces the attached client with one for target (the history is cleared).
func (e *Env) Attach(ctx context.Context, target string) (*session.Client, error) {
	e.mu.Lock()
	dial := e.dial
	e.mu.Unlock()
	if dial == nil {
		return nil, fmt.Errorf("this interpreter cannot attach to sessions")
	}
	c, err := dial(ctx, target)
	if err != nil {
		return nil, fmt.Errorf("attaching to session %q: %w", target, err)
	}
	e.setClient(c, target)
	return c, nil
}

// SetClient attaches an existing client (the history is cleared).
func (e *Env) SetClient(c *session.Client, target string) { e.setClient(c, target) }

func (e *Env) setClient(c *session.Client, target string) {
	e.mu.Lock()
	old, stop := e.client, e.stopEv
	e.client, e.target, e.history, e.stopEv = c, target, nil, nil
	e.mu.Unlock()
	if stop != nil {
		stop()
	}
	if old != nil && old != c {
		old.Close()
	}
	e.watch(c)
}

// watch records the metrics of steps that run in the background (Run) in the history.
func (e *Env) watch(c *session.Client) {
	ctx, cancel := context.WithCancel(context.Background())
	ch, _, err := c.Events(ctx, 1024)
	if err != nil {
		cancel()
		return
	}
	e.mu.Lock()
	if e.client != c {
		e.mu.Unlock()
		cancel()
		return
	}
	e.stopEv = cancel
	e.mu.Unlock()
	go func() {
		for ev := range ch {
			if m := ev.GetMetrics(); m != nil {
				e.Record(c, m)
			} else if p := ev.GetProfile(); p != nil && p.Metrics != nil {
				e.Record(c, p.Metrics)
			}
		}
	}()
}

// Close stops watching events and closes the client.
func (e *Env) Close() {
	e.mu.Lock()
	c, stop, scorer := e.client, e.stopEv, e.scorer
	e.client, e.stopEv, e.scorer = nil, nil, nil
	e.mu.Unlock()
	if stop != nil {
		stop()
	}
	if scorer != nil {
		scorer()
	}
	if c != nil {
		c.Close()
	}
}

// Record adds step metrics from client c to the history (replacing an entry for the same
// step); metrics from a client that is no longer attached are ignored.
func (e *Env) Record(c *session.Client, ms ...*session.StepMetrics) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c != e.client {
		return
	}
	for _, m := range ms {
		if m == nil {
			continue
		}
		i := sort.Search(len(e.history), func(i int) bool { return e.history[i].Step >= m.Step })
		switch {
		case i < len(e.history) && e.history[i].Step == m.Step:
			e.history[i] = m
		default:
			e.history = append(e.history, nil)
			copy(e.history[i+1:], e.history[i:])
			e.history[i] = m
		}
	}
}

// History returns the recorded step metrics in step order.
func (e *Env) History() []*session.StepMetrics {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*session.StepMetrics(nil), e.history...)
}

// SetScorer records the cancel function of the background reward scorer (halo.SetReward),
// cancelling the previous one; nil just cancels. The scorer outlives evaluations: it runs
// until replaced, cleared or the Env is closed.
func (e *Env) SetScorer(cancel context.CancelFunc) {
	e.mu.Lock()
	old := e.scorer
	e.scorer = cancel
	e.mu.Unlock()
	if old != nil {
		old()
	}
}

// maxRewardErrors bounds the reward errors kept.
const maxRewardErrors = 100

// RewardError records an error of the background reward scorer and writes it to the
// output of the evaluation in progress, if any.
func (e *Env) RewardError(msg string) {
	e.mu.Lock()
	e.rewardErrs = append(e.rewardErrs, msg)
	if n := len(e.rewardErrs); n > maxRewardErrors {
		e.rewardErrs = e.rewardErrs[n-maxRewardErrors:]
	}
	w := e.stdout
	e.mu.Unlock()
	fmt.Fprintln(w, "reward function:", msg)
}

// RewardErrors returns the recorded reward errors, oldest first.
func (e *Env) RewardErrors() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.rewardErrs...)
}
