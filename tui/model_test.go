package tui

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/exp/golden"
	"github.com/charmbracelet/x/exp/teatest/v2"

	"github.com/halo-shell/halo-shell/session"
	halov1 "github.com/halo-shell/halo-shell/session/proto/halo/v1"
	"github.com/halo-shell/halo-shell/tui/styles"
)

// probeMsg asks the program for its current screen (plain text); probed answers it inside the
// program's goroutine, so tests read the model without racing it.
type probeMsg struct{ reply chan string }

// stepsProbe asks the program for the steps its charts hold.
type stepsProbe struct{ reply chan []int64 }

type probed struct{ *Model }

func (p probed) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	if pm, ok := msg.(probeMsg); ok {
		pm.reply <- ansi.Strip(p.render())
		return p, nil
	}
	if sp, ok := msg.(stepsProbe); ok {
		sp.reply <- slices.Clone(p.d.steps)
		return p, nil
	}
	_, cmd := p.Model.Update(msg)
	return p, cmd
}

// harness runs a Model over a fakeSession in a teatest program.
type harness struct {
	t  *testing.T
	f  *fakeSession
	tm *teatest.TestModel
	m  *Model
}

func newHarness(t *testing.T, f *fakeSession, w, h int) *harness {
	t.Helper()
	hs := attach(t, f, Options{Location: time.UTC, ReconnectEvery: 20 * time.Millisecond}, w, h)
	hs.f = f
	return hs
}

// attach runs a Model over c at a w x h terminal.
func attach(t *testing.T, c Controller, o Options, w, h int) *harness {
	t.Helper()
	m := New(c, o)
	tm := teatest.NewTestModel(t, probed{m}, teatest.WithInitialTermSize(w, h))
	t.Cleanup(func() { _ = tm.Quit() })
	return &harness{t: t, tm: tm, m: m}
}

// feed delivers events through the session channel and returns once the model has applied
// them all: the pump asks for event i+1 only after Update has applied event i, so a taken
// no-op event after the script proves the script is in.
func (h *harness) feed(evs ...*session.Event) {
	h.t.Helper()
	for _, ev := range append(evs, &session.Event{}) {
		select {
		case h.f.stream() <- ev:
		case <-time.After(waitFor):
			h.t.Fatalf("the model stopped reading events (at seq %d)", ev.Seq)
		}
	}
}

// screen is the model's current screen as plain text.
func (h *harness) screen() string {
	h.t.Helper()
	reply := make(chan string, 1)
	h.tm.Send(probeMsg{reply})
	select {
	case s := <-reply:
		return s
	case <-time.After(waitFor):
		h.t.Fatal("the program does not answer")
		return ""
	}
}

