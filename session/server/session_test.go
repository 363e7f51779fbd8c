package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect/v2"

	"github.com/halo-shell/halo-shell/session"
	halov1 "github.com/halo-shell/halo-shell/session/proto/halo/v1"
)

func TestLoadStepPauseResume(t *testing.T) {
	s, c := loaded(t)
	ctx := ctxT(t)
	if st := status(t, c); st.State != session.StateIdle || st.Step != 0 || !strings.Contains(st.ConfigSummary, "qwen3") {
		t.Fatalf("after load: %v step %d summary %q", st.State, st.Step, st.ConfigSummary)
	}
	ms, err := c.Step(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 3 {
		t.Fatalf("Step(3) returned %d metrics", len(ms))
	}
	for i, m := range ms {
		if m.Step != int64(i+1) || !(m.Loss > 0) || m.Tokens == 0 || m.StepTimeS <= 0 {
			t.Fatalf("metrics %d: %v", i, m)
		}
		if len(m.Memory) != 1 || m.Memory[0].Device != "cpu" || m.Memory[0].AllocatedBytes <= 0 || m.Memory[0].PeakBytes < m.Memory[0].AllocatedBytes {
			t.Fatalf("metrics %d memory: %v", i, m.Memory)
		}
		if m.ModelFlops < 6*float64(m.Tokens) || m.Tflops <= 0 {
			t.Fatalf("metrics %d: model flops %g, %g TFLOP/s", i, m.ModelFlops, m.Tflops)
		}
	}
	if st := status(t, c); st.Step != 3 || st.State != session.StateIdle || st.LastMetrics.GetStep() != 3 {
		t.Fatalf("after Step(3): %v step %d", st.State, st.Step)
	}

	// Run in the background, pause at a step boundary, check nothing moves, resume.
	if _, err := c.Run(ctx, 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the run to pass step 5", func() bool { return status(t, c).Step >= 5 })
	st, err := c.Pause(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != session.StatePaused {
		t.Fatalf("after Pause: %v", st.State)
	}
	paused := st.Step
	time.Sleep(100 * time.Millisecond)
	if st := status(t, c); st.Step != paused || st.State != session.StatePaused {
		t.Fatalf("paused at %d but now %v at step %d", paused, st.State, st.Step)
	}
	if _, err := c.Step(ctx, 1); err == nil {
		// Step while paused is allowed: it runs in the foreground and the run stays paused.
		if st := status(t, c); st.Step != paused+1 || st.State != session.StatePaused {
			t.Fatalf("Step while paused: %v at step %d, want paused at %d", st.State, st.Step, paused+1)
		}
		paused++
	} else {
		t.Fatalf("Step while paused: %v", err)
	}
	if _, err := c.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the run to move after resume", func() bool { return status(t, c).Step > paused+2 })
	if _, err := c.Resume(ctx); err == nil {
		t.Fatal("Resume while running succeeded")
	} else if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("Resume while running: %v", err)
	}
	if _, err := c.Step(ctx, 1); connect.CodeOf(err) != connect.CodeFailedPrecondition || session.IsNotController(err) {
		t.Fatalf("Step while running: %v, want failed_precondition about the run", err)
	}
	if _, err := c.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	_ = s
}

func TestCommandsBeforeLoad(t *testing.T) {
	s := startServer(t, Options{})
	c := dial(t, s.Socket(), "early")
	ctx := ctxT(t)
	if st := status(t, c); st.State != session.StateEmpty {
		t.Fatalf("state %v before load", st.State)
	}
	_, err := c.Step(ctx, 1)
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("Step before Load: %v", err)
	}
	mustContain(t, err, "no model is loaded")
	_, err = c.LoadYAML(ctx, "learning_rate: [", "sft")
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("bad YAML: %v", err)
	}
	_, err = c.Load(ctx, "testdata/does-not-exist.yaml", "sft")
	mustContain(t, err, "does-not-exist.yaml")
	if st := status(t, c); st.State != session.StateEmpty {
		t.Fatalf("state %v after failed loads", st.State)
	}
}

