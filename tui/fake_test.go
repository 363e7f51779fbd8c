package tui

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/halo-shell/halo-shell/session"
	halov1 "github.com/halo-shell/halo-shell/session/proto/halo/v1"
)

// fakeSession answers the dashboard's calls from fixed data and records the control calls, so
// that the model's logic is tested without a live session (the live one is tested in
// live_test.go and e2e_test.go).
type fakeSession struct {
	id     string
	events chan *session.Event
	status *session.StatusResponse

	mu    sync.Mutex
	calls []string
	// refuse, when set, is the error every control call returns.
	refuse error
	// hold, when set, holds every control call until it is closed.
	hold chan struct{}
	// profile is what Profile returns.
	profile *session.ProfileResponse
	// endErr is why the current event stream ended; streamErr, when set, fails Events.
	endErr, streamErr error
	subscriptions     int
	history           int // what the last subscription asked for
}

func newFake(status *session.StatusResponse) *fakeSession {
	return &fakeSession{id: "tui-client", events: make(chan *session.Event), status: status}
}

func (f *fakeSession) record(call string) error {
	f.mu.Lock()
	f.calls = append(f.calls, call)
	refuse, hold := f.refuse, f.hold
	f.mu.Unlock()
	if hold != nil {
		<-hold
	}
	return refuse
}

func (f *fakeSession) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *fakeSession) ID() string { return f.id }

func (f *fakeSession) Status(context.Context) (*session.StatusResponse, error) {
	if f.status == nil {
		return nil, errors.New("unavailable: no session")
	}
	return f.status, nil
}

func (f *fakeSession) EventsWithHistory(_ context.Context, _, history int) (<-chan *session.Event, func() error, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.subscriptions++
	f.history = history
	if f.streamErr != nil {
		return nil, nil, f.streamErr
	}
	return f.events, func() error { return f.endErr }, nil
}

// endStream closes the event stream with err and offers a new one, failing subscription with
// subErr until reopen.
func (f *fakeSession) endStream(err, subErr error) {
	f.mu.Lock()
	f.endErr, f.streamErr = err, subErr
	old := f.events
	f.events = make(chan *session.Event)
	f.mu.Unlock()
	close(old)
}

// reopen lets subscriptions succeed again.
func (f *fakeSession) reopen() {
	f.mu.Lock()
	f.streamErr = nil
	f.mu.Unlock()
}

func (f *fakeSession) stream() chan *session.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.events
}

func (f *fakeSession) Subscriptions() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.subscriptions
}

func (f *fakeSession) withState(s session.State) *session.StatusResponse {
	st := proto.Clone(f.status).(*session.StatusResponse)
	st.State = s
	st.Controller = f.id
	return st
}

func (f *fakeSession) Run(context.Context, int) (*session.StatusResponse, error) {
	if err := f.record("run"); err != nil {
		return nil, err
	}
	return f.withState(session.StateRunning), nil
}

func (f *fakeSession) Pause(context.Context) (*session.StatusResponse, error) {
	if err := f.record("pause"); err != nil {
		return nil, err
	}
	return f.withState(session.StatePaused), nil
}

func (f *fakeSession) Resume(context.Context) (*session.StatusResponse, error) {
	if err := f.record("resume"); err != nil {
		return nil, err
	}
	return f.withState(session.StateRunning), nil
}

func (f *fakeSession) Step(_ context.Context, n int) ([]*session.StepMetrics, error) {
	if err := f.record("step"); err != nil {
		return nil, err
	}
	next := f.status.Step + 1
	return []*session.StepMetrics{metricsAt(next)}, nil
}

func (f *fakeSession) Profile(_ context.Context, k int, _ bool) (*session.ProfileResponse, error) {
	if err := f.record("profile"); err != nil {
		return nil, err
	}
	return f.profile, nil
}

func (f *fakeSession) TakeOver(context.Context) (string, error) {
	if err := f.record("take-over"); err != nil {
		return "", err
	}
	return "other", nil
}

func (f *fakeSession) Release(context.Context) error { return f.record("release") }

// t0 is the time of the scripted events.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func at(sec int) int64 { return t0.Add(time.Duration(sec) * time.Second).UnixMilli() }

