package tui

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/halo-shell/halo-shell/session"
)

// Bounds on what the dashboard keeps, so that a long run never grows its memory.
const (
	maxHistory = 4096 // points per chart series
	maxLogs    = 500  // log lines
)

// logLine is one line of the log tail.
type logLine struct {
	at    time.Time
	level string // debug, info, warn, error
	text  string
}

// runData is everything the dashboard knows about the session. The root Model owns it and
// changes it only in Update; components read it when they render.
type runData struct {
	self string // this client's id

	name        string
	state       session.State
	step, total int64
	device      string
	controller  string            // client id of the controller, "" when none
	clientNames map[string]string // client id -> name, from the last Status
	connected   bool              // the event stream is open
	lastErr     string            // the session's last error

	last    *session.StepMetrics // the newest step's metrics
	steps   []int64              // history, oldest first, at most maxHistory
	loss    []float64
	lr      []float64
	profile *profileView // the newest time breakdown, nil until one is taken
	// profiledTo is the last step of the newest Profile reply: per-step profile events up
	// to it are older news than the reply's mean.
	profiledTo int64

	logs    []logLine
	dropped int64 // events the session dropped for this observer

	// eventAt is when the newest event was applied: a status asked for before it may be
	// older news about the state and step than the event.
	eventAt time.Time
}

// profileView is a time breakdown the dashboard shows: one step's, or the mean of a profile's
// steps.
type profileView struct {
	label   string             // "step 7" or "steps 5-7 (mean)"
	stepS   float64            // wall time of the step
	compute map[string]float64 // seconds by op class
	comm    map[string]float64 // seconds by collective kind
	hostS   float64            // host work and idle
	flops   float64            // floating-point operations of the step
	ops     float64            // ops (kernel launches and transfers) of the step
	syncs   float64            // host waits for the device in the step
}

// spanSum is the sum of every part of the breakdown.
func (p *profileView) spanSum() float64 {
	s := p.hostS
	for _, v := range p.compute {
		s += v
	}
	for _, v := range p.comm {
		s += v
	}
	return s
}

func profileFromStep(p *session.StepProfile) *profileView {
	return &profileView{label: fmt.Sprintf("step %d", p.Step), stepS: p.StepS, compute: copyMap(p.ComputeS),
		comm: copyMap(p.CommS), hostS: p.HostS, flops: p.Flops, ops: float64(p.Ops), syncs: float64(p.Syncs)}
}

// meanProfile averages the steps of a profile; nil when there are none.
func meanProfile(steps []*session.StepProfile) *profileView {
	if len(steps) == 0 {
		return nil
	}
	if len(steps) == 1 {
		return profileFromStep(steps[0])
	}
	v := &profileView{label: fmt.Sprintf("steps %d-%d (mean)", steps[0].Step, steps[len(steps)-1].Step),
		compute: map[string]float64{}, comm: map[string]float64{}}
	n := float64(len(steps))
	for _, s := range steps {
		v.stepS += s.StepS / n
		v.hostS += s.HostS / n
		v.flops += s.Flops / n
		v.ops += float64(s.Ops) / n
		v.syncs += float64(s.Syncs) / n
		for k, x := range s.ComputeS {
			v.compute[k] += x / n
		}
		for k, x := range s.CommS {
			v.comm[k] += x / n
		}
	}
	return v
}