// waitScreen waits until the screen satisfies ok and returns it.
func (h *harness) waitScreen(what string, ok func(string) bool) string {
	h.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		s := h.screen()
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("screen never showed %s; last screen:\n%s", what, s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func contains(subs ...string) func(string) bool {
	return func(s string) bool {
		for _, x := range subs {
			if !strings.Contains(s, x) {
				return false
			}
		}
		return true
	}
}

// checkFits fails when the screen is larger than w x h.
func checkFits(t *testing.T, s string, w, h int) {
	t.Helper()
	lines := strings.Split(s, "\n")
	if len(lines) > h {
		t.Errorf("%d lines on a %dx%d screen", len(lines), w, h)
	}
	for i, l := range lines {
		if n := ansi.StringWidth(l); n > w {
			t.Errorf("line %d is %d cells wide on a %dx%d screen: %q", i, n, w, h, l)
		}
	}
}

func TestGoldenScreens(t *testing.T) {
	for _, size := range []struct{ w, h int }{{80, 24}, {120, 40}, {50, 20}} {
		t.Run(fmt.Sprintf("%dx%d", size.w, size.h), func(t *testing.T) {
			h := newHarness(t, newFake(statusAfterScript()), size.w, size.h)
			h.feed(script()...)
			s := h.waitScreen("step 20 and its status", contains("step 20/1000", "observer"))
			checkFits(t, s, size.w, size.h)
			golden.RequireEqual(t, s)
		})
	}
}

func TestScreenShowsTheRun(t *testing.T) {
	h := newHarness(t, newFake(statusAfterScript()), 120, 40)
	h.feed(script()...)
	s := h.waitScreen("the run", contains("step 20/1000"))
	last := metricsAt(20)
	for _, want := range []string{
		"session default", "running", "cpu", // header
		"loss " + fmtLoss(last.Loss) + " at step 20",    // loss chart title
		"learning rate " + fmt.Sprintf("%.3e", last.Lr), // lr chart title
		"tok/s " + fmtSI(last.TokensPerS),               // stats
		"MFU – (peak unknown)",                          // a profile on a device of unknown peak
		"FLOP/s " + fmtSI(1.2e9/0.060),
		"step time 60.0 ms step 20: compute 75%  comm 15%  idle 10%", // breakdown title
		"matmul 25%", "expert gemm 13%", "router 3%", "permute 2%", "combine 2%", "ops/syncs 900/14", "a2a dispatch 7%", "a2a combine 5%", "all-reduce 3%", "idle/host 10%", // legend
		"gradient norm 9.1 clipped to 1.0", // log tail
		"12:00:02 running to step 1000",
		"mem cuda:0 21.0 GiB (peak 23.0 GiB of 140.0 GiB)", "mem cuda:1 20.0 GiB", // memory per device
	} {
		if !strings.Contains(s, want) {
			t.Errorf("screen lacks %q:\n%s", want, s)
		}
	}
}

// TestKeys checks that each key makes the right call for the session's state and shows its
// outcome.
func TestKeys(t *testing.T) {
	stateEv := func(s session.State) *session.Event {
		return &session.Event{UnixMs: at(30), Kind: &halov1.Event_State{State: &halov1.StateEvent{State: s, Step: 20, Reason: "scripted"}}}
	}
	for _, tc := range []struct {
		name   string
		state  session.State
		key    string
		refuse error
		calls  []string
		screen []string
		absent []string // not on the screen afterwards
	}{
		{name: "p pauses a run", state: session.StateRunning, key: "p", calls: []string{"pause"},
			screen: []string{"paused after step 20", "│ paused │", "controller (you)"}},
		{name: "p resumes a paused run", state: session.StatePaused, key: "p", calls: []string{"resume"},
			screen: []string{"resumed", "│ running │"}},
		{name: "p starts a run when idle", state: session.StateIdle, key: "p", calls: []string{"run"},
			screen: []string{"started a run to step 1000"}},
		{name: "p with no model says so", state: session.StateEmpty, key: "p", calls: nil,
			screen: []string{"no model is loaded"}},
		{name: "s steps once", state: session.StateIdle, key: "s", calls: []string{"step"},
			screen: []string{"stepped to 21: loss " + fmtLoss(metricsAt(21).Loss), "loss " + fmtLoss(metricsAt(21).Loss) + " at step 21"}},
		{name: "t takes control", state: session.StateRunning, key: "t", calls: []string{"take-over"},
			screen: []string{"this client now controls the session", "controller (you)"}},
		{name: "a refused call names the controller", state: session.StateRunning, key: "p",
			refuse: errors.New(`failed_precondition: session "default" is controlled by client repl-client (repl); observe, or take over with --take-over`),
			calls:  []string{"pause"}, screen: []string{`pause failed: session "default" is controlled by client repl-client`, "observer, controller repl"}},
		{name: "? shows the full help", state: session.StateRunning, key: "?", calls: nil,
			screen: []string{"pause/resume", "take control", "detach"}, absent: []string{"p pause/resume • s step"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := statusAfterScript()
			st.State = tc.state
			f := newFake(st)
			f.refuse = tc.refuse
			h := newHarness(t, f, 120, 40)
			h.feed(append(script(), stateEv(tc.state))...)
			h.waitScreen("the state", contains("│ "+stateWord(tc.state)+" │"))
			h.tm.Type(tc.key)
			s := h.waitScreen(strings.Join(tc.screen, ", "), func(s string) bool {
				return contains(tc.screen...)(s) && !slices.ContainsFunc(tc.absent, func(a string) bool { return strings.Contains(s, a) })
			})
			if got := f.Calls(); !slices.Equal(got, tc.calls) {
				t.Errorf("calls %q, want %q; screen:\n%s", got, tc.calls, s)
			}
		})
	}
}

func TestProfileKeyShowsTheBreakdown(t *testing.T) {
	f := newFake(statusAfterScript())
	f.profile = &session.ProfileResponse{Steps: []*session.StepProfile{stepProfile(21), stepProfile(22), stepProfile(23)}}
	f.profile.Steps[2].CommS = map[string]float64{"all_gather": 0.009} // a different collective in one step
	h := newHarness(t, f, 120, 40)
	h.feed(script()...)
	h.waitScreen("step 20", contains("step 20/1000"))
	h.tm.Type("f")
	s := h.waitScreen("the profile's result", contains("profiled steps 21-23 (mean): 60.0 ms per step, parts add up to 100.0%"))
	for _, want := range []string{"step time 60.0 ms steps 21-23 (mean)", "all-gather 5%", "a2a dispatch 4%"} {
		if !strings.Contains(s, want) {
			t.Errorf("screen lacks %q:\n%s", want, s)
		}
	}
	if got := f.Calls(); !slices.Equal(got, []string{"profile"}) {
		t.Errorf("calls %q, want [profile]", got)
	}
}

// TestDetach checks that q ends the program, gives control back when it held it, and never
// pauses or stops the session.
func TestDetach(t *testing.T) {
	for _, tc := range []struct {
		name       string
		controller bool
		calls      []string
	}{
		{"observer", false, nil},
		{"controller", true, []string{"take-over", "release"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(statusAfterScript())
			h := newHarness(t, f, 80, 24)
			h.feed(script()...)
			h.waitScreen("step 20", contains("step 20/1000"))
			if tc.controller {
				h.tm.Type("t")
				h.waitScreen("control", contains("controller (you)"))
			}
			h.tm.Type("q")
			h.tm.WaitFinished(t, teatest.WithFinalTimeout(waitFor))
			if got := f.Calls(); !slices.Equal(got, tc.calls) {
				t.Errorf("calls %q, want %q", got, tc.calls)
			}
		})
	}
}

// TestResize checks that the layout follows the terminal's size, down to tiny ones.
func TestResize(t *testing.T) {
	h := newHarness(t, newFake(statusAfterScript()), 80, 24)
	h.feed(script()...)
	h.waitScreen("step 20", contains("step 20/1000"))
	for _, sz := range []struct {
		w, h int
		want []string // what must still show
	}{
		{120, 40, []string{"learning rate", "log", "idle/host"}},
		{80, 24, []string{"learning rate", "log"}},
		{59, 30, []string{"loss", "learning rate"}}, // charts stacked
		{40, 12, []string{"step 20/1000"}},
		{20, 5, []string{"running"}},
		{100, 30, []string{"learning rate", "log"}},
	} {
		h.tm.Send(tea.WindowSizeMsg{Width: sz.w, Height: sz.h})
		s := h.screen()
		checkFits(t, s, sz.w, sz.h)
		for _, w := range sz.want {
			if !strings.Contains(s, w) {
				t.Errorf("%dx%d: screen lacks %q:\n%s", sz.w, sz.h, w, s)
			}
		}
	}
}

// TestReconnect checks that the dashboard says when the event stream ends, keeps trying, and
// follows the session again once it answers.
func TestReconnect(t *testing.T) {
	f := newFake(statusAfterScript())
	h := newHarness(t, f, 80, 24)
	h.feed(script()...)
	h.waitScreen("step 20", contains("step 20/1000", "running"))
	f.endStream(errors.New("unavailable: connection reset"), errors.New("unavailable: dial unix: connection refused"))
	h.waitScreen("the lost stream and the refused retry", contains("disconnected", "event stream ended: connection reset; reconnecting",
		"event stream ended: dial unix: connection refused; reconnecting"))
	retries := f.Subscriptions()
	s := h.waitScreen("more retries", func(string) bool { return f.Subscriptions() >= retries+3 })
	if n := strings.Count(s, "reconnecting"); n != 2 {
		// One line for the reset, one for the first refused retry; later retries say nothing new.
		t.Errorf("%d reconnecting lines, want one per distinct cause (2):\n%s", n, s)
	}
	f.reopen()
	h.feed(&session.Event{UnixMs: at(40), Kind: &halov1.Event_State{State: &halov1.StateEvent{State: session.StatePaused, Step: 20, Reason: "attached"}}})
	h.waitScreen("the session again", contains("│ paused │", "state paused: attached"))
}

// TestEventsAreDrawnAtMostOncePerFrame checks that a burst of events waits for the next frame
// while anything else is drawn at once.
func TestEventsAreDrawnAtMostOncePerFrame(t *testing.T) {
	m := New(newFake(statusAfterScript()), Options{Location: time.UTC})
	m.common.SetSize(80, 24)
	plain := func() string { return ansi.Strip(m.View().Content) }
	if s := plain(); !strings.Contains(s, "step 0") {
		t.Fatalf("first frame:\n%s", s)
	}
	m.framedAt = time.Now().Add(time.Hour) // as if just drawn, however slow this machine is
	m.Update(eventMsg{ev: metricsEv(1)})
	if !m.framePending {
		t.Fatal("an event scheduled no frame")
	}
	m.Update(eventMsg{ev: metricsEv(2)})
	if s := plain(); strings.Contains(s, "step 2") {
		t.Fatalf("an event was drawn before its frame:\n%s", s)
	}
	m.Update(frameMsg{})
	if s := plain(); !strings.Contains(s, "step 2") || m.framePending {
		t.Fatalf("the frame does not show the events (pending %v):\n%s", m.framePending, s)
	}
	before := plain()
	m.framedAt = time.Now().Add(time.Hour)
	m.Update(tea.WindowSizeMsg{Width: 60, Height: 20})
	s := plain()
	if s == before {
		t.Fatalf("a resize was not drawn at once:\n%s", s)
	}
	checkFits(t, s, 60, 20)
}

func TestStylesFollowTheTerminalBackground(t *testing.T) {
	m := New(newFake(statusAfterScript()), Options{})
	dark := styles.Default(true)
	light := styles.Default(false)
	m.Update(tea.BackgroundColorMsg{Color: color.White})
	if got := m.common.Styles.Value.GetForeground(); got != light.Value.GetForeground() || got == dark.Value.GetForeground() {
		t.Fatalf("on a white background the value colour is %v, want the light style's %v", got, light.Value.GetForeground())
	}
	custom := styles.Default(true)
	m = New(newFake(statusAfterScript()), Options{Styles: &custom})
	m.Update(tea.BackgroundColorMsg{Color: color.White})
	if got := m.common.Styles.Value.GetForeground(); got != dark.Value.GetForeground() {
		t.Fatalf("styles given in Options changed with the background: %v", got)
	}
}

// TestOneControlCallAtATime checks that keys pressed while a call is in flight are refused
// with a word, not queued behind it.
func TestOneControlCallAtATime(t *testing.T) {
	f := newFake(statusAfterScript())
	f.hold = make(chan struct{})
	h := newHarness(t, f, 120, 40)
	h.feed(script()...)
	h.waitScreen("the run", contains("│ running │", "step 20/1000"))
	h.tm.Type("p")
	h.waitScreen("the pause in flight", contains("pausing…"))
	h.tm.Type("s")
	h.waitScreen("the refusal", contains("pausing… one action at a time: wait for it"))
	h.tm.Type("f")
	close(f.hold)
	h.waitScreen("the pause", contains("paused after step 20"))
	if got := f.Calls(); !slices.Equal(got, []string{"pause"}) {
		t.Fatalf("calls %q, want only the pause", got)
	}
}

// TestMFUFromStepFLOPs checks that MFU comes from the step's own model FLOPs over a known
// device peak, without a profile.
func TestMFUFromStepFLOPs(t *testing.T) {
	d := &runData{last: metricsAt(20)}
	s := &stats{d: d, peakFLOPS: func() float64 { return 989e12 }}
	if got, want := s.mfu(), fmt.Sprintf("%.1f%%", 100*403.4e12/989e12); got != want {
		t.Fatalf("MFU %q, want %q", got, want)
	}
	s.peakFLOPS = func() float64 { return 0 }
	if got := s.mfu(); got != "– (peak unknown)" {
		t.Fatalf("MFU with an unknown peak: %q", got)
	}
}

// waitFor bounds every wait on the program in these tests; generous because CI runs the
// packages' tests side by side on two cores.
const waitFor = 20 * time.Second

// The learning-rate axis has labels that differ from each other, also when the rate moves by
// less than a percent (the start of a cosine schedule), where three significant digits give
// every label the same text.
func TestLRAxisLabelsDiffer(t *testing.T) {
	h := newHarness(t, newFake(statusAfterScript()), 120, 40)
	var evs []*session.Event
	for s := int64(1); s <= 20; s++ {
		m := metricsAt(s)
		m.Lr = 3e-3 * 0.5 * (1 + math.Cos(math.Pi*float64(s)/1000))
		evs = append(evs, &session.Event{Seq: s, UnixMs: at(int(s)), Kind: &halov1.Event_Metrics{Metrics: m}})
	}
	h.feed(evs...)
	s := h.waitScreen("step 20", contains("at step 20"))
	labels := regexp.MustCompile(`(-?\d\.\d+e[-+]\d\d) [┤┼]`).FindAllStringSubmatch(s, -1)
	if len(labels) < 4 {
		t.Fatalf("%d lr axis labels on the screen, want at least 4:\n%s", len(labels), s)
	}
	seen := map[string]bool{}
	for _, l := range labels {
		if seen[l[1]] {
			t.Fatalf("lr axis label %s appears twice:\n%s", l[1], s)
		}
		seen[l[1]] = true
	}
}

func TestAxisFormats(t *testing.T) {
	for _, tc := range []struct {
		f      axisFormat
		lo, hi float64
		labels int
		flat   bool
		want   []string // the labels from hi down to lo
	}{
		{sciAxis(3), 2.997e-3, 3e-3, 4, false, []string{"3.0000e-03", "2.9990e-03", "2.9980e-03", "2.9970e-03"}},
		{sciAxis(3), 0, 3e-3, 4, false, []string{"3.00e-03", "2.00e-03", "1.00e-03", "0.00e+00"}},
		{sciAxis(3), 3e-3 - 3e-9, 3e-3 + 3e-9, 3, true, []string{"3.00e-03", "3.00e-03", "3.00e-03"}},
		{fixedAxis(7, 3), 2, 5, 4, false, []string{"  5.000", "  4.000", "  3.000", "  2.000"}},
		{fixedAxis(7, 3), 2.5, 2.5003, 4, false, []string{" 2.5003", " 2.5002", " 2.5001", " 2.5000"}},
	} {
		f := tc.f(tc.lo, tc.hi, tc.labels, tc.flat)
		var got []string
		for i := range tc.labels {
			got = append(got, f(tc.hi-float64(i)*(tc.hi-tc.lo)/float64(tc.labels-1)))
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("labels of [%g, %g] = %q, want %q", tc.lo, tc.hi, got, tc.want)
		}
	}
}