// metricsAt are the scripted metrics of step s: a decaying loss, a warmup-then-cosine lr.
func metricsAt(s int64) *session.StepMetrics {
	lr := 3e-3
	if s < 5 {
		lr = 3e-3 * float64(s) / 5
	} else {
		lr = 3e-3 * 0.5 * (1 + math.Cos(math.Pi*float64(s-5)/100))
	}
	return &session.StepMetrics{Step: s, Loss: 2.5*math.Exp(-float64(s)/8) + 0.7 + 0.05*math.Sin(float64(s)), GradNorm: 1.5 / math.Sqrt(float64(s)),
		Lr: lr, Tokens: 128 * s, TokensPerS: 2150 + 10*float64(s%3), Targets: 100 * s, StepTimeS: 0.0595,
		ModelFlops: 2.4e13, Tflops: 403.4,
		Memory: []*halov1.DeviceMemory{
			{Device: "cuda:0", AllocatedBytes: 21 << 30, ReservedBytes: 24 << 30, PeakBytes: 23 << 30, TotalBytes: 140 << 30},
			{Device: "cuda:1", AllocatedBytes: 20 << 30, ReservedBytes: 24 << 30, PeakBytes: 22 << 30, TotalBytes: 140 << 30},
		},
		AuxLoss: &aux,
		ExpertLoad: []*halov1.ExpertLoad{
			{Layer: 0, Tokens: []int64{70, 60, 66, 60}, Max: 70, Min: 60, Cv: 0.061, Dead: 0},
			{Layer: 1, Tokens: []int64{150, 90, 16, 0}, Max: 150, Min: 0, Cv: 1.05, Dead: 1},
		}}
}

// aux is the scripted MoE load-balancing loss.
var aux = 1.0312

// stepProfile is a scripted breakdown of a MoE step s on two devices: compute by class (the
// MoE layer's router, permute, expert GEMM and combine among them), three collective kinds and
// host time, adding up to the step time, with its ops and host syncs.
func stepProfile(s int64) *session.StepProfile {
	p := &session.StepProfile{Step: s, StepS: 0.060,
		ComputeS: map[string]float64{"matmul": 0.015, "expert_gemm": 0.008, "router": 0.002, "permute": 0.001, "combine": 0.001,
			"attention": 0.009, "norm": 0.003, "optimizer": 0.004, "loss": 0.002},
		CommS: map[string]float64{"all_to_all_dispatch": 0.004, "all_to_all_combine": 0.003, "all_reduce": 0.002},
		HostS: 0.006, Ops: 900, Syncs: 14, Flops: 1.2e9, Bytes: 3e8, Metrics: metricsAt(s)}
	return p
}

// script is a session's events from attaching to step 20 of a run with a profile of step 20.
func script() []*session.Event {
	evs := []*session.Event{
		{Seq: 1, UnixMs: at(0), Kind: &halov1.Event_State{State: &halov1.StateEvent{State: session.StateIdle, Step: 0, Controller: "repl-client", Reason: "attached"}}},
		{Seq: 2, UnixMs: at(1), Kind: &halov1.Event_Log{Log: &halov1.LogEvent{Level: "info", Message: "model: qwen3, 2 layers, hidden 32: 0.13M parameters (f32) on cpu"}}},
		{Seq: 3, UnixMs: at(2), Kind: &halov1.Event_Log{Log: &halov1.LogEvent{Level: "info", Message: "running to step 1000"}}},
		{Seq: 4, UnixMs: at(2), Kind: &halov1.Event_State{State: &halov1.StateEvent{State: session.StateRunning, Reason: "running"}}},
	}
	seq := int64(5)
	for s := int64(1); s <= 20; s++ {
		evs = append(evs, &session.Event{Seq: seq, UnixMs: at(2 + int(s)), Kind: &halov1.Event_Metrics{Metrics: metricsAt(s)}})
		seq++
		if s == 12 {
			evs = append(evs, &session.Event{Seq: seq, UnixMs: at(2 + int(s)), Kind: &halov1.Event_Log{Log: &halov1.LogEvent{Level: "warn", Message: "gradient norm 9.1 clipped to 1.0"}}})
			seq++
		}
	}
	evs = append(evs, &session.Event{Seq: seq, UnixMs: at(23), Kind: &halov1.Event_Profile{Profile: stepProfile(20)}})
	return evs
}

// statusAfterScript is the session's status at the end of script().
func statusAfterScript() *session.StatusResponse {
	return &session.StatusResponse{Name: "default", State: session.StateRunning, Step: 20, TotalSteps: 1000, Controller: "repl-client",
		Device: "cpu", Clients: []*halov1.ClientInfo{{Id: "repl-client", Name: "repl", Controller: true}, {Id: "tui-client", Name: "tui"}}}
}