func copyMap(m map[string]float64) map[string]float64 {
	out := make(map[string]float64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// applyEvent folds one session event into the data.
func (d *runData) applyEvent(ev *session.Event) {
	if ev.Kind == nil {
		return
	}
	d.eventAt = time.Now()
	at := d.eventAt
	if ev.UnixMs > 0 {
		at = time.UnixMilli(ev.UnixMs)
	}
	switch {
	case ev.GetMetrics() != nil:
		d.applyMetrics(ev.GetMetrics())
	case ev.GetLog() != nil:
		l := ev.GetLog()
		d.addLog(at, l.Level, l.Message)
	case ev.GetState() != nil:
		s := ev.GetState()
		if n := len(d.steps); s.Reason == "loaded" || (n > 0 && s.Step < d.steps[n-1]) {
			// A new model, or a new session under the same name: a new run.
			d.newRun()
		}
		d.state, d.step = s.State, s.Step
		// Engine state changes carry no controller; attaching and control changes do.
		if s.Reason == "attached" || strings.HasPrefix(s.Reason, "control ") {
			d.controller = s.Controller
		}
		msg := "state " + stateWord(s.State)
		if s.Reason != "" && s.Reason != stateWord(s.State) {
			msg += ": " + s.Reason
		}
		d.addLog(at, "info", msg)
	case ev.GetDropped() != nil:
		n := ev.GetDropped().Count
		d.dropped += n
		d.addLog(at, "warn", fmt.Sprintf("%d events dropped (this view fell behind the session)", n))
	case ev.GetProfile() != nil:
		if p := ev.GetProfile(); p.Step > d.profiledTo {
			d.profile = profileFromStep(p)
		}
	}
}

// newRun forgets the charts, the last metrics and the profile of the previous run.
func (d *runData) newRun() {
	d.last, d.steps, d.loss, d.lr, d.profile, d.profiledTo = nil, nil, nil, nil, nil, 0
}

// applyMetrics records one step's metrics: the newest become last, and steps after the last
// one charted extend the history (a step already seen, say from both the event stream and a
// Step reply, is charted once).
func (d *runData) applyMetrics(m *session.StepMetrics) {
	if m == nil {
		return
	}
	if d.last == nil || m.Step >= d.last.Step {
		d.last = m
	}
	d.step = max(d.step, m.Step)
	n := len(d.steps)
	if n == 0 || m.Step > d.steps[n-1] {
		d.steps = appendCapped(d.steps, m.Step)
		d.loss = appendCapped(d.loss, m.Loss)
		d.lr = appendCapped(d.lr, m.Lr)
		return
	}
	// An older step: the history sent on attach, arriving after a status reply's last
	// metrics. Insert it in step order unless it is charted already or older than a full
	// chart keeps.
	i, found := slices.BinarySearch(d.steps, m.Step)
	if found || (i == 0 && n >= maxHistory) {
		return
	}
	d.steps = slices.Insert(d.steps, i, m.Step)
	d.loss = slices.Insert(d.loss, i, m.Loss)
	d.lr = slices.Insert(d.lr, i, m.Lr)
	if len(d.steps) > maxHistory {
		d.steps, d.loss, d.lr = d.steps[1:], d.loss[1:], d.lr[1:]
	}
}

// applyStatus takes what a Status (or a control call's) reply says; asked is when the request
// was sent. The state and step are kept from events that arrived after it.
func (d *runData) applyStatus(st *session.StatusResponse, asked time.Time) {
	if st == nil {
		return
	}
	if !asked.Before(d.eventAt) {
		d.state, d.step = st.State, st.Step
	}
	d.name, d.total, d.device = clean(st.Name), st.TotalSteps, clean(st.Device)
	d.controller, d.lastErr = st.Controller, st.LastError
	d.clientNames = map[string]string{}
	for _, c := range st.Clients {
		d.clientNames[c.Id] = clean(c.Name)
	}
	// The last step's metrics start the charts when nothing was charted yet; otherwise the
	// event stream is the source (a status may be older than the newest event).
	if st.LastMetrics != nil && len(d.steps) == 0 {
		d.applyMetrics(st.LastMetrics)
	}
}

func (d *runData) addLog(at time.Time, level, text string) {
	for _, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		d.logs = append(d.logs, logLine{at: at, level: strings.ToLower(clean(level)), text: clean(line)})
	}
	if over := len(d.logs) - maxLogs; over > 0 {
		d.logs = append(d.logs[:0], d.logs[over:]...)
	}
}

// isController reports whether this client controls the session.
func (d *runData) isController() bool { return d.controller != "" && d.controller == d.self }

// controllerName names the controller for the header: its client name when known, else its id.
func (d *runData) controllerName() string {
	if d.controller == "" {
		return ""
	}
	if n := d.clientNames[d.controller]; n != "" {
		return n
	}
	return clean(d.controller)
}

func appendCapped[T any](s []T, v T) []T {
	if len(s) >= maxHistory {
		s = append(s[:0], s[len(s)-maxHistory+1:]...)
	}
	return append(s, v)
}

// stateWord is a session state in lower case ("running").
func stateWord(s session.State) string {
	w := strings.ToLower(strings.TrimPrefix(s.String(), "STATE_"))
	if w == "unspecified" {
		return "unknown"
	}
	return w
}

// finite drops the NaN and infinite values of a series (a chart cannot place them).
func finite(xs []float64) []float64 {
	out := make([]float64, 0, len(xs))
	for _, x := range xs {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			out = append(out, x)
		}
	}
	return out
}