func TestSetHyperTakesEffectNextStep(t *testing.T) {
	_, c := loaded(t)
	ctx := ctxT(t)
	ms, err := c.Step(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ms[0].Lr != 3e-3 {
		t.Fatalf("lr of step 1 = %g, want the config's 3e-3", ms[0].Lr)
	}
	h, err := c.SetLR(ctx, 1e-4)
	if err != nil {
		t.Fatal(err)
	}
	if h.LearningRate != 1e-4 {
		t.Fatalf("SetLR returned %v", h)
	}
	if g, _ := c.Hyper(ctx); g.LearningRate != 1e-4 {
		t.Fatalf("Hyper after SetLR: %v", g)
	}
	ms, err = c.Step(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ms[0].Lr != 1e-4 {
		t.Fatalf("lr of the step after SetLR = %g, want 1e-4", ms[0].Lr)
	}
	clip, accum := 0.5, int32(2)
	if _, err := c.SetHyper(ctx, &session.SetHyperRequest{MaxGradNorm: &clip, GradientAccumulationSteps: &accum}); err != nil {
		t.Fatal(err)
	}
	ms, err = c.Step(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	// A micro-batch holds at most 4 rows of 32 tokens: two of them hold more than one can.
	if ms[0].Tokens <= 4*32 {
		t.Fatalf("tokens with 2 accumulation steps = %d, want more than one micro-batch's 128", ms[0].Tokens)
	}
	bad := -1.0
	_, err = c.SetHyper(ctx, &session.SetHyperRequest{LearningRate: &bad})
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("negative lr: %v", err)
	}
	if g, _ := c.Hyper(ctx); g.LearningRate != 1e-4 || g.MaxGradNorm != 0.5 {
		t.Fatalf("a refused SetHyper changed the hyperparameters: %v", g)
	}
}

func TestControllerAndTakeOver(t *testing.T) {
	s, a := loaded(t)
	ctx := ctxT(t)
	b := dial(t, s.Socket(), "second")
	if _, err := b.Step(ctx, 1); !session.IsNotController(err) {
		t.Fatalf("second client's Step: %v, want failed_precondition", err)
	} else {
		mustContain(t, err, a.ID(), "controller", "observe, or to take control", ":takeover")
	}
	if err := b.Claim(ctx); !session.IsNotController(err) {
		t.Fatalf("second client's Claim: %v", err)
	} else if nc, _ := session.NotControllerOf(err); nc.Controller != a.ID() || nc.ControllerName != "controller" {
		t.Fatalf("NotController detail %v, want %s (controller)", nc, a.ID())
	}
	// Observers may read.
	if _, err := b.Status(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Inspect(ctx, &session.InspectRequest{}); err != nil {
		t.Fatal(err)
	}
	prev, err := b.TakeOver(ctx)
	if err != nil || prev != a.ID() {
		t.Fatalf("TakeOver: previous %q, %v; want %q", prev, err, a.ID())
	}
	if _, err := b.Step(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Step(ctx, 1); !session.IsNotController(err) {
		t.Fatalf("old controller's Step after take-over: %v", err)
	}
	st := status(t, a)
	if st.Controller != b.ID() {
		t.Fatalf("controller %q, want %q", st.Controller, b.ID())
	}
	found := false
	for _, cl := range st.Clients {
		if cl.Id == b.ID() && cl.Controller && cl.Name == "second" {
			found = true
		}
	}
	if !found {
		t.Fatalf("Status clients %v do not show %s as controller", st.Clients, b.ID())
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Step(ctx, 1); err != nil {
		t.Fatalf("Step after release: %v", err)
	}
}

func TestManyObservers(t *testing.T) {
	s, c := loaded(t)
	ctx := ctxT(t)
	const observers = 6
	type got struct {
		steps []int64
		err   error
	}
	results := make(chan got, observers)
	ready := make(chan struct{}, observers)
	for i := range observers {
		o := dial(t, s.Socket(), "observer")
		st, err := o.Subscribe(ctx, 64)
		if err != nil {
			t.Fatal(err)
		}
		go func(i int) {
			defer st.Close()
			var g got
			first := true
			for {
				ev, err := st.Recv()
				if err != nil {
					g.err = err
					results <- g
					return
				}
				if first {
					first = false
					if ev.GetState().GetReason() != "attached" {
						g.err = errors.New("first event is not the attached state")
					}
					ready <- struct{}{}
				}
				if m := ev.GetMetrics(); m != nil {
					g.steps = append(g.steps, m.Step)
					if m.Step == 5 {
						results <- g
						return
					}
				}
			}
		}(i)
	}
	for range observers {
		<-ready
	}
	if _, err := c.Step(ctx, 5); err != nil {
		t.Fatal(err)
	}
	for range observers {
		g := <-results
		if g.err != nil {
			t.Fatal(g.err)
		}
		if len(g.steps) != 5 || g.steps[0] != 1 || g.steps[4] != 5 {
			t.Fatalf("observer saw steps %v, want 1..5", g.steps)
		}
	}
}

func TestSlowObserverDropsOldest(t *testing.T) {
	h := newHub()
	slow := h.subscribe(3)
	fast := h.subscribe(100)
	for i := range 10 {
		h.publish(&session.Event{Kind: &halov1.Event_Log{Log: &halov1.LogEvent{Message: strconv.Itoa(i)}}})
	}
	evs, closed := slow.take()
	if closed || len(evs) != 4 {
		t.Fatalf("slow observer got %d events (closed %v), want a drop report and the newest 3", len(evs), closed)
	}
	if d := evs[0].GetDropped(); d == nil || d.Count != 7 {
		t.Fatalf("first event %v, want 7 dropped", evs[0])
	}
	for i, ev := range evs[1:] {
		if ev.GetLog().GetMessage() != strconv.Itoa(7+i) || ev.Seq != int64(8+i) {
			t.Fatalf("event %d = %v, want message %d", i, ev, 7+i)
		}
	}
	evs, _ = fast.take()
	if len(evs) != 10 || evs[0].GetDropped() != nil {
		t.Fatalf("fast observer got %d events", len(evs))
	}
	// No drops since the last take: no report.
	h.publish(&session.Event{})
	if evs, _ := slow.take(); len(evs) != 1 || evs[0].GetDropped() != nil {
		t.Fatalf("after catching up: %v", evs)
	}
	h.close()
	if _, closed := fast.take(); !closed {
		t.Fatal("closing the hub did not end the subscription")
	}
	h.publish(&session.Event{}) // after close: ignored, no panic
}

func TestProfileSumsToStepTime(t *testing.T) {
	_, c := loaded(t)
	ctx := ctxT(t)
	if _, err := c.Step(ctx, 1); err != nil { // warm up allocations
		t.Fatal(err)
	}
	r, err := c.Profile(ctx, 3, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Steps) != 3 {
		t.Fatalf("Profile(3) returned %d steps", len(r.Steps))
	}
	var tr struct {
		TraceEvents []traceEvent `json:"traceEvents"`
	}
	if err := json.Unmarshal(r.TraceJson, &tr); err != nil || len(tr.TraceEvents) < 10 {
		t.Fatalf("trace: %d events, %v", len(tr.TraceEvents), err)
	}
	stalls := stallsByStep(tr.TraceEvents)
	for i, p := range r.Steps {
		if p.Step != int64(i+2) || p.Metrics.GetStep() != p.Step {
			t.Fatalf("profile %d is of step %d (metrics step %d)", i, p.Step, p.Metrics.GetStep())
		}
		sum, compute := p.HostS, 0.0
		for _, v := range p.ComputeS {
			sum += v
			compute += v
		}
		for _, v := range p.CommS {
			sum += v
		}
		// The parts partition the recorded step: no span counted twice, none lost.
		if math.Abs(sum-p.StepS) > 0.01*p.StepS {
			t.Errorf("step %d: parts sum to %s, the recorded step spans %s (more than 1%% apart)", p.Step, durationS(sum), durationS(p.StepS))
		}
		// The recorded step is the step the trainer timed. Time the process spent off the
		// CPU between the two clocks' readings (a loaded machine) is allowed for.
		measured, stalled := p.Metrics.StepTimeS, stalls[p.Step]
		if stalled > 0 {
			t.Logf("step %d: %s of %s stalled (gaps of %.0f µs or more between ops)", p.Step, durationS(stalled), durationS(p.StepS), float64(stallGap))
		}
		if math.Abs(p.StepS-measured) > 0.05*measured+stalled {
			t.Errorf("step %d: recorded step %s, trainer measured %s (more than 5%% apart, %s of it stalled)", p.Step, durationS(p.StepS), durationS(measured), durationS(stalled))
		}
		// Op spans cover most of the step: host work between ops is small. A stall (a gap
		// between two ops longer than any host work of this model: the process was off the
		// CPU, which a loaded 2-core machine does for milliseconds at a time) is not host
		// work and is left out of the step it is compared with.
		if compute < 0.5*(p.StepS-stalled) {
			t.Errorf("step %d: op spans cover %s of %s (%s stalled): most of the step is unaccounted host time", p.Step, durationS(compute), durationS(p.StepS), durationS(stalled))
		}
		for _, class := range []string{"matmul", "attention", "norm", "rope", "embedding", "mlp_activation", "loss", "optimizer"} {
			if p.ComputeS[class] <= 0 {
				t.Errorf("step %d: no time in %s: %v", p.Step, class, p.ComputeS)
			}
		}
		if len(p.CommS) != 0 {
			t.Errorf("communication on one device: %v", p.CommS)
		}
		if p.Flops <= 0 || p.Ops <= 0 {
			t.Errorf("step %d: flops %g ops %d", p.Step, p.Flops, p.Ops)
		}
	}
	// Profiling is off again: the next step records no op times.
	ms, err := c.Step(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms[0].TimeByOpS) != 0 {
		t.Fatalf("op times recorded after the profile: %v", ms[0].TimeByOpS)
	}
}

func durationS(s float64) string { return time.Duration(s * float64(time.Second)).String() }

func TestProfileObservesRunningRun(t *testing.T) {
	_, c := loaded(t)
	ctx := ctxT(t)
	if _, err := c.Run(ctx, 0); err != nil {
		t.Fatal(err)
	}
	r, err := c.Profile(ctx, 2, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Steps) != 2 || r.Steps[1].Step != r.Steps[0].Step+1 {
		t.Fatalf("observed profile steps %v", r.Steps)
	}
	if st := status(t, c); st.State != session.StateRunning {
		t.Fatalf("the run stopped after being profiled: %v", st.State)
	}
	if _, err := c.Pause(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestInspect(t *testing.T) {
	_, c := loaded(t)
	ctx := ctxT(t)
	r, err := c.Inspect(ctx, &session.InspectRequest{})
	if err != nil {
		t.Fatal(err)
	}
	params := 0
	for _, s := range r.Stats {
		if s.Kind == "grad" {
			if s.Rms != 0 || s.MaxAbs != 0 {
				t.Fatalf("nonzero gradient before any step: %v", s)
			}
			continue
		}
		params++
	}
	if params == 0 {
		t.Fatal("no parameter statistics")
	}
	if _, err := c.Step(ctx, 1); err != nil {
		t.Fatal(err)
	}
	r, err = c.Inspect(ctx, &session.InspectRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var layer1 *session.TensorStats
	grads := 0
	for _, s := range r.Stats {
		if s.Kind == "grad" {
			grads++
			if s.Rms <= 0 {
				t.Errorf("gradient %s has rms %g after a step", s.Name, s.Rms)
			}
		}
		if s.Kind == "param" && s.Name == "model.layers.1.mlp.down_proj.weight" {
			layer1 = s
		}
	}
	if grads != params || layer1 == nil || layer1.Layer != 1 {
		t.Fatalf("%d grads for %d params; layer-1 stats %v", grads, params, layer1)
	}
	name := "model.layers.1.mlp.down_proj.weight"
	full, err := c.Inspect(ctx, &session.InspectRequest{Name: name, Count: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(full.Values); n != 32*64 {
		t.Fatalf("%s has %d values, want 32*64", name, n)
	}
	var sq float64
	for _, v := range full.Values {
		sq += float64(v) * float64(v)
	}
	if rms := math.Sqrt(sq / float64(len(full.Values))); math.Abs(rms-full.Stats[0].Rms) > 1e-6*rms {
		t.Fatalf("rms of the values %g != reported %g", rms, full.Stats[0].Rms)
	}
	part, err := c.Inspect(ctx, &session.InspectRequest{Name: name, Offset: 10, Count: 5})
	if err != nil {
		t.Fatal(err)
	}
	if len(part.Values) != 5 || part.Values[0] != full.Values[10] || part.Values[4] != full.Values[14] {
		t.Fatalf("slice [10,15) = %v, want %v", part.Values, full.Values[10:15])
	}
	tests := []struct {
		req  *session.InspectRequest
		code connect.Code
		msg  string
	}{
		{&session.InspectRequest{Name: "model.nope"}, connect.CodeNotFound, `no tensor "model.nope"`},
		{&session.InspectRequest{Name: name, Offset: 1 << 30, Count: 1}, connect.CodeOutOfRange, "past the end"},
		{&session.InspectRequest{Name: name, Offset: -1, Count: 1}, connect.CodeInvalidArgument, "must be >= 0"},
		{&session.InspectRequest{Name: name, Kind: "weights"}, connect.CodeInvalidArgument, `kind "weights"`},
		{&session.InspectRequest{Count: 3}, connect.CodeInvalidArgument, "need a tensor name"},
	}
	for _, tc := range tests {
		_, err := c.Inspect(ctx, tc.req)
		if connect.CodeOf(err) != tc.code {
			t.Errorf("Inspect(%v): %v, want code %v", tc.req, err, tc.code)
			continue
		}
		mustContain(t, err, tc.msg)
	}
}

func TestEvalGenerateSave(t *testing.T) {
	_, c := loaded(t)
	ctx := ctxT(t)
	if _, err := c.Step(ctx, 2); err != nil {
		t.Fatal(err)
	}
	l, err := c.Eval(ctx)
	if err != nil || !(l > 0) {
		t.Fatalf("Eval = %g, %v", l, err)
	}
	var pieces []string
	text, err := c.Generate(ctx, &session.GenerateRequest{Prompt: "What is 2+3?", Chat: true, MaxNewTokens: 6}, func(p string) { pieces = append(pieces, p) })
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(pieces, "") != text {
		t.Fatalf("pieces %q do not make up the text %q", pieces, text)
	}
	_, err = c.Generate(ctx, &session.GenerateRequest{Prompt: "x", MaxNewTokens: 0}, nil)
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("max_new_tokens 0: %v", err)
	}
	dir := filepath.Join(t.TempDir(), "ckpt")
	r, err := c.Save(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if r.Step != 2 {
		t.Fatalf("saved step %d", r.Step)
	}
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		t.Fatalf("checkpoint has no config.json: %v", err)
	}
}

func TestTCPNeedsToken(t *testing.T) {
	logs := &syncBuffer{}
	s := startServer(t, Options{Listen: "tcp://127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(logs, nil))})
	ctx := ctxT(t)
	addr := s.TCPAddr()
	if !strings.HasPrefix(addr, "tcp://127.0.0.1:") {
		t.Fatalf("TCP address %q is not on localhost", addr)
	}
	p, _ := session.PathsFor("test")
	st, err := os.Stat(p.Token)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("token file %s: %v mode %v", p.Token, err, st.Mode())
	}
	tests := []struct {
		name  string
		token string
		code  connect.Code
		msg   string
	}{
		{"wrong token", strings.Repeat("0", 64), connect.CodeUnauthenticated, "wrong bearer token"},
		{"right token", s.Token(), 0, ""},
		{"token file", "", 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := session.Options{Token: tc.token, TokenSession: "test"}
			c, err := session.Dial(addr, o)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, err = c.Status(ctx)
			if tc.code == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if connect.CodeOf(err) != tc.code {
				t.Fatalf("Status: %v, want %v", err, tc.code)
			}
			mustContain(t, err, tc.msg)
			// Streams are refused too.
			if ch, last, err := c.Events(ctx, 1); err == nil {
				for range ch {
				}
				if connect.CodeOf(last()) != tc.code {
					t.Fatalf("Events: %v, want %v", last(), tc.code)
				}
			} else if connect.CodeOf(err) != tc.code {
				t.Fatalf("Events: %v", err)
			}
		})
	}
	// A client without any token (plain HTTP/1.1 and JSON, as curl would send it).
	resp, err := http.Post("http://"+strings.TrimPrefix(addr, "tcp://")+"/halo.v1.SessionService/Status", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), "needs a bearer token") {
		t.Fatalf("no token: HTTP %d %s", resp.StatusCode, body)
	}
	for _, want := range []string{"reason=\"no token\"", "reason=\"wrong token\"", "procedure=/halo.v1.SessionService/Status"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("refusals not logged with %s:\n%s", want, logs.String())
		}
	}
	// The unix socket needs no token.
	if _, err := dial(t, s.Socket(), "local").Status(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestSocketPermissions(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "rt")
	t.Setenv("HALO_SESSION_DIR", dir)
	s, err := New(Options{Name: "perm"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(t.Context()) }()
	defer func() { s.Shutdown(); <-done }()
	st, err := os.Stat(s.Socket())
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want a 0600 socket", st.Mode())
	}
	dst, err := os.Stat(dir)
	if err != nil || dst.Mode().Perm() != 0o700 {
		t.Fatalf("runtime dir mode %v (%v), want 0700", dst.Mode(), err)
	}
	if filepath.Dir(s.Socket()) != dir || filepath.Base(s.Socket()) != "perm.sock" {
		t.Fatalf("socket at %s", s.Socket())
	}
	// A second session of the same name is refused while the first answers.
	if _, err := New(Options{Name: "perm"}); err == nil {
		t.Fatal("a second session took the socket of a live one")
	} else {
		mustContain(t, err, "already listening")
	}
	ss, err := session.List(t.Context())
	if err != nil || len(ss) != 1 || ss[0].Name != "perm" {
		t.Fatalf("List = %v, %v", ss, err)
	}
}

// TestClientKilledLeavesSessionServing runs a controlling client in a second process, kills
// it with SIGKILL while it watches events, and checks the session goes on serving others.
func TestClientKilledLeavesSessionServing(t *testing.T) {
	s, c := loaded(t)
	ctx := ctxT(t)
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "HALO_SESSION_HELPER=control-and-watch", "HALO_SOCKET="+s.Socket())
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the helper to watch", func() bool { return strings.Contains(out.String(), "watching") })
	before := status(t, c).Step
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	// The run the killed client started goes on; another client can take over and pause it.
	waitFor(t, "the run to go on", func() bool { return status(t, c).Step > before+3 })
	if _, err := c.TakeOver(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Step(ctx, 1); err != nil {
		t.Fatal(err)
	}
}

// TestSIGTERMSavesAndExits runs a session in a second process, steps it, sends SIGTERM and
// checks it saved a checkpoint, removed its socket and exited 0.
func TestSIGTERMSavesAndExits(t *testing.T) {
	dir := t.TempDir()
	save := filepath.Join(dir, "on-stop")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "HALO_SESSION_HELPER=serve", "HALO_SESSION_DIR="+dir, "HALO_SESSION_NAME=term", "HALO_SAVE_ON_STOP="+save)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sock := filepath.Join(dir, "term.sock")
	var c *session.Client
	waitFor(t, "the session to load", func() bool {
		if c == nil {
			c, _ = session.Dial(sock, session.Options{})
		}
		if c == nil {
			return false
		}
		st, err := c.Status(t.Context())
		return err == nil && st.State == session.StateIdle
	})
	defer c.Close()
	ctx := ctxT(t)
	if _, err := c.Step(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Run(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- cmd.Wait() }()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("session exited with %v; output:\n%s", err, out.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("session did not exit after SIGTERM; output:\n%s", out.String())
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left behind: %v", err)
	}
	raw, err := os.ReadFile(filepath.Join(save, "config.json"))
	if err != nil || len(raw) == 0 {
		t.Fatalf("no checkpoint saved on stop: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "saved step") {
		t.Fatalf("the log does not say what was saved:\n%s", out.String())
	}
}

func TestStateEventsOnControlChange(t *testing.T) {
	s, c := loaded(t)
	ctx := ctxT(t)
	o := dial(t, s.Socket(), "watcher")
	st, err := o.Subscribe(ctx, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	if _, err := o.TakeOver(ctx); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if s := ev.GetState(); s != nil && s.Controller == o.ID() {
			if !strings.Contains(s.Reason, "taken by") {
				t.Fatalf("reason %q", s.Reason)
			}
			break
		}
	}
	// Later state events name the controller too.
	if _, err := o.Step(ctx, 1); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if s := ev.GetState(); s != nil && s.State == session.StateIdle && s.Step == 1 {
			if s.Controller != o.ID() {
				t.Fatalf("state event after the step names controller %q, want %q", s.Controller, o.ID())
			}
			break
		}
	}
	_ = c
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestInspectActivations(t *testing.T) {
	_, c := loaded(t)
	ctx := ctxT(t)
	if _, err := c.Inspect(ctx, &session.InspectRequest{Activations: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Step(ctx, 1); err != nil {
		t.Fatal(err)
	}
	r, err := c.Inspect(ctx, &session.InspectRequest{})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*session.TensorStats{}
	for _, s := range r.Stats {
		if s.Kind == "activation" {
			byName[s.Name] = s
		}
	}
	// The tiny model has 2 layers: one attention per layer, and the embedding outside them.
	for _, want := range []struct {
		name  string
		layer int64
	}{{"layers.0.Attention.0", 0}, {"layers.1.Attention.0", 1}, {"layers.1.SwiGLU.0", 1}, {"Embedding.0", -1}} {
		s := byName[want.name]
		if s == nil {
			t.Fatalf("no activation %s among %d", want.name, len(byName))
		}
		if s.Layer != want.layer || s.Rms <= 0 || s.Nan != 0 || len(s.Shape) != 2 {
			t.Fatalf("%s: %v", want.name, s)
		}
	}
	one, err := c.Inspect(ctx, &session.InspectRequest{Name: "layers.1.Attention.0", Kind: "activation"})
	if err != nil || len(one.Stats) != 1 || one.Stats[0].Rms != byName["layers.1.Attention.0"].Rms || one.Step != 1 {
		t.Fatalf("named activation: %v, %v", one, err)
	}
	// The capture was for one step only.
	if _, err := c.Step(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if again, _ := c.Inspect(ctx, &session.InspectRequest{Name: "layers.1.Attention.0", Kind: "activation"}); again.GetStep() != 1 {
		t.Fatalf("activations re-captured without being asked: step %d", again.GetStep())
	}
}
