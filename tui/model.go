package tui

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"

	"github.com/halo-shell/halo-shell/session"
	"github.com/halo-shell/halo-shell/tui/keymap"
	"github.com/halo-shell/halo-shell/tui/styles"
)

// Controller is what the dashboard needs from a session; *session.Client satisfies it. The
// model calls it only from tea.Cmd goroutines, never from Update.
type Controller interface {
	// ID is this client's id (to tell whether it controls the session).
	ID() string
	Status(ctx context.Context) (*session.StatusResponse, error)
	// EventsWithHistory delivers the session's events on a channel that closes when the stream
	// ends, after up to history of the latest steps' metrics (so that the charts of a running
	// session are not empty on attach); the function returns the error that ended it.
	EventsWithHistory(ctx context.Context, buffer, history int) (<-chan *session.Event, func() error, error)
	Run(ctx context.Context, maxSteps int) (*session.StatusResponse, error)
	Pause(ctx context.Context) (*session.StatusResponse, error)
	Resume(ctx context.Context) (*session.StatusResponse, error)
	Step(ctx context.Context, n int) ([]*session.StepMetrics, error)
	Profile(ctx context.Context, k int, trace bool) (*session.ProfileResponse, error)
	TakeOver(ctx context.Context) (string, error)
	Release(ctx context.Context) error
}

var _ Controller = (*session.Client)(nil)

// Options configure a Model.
type Options struct {
	// PeakFLOPS is the device's peak FLOP/s for MFU; 0 means: look the device up by name
	// (H100/H200 989 TFLOP/s dense bf16, A100 312), and show no MFU when it is unknown.
	PeakFLOPS float64
	// StatusEvery is how often the model asks for Status (clients, controller, state); 0
	// means never after the first.
	StatusEvery time.Duration
	// ReconnectEvery is how long to wait before subscribing again after the event stream
	// ends (0: 1 s).
	ReconnectEvery time.Duration
	// EventBuffer is how many events the session keeps for this observer (0: the session's
	// default).
	EventBuffer int
	// ProfileSteps is how many steps f profiles (0: 3).
	ProfileSteps int
	// Location is the time zone of log time stamps (nil: local time).
	Location *time.Location
	// Styles and Keys override the defaults when not nil.
	Styles *styles.Styles
	Keys   *keymap.KeyMap
	// Logger receives the model's own diagnostics (nil: discarded).
	Logger *slog.Logger
}

// Model is the root of the dashboard.
type Model struct {
	common Common
	opts   Options
	c      Controller
	ctx    context.Context
	cancel context.CancelFunc
	d      *runData

	header    header
	loss, lr  chart
	stats     stats
	breakdown breakdown
	logs      logs
	help      help.Model

	showHelp   bool
	autoStyles bool   // the styles follow the terminal's background
	busy       string // the control call in flight ("pausing"), "" when none
	refused    bool   // a key was refused while busy
	notice     string // the outcome of the last action
	failed     bool   // notice is an error
	quitting   bool
	// streamErr is why the event stream last ended, so that retries log it once.
	streamErr string

	// The last frame, redrawn at most every frameInterval while events stream in (a frame
	// costs milliseconds and a small model steps faster than that) and at once after
	// anything else.
	frame        string
	framedAt     time.Time
	stale        bool // events arrived since the frame was drawn
	redraw       bool // draw the next frame now
	framePending bool // a frameMsg is on its way
}

// frameInterval is the shortest time between two frames drawn for events.
const frameInterval = 50 * time.Millisecond

// New returns a dashboard for the session behind c.
func New(c Controller, o Options) *Model {
	if o.ReconnectEvery <= 0 {
		o.ReconnectEvery = time.Second
	}
	if o.ProfileSteps <= 0 {
		o.ProfileSteps = 3
	}
	if o.Location == nil {
		o.Location = time.Local
	}
	autoStyles := o.Styles == nil
	if autoStyles {
		s := styles.Default(true)
		o.Styles = &s
	}
	if o.Keys == nil {
		k := keymap.Default()
		k.Profile.SetHelp("f", fmt.Sprintf("profile %d steps", o.ProfileSteps))
		o.Keys = &k
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ctx, cancel := context.WithCancel(context.Background())
	common := Common{Width: 80, Height: 24, Styles: o.Styles, Keys: o.Keys, Logger: o.Logger}
	m := &Model{
		common: common,
		opts:   o, c: c, ctx: ctx, cancel: cancel,
		d:    &runData{self: c.ID(), clientNames: map[string]string{}},
		help: help.New(), autoStyles: autoStyles,
	}
	m.help.Styles = o.Styles.Help
	d, st := m.d, o.Styles
	m.header = header{Common: common, d: d}
	m.loss = chart{
		Common: common,
		title: func() string {
			t := st.Title.Render("loss")
			if d.last != nil {
				t += " " + st.Value.Render(fmtLoss(d.last.Loss)) + st.Muted.Render(fmt.Sprintf(" at step %d", d.last.Step))
			}
			return t
		},
		series: func() []float64 { return d.loss },
		yaxis:  fixedAxis(7, 3),
		color:  st.LossSeries,
	}
	m.lr = chart{
		Common: common,
		title: func() string {
			t := st.Title.Render("learning rate")
			if d.last != nil {
				t += " " + st.Value.Render(fmt.Sprintf("%.3e", d.last.Lr))
			}
			return t
		},
		series: func() []float64 { return d.lr },
		yaxis:  sciAxis(3),
		color:  st.LRSeries,
	}
	m.stats = stats{Common: common, d: d, peakFLOPS: m.peakFLOPS}
	m.breakdown = breakdown{Common: common, d: d}
	m.logs = logs{Common: common, d: d, loc: o.Location}
	return m
}

// The components, as the root lays them out.
var (
	_ Component = (*header)(nil)
	_ Component = (*chart)(nil)
	_ Component = (*stats)(nil)
	_ Component = (*breakdown)(nil)
	_ Component = (*logs)(nil)
)

// peakFLOPS is the configured peak, else the peak of a known device, else 0.
func (m *Model) peakFLOPS() float64 {
	if m.opts.PeakFLOPS > 0 {
		return m.opts.PeakFLOPS
	}
	return PeakFLOPSOf(m.d.device)
}

// PeakFLOPSOf returns the dense bf16 peak FLOP/s of a device named dev (as a session reports
// its device), or 0 when it is not known.
func PeakFLOPSOf(dev string) float64 {
	u := strings.ToUpper(dev)
	switch {
	case strings.Contains(u, "H100"), strings.Contains(u, "H200"):
		return 989e12
	case strings.Contains(u, "A100"):
		return 312e12
	}
	return 0
}

// Init fetches the status, subscribes to events and starts the status poll.
func (m *Model) Init() tea.Cmd {
	cmds := []tea.Cmd{m.fetchStatus(), m.subscribe(), tea.RequestBackgroundColor}
	if m.opts.StatusEvery > 0 {
		cmds = append(cmds, m.statusTick())
	}
	return tea.Batch(cmds...)
}

// Update handles one message.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	if ev, ok := msg.(eventMsg); ok {
		// Events come in bursts; they are drawn with the next frame.
		m.d.applyEvent(ev.ev)
		m.stale = true
		cmd := waitEvent(ev.s)
		if !m.framePending {
			m.framePending = true
			cmd = tea.Batch(cmd, tea.Tick(frameInterval, func(time.Time) tea.Msg { return frameMsg{} }))
		}
		return m, cmd
	}
	m.redraw = true
	return m.update(msg)
}

func (m *Model) update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case frameMsg:
		m.framePending = false
		return m, nil
	case tea.BackgroundColorMsg:
		if m.autoStyles {
			*m.common.Styles = styles.Default(msg.IsDark())
			m.help.Styles = m.common.Styles.Help
		}
		return m, nil
	case tea.WindowSizeMsg:
		m.common.SetSize(msg.Width, msg.Height)
		return m, nil
	case tea.KeyPressMsg:
		return m, m.handleKey(msg)
	case subscribedMsg:
		return m, m.subscribed(msg)
	case eventsEndedMsg:
		return m, m.eventsEnded(msg)
	case resubscribeMsg:
		if m.quitting {
			return m, nil
		}
		return m, tea.Batch(m.subscribe(), m.fetchStatus())
	case statusMsg:
		if msg.err != nil {
			m.opts.Logger.Debug("status", "err", msg.err)
			return m, nil
		}
		m.d.applyStatus(msg.st, msg.asked)
		return m, nil
	case statusTickMsg:
		if m.quitting {
			return m, nil
		}
		return m, tea.Batch(m.fetchStatus(), m.statusTick())
	case actionMsg:
		m.actionDone(msg)
		return m, nil
	case profileMsg:
		m.profileDone(msg)
		return m, nil
	case detachMsg:
		return m, tea.Quit
	}
	return m, nil
}

// View lays the components out for the current size (see frameInterval).
func (m *Model) View() tea.View {
	if m.redraw || m.frame == "" || (m.stale && time.Since(m.framedAt) >= frameInterval) {
		m.frame, m.framedAt, m.stale, m.redraw = m.render(), time.Now(), false, false
	}
	v := tea.NewView(m.frame)
	v.AltScreen = true
	return v
}

// handleKey turns a key press into an action.
func (m *Model) handleKey(k tea.KeyPressMsg) tea.Cmd {
	keys := m.common.Keys
	switch {
	case key.Matches(k, keys.Detach):
		return m.detach()
	case key.Matches(k, keys.Help):
		m.showHelp = !m.showHelp
		return nil
	case m.quitting:
		return nil
	case key.Matches(k, keys.PauseResume):
		return m.pauseResume()
	case key.Matches(k, keys.Step):
		return m.control("stepping", func(ctx context.Context) actionMsg {
			ms, err := m.c.Step(ctx, 1)
			return actionMsg{action: "step", metrics: ms, err: err}
		})
	case key.Matches(k, keys.Profile):
		if m.busy != "" {
			return m.refuseBusy()
		}
		n := m.opts.ProfileSteps
		m.busy = fmt.Sprintf("profiling %d steps", n)
		c, ctx := m.c, m.ctx
		return func() tea.Msg {
			r, err := c.Profile(ctx, n, false)
			return profileMsg{resp: r, err: err}
		}
	case key.Matches(k, keys.TakeOver):
		return m.control("taking control", func(ctx context.Context) actionMsg {
			_, err := m.c.TakeOver(ctx)
			return actionMsg{action: "take-over", err: err}
		})
	}
	return nil
}

// pauseResume pauses a run, resumes a paused one, or starts a run on an idle session.
func (m *Model) pauseResume() tea.Cmd {
	switch m.d.state {
	case stateRunning:
		return m.control("pausing", func(ctx context.Context) actionMsg {
			st, err := m.c.Pause(ctx)
			return actionMsg{action: "pause", st: st, err: err}
		})
	case statePaused:
		return m.control("resuming", func(ctx context.Context) actionMsg {
			st, err := m.c.Resume(ctx)
			return actionMsg{action: "resume", st: st, err: err}
		})
	case stateIdle:
		return m.control("starting a run", func(ctx context.Context) actionMsg {
			st, err := m.c.Run(ctx, 0)
			return actionMsg{action: "run", st: st, err: err}
		})
	case stateEmpty:
		m.setNotice("no model is loaded: load one from the REPL (or start the session with --config)", true)
	default:
		m.setNotice("the session is "+stateWord(m.d.state)+": nothing to pause or resume", true)
	}
	return nil
}

// control runs one control call in the background, unless another is in flight.
func (m *Model) control(busy string, call func(ctx context.Context) actionMsg) tea.Cmd {
	if m.busy != "" {
		return m.refuseBusy()
	}
	m.busy = busy
	ctx := m.ctx
	return func() tea.Msg {
		asked := time.Now()
		a := call(ctx)
		a.asked = asked
		return a
	}
}

// refuseBusy answers a key pressed while a call is in flight: one call at a time.
func (m *Model) refuseBusy() tea.Cmd {
	m.refused = true
	return nil
}

func (m *Model) setNotice(s string, failed bool) { m.notice, m.failed, m.refused = s, failed, false }

// actionDone shows the outcome of a control call.
func (m *Model) actionDone(a actionMsg) {
	m.busy = ""
	if a.err != nil {
		m.setNotice(a.action+" failed: "+errText(a.err), true)
		return
	}
	// A successful control call makes this client the controller.
	m.d.controller = m.d.self
	if a.st != nil {
		m.d.applyStatus(a.st, a.asked)
	}
	switch a.action {
	case "pause":
		m.setNotice(fmt.Sprintf("paused after step %d", m.d.step), false)
	case "resume":
		m.setNotice("resumed", false)
	case "run":
		m.setNotice(fmt.Sprintf("started a run to step %d", m.d.total), false)
	case "take-over":
		m.setNotice("this client now controls the session", false)
	case "step":
		for _, s := range a.metrics {
			m.d.applyMetrics(s)
		}
		if n := len(a.metrics); n > 0 {
			s := a.metrics[n-1]
			m.setNotice(fmt.Sprintf("stepped to %d: loss %s", s.Step, fmtLoss(s.Loss)), false)
		}
	}
}

// profileDone shows a profile's result: the mean breakdown of its steps.
func (m *Model) profileDone(p profileMsg) {
	m.busy = ""
	if p.err != nil {
		m.setNotice("profile failed: "+errText(p.err), true)
		return
	}
	m.d.controller = m.d.self
	if p.resp == nil || len(p.resp.Steps) == 0 {
		m.setNotice("profile returned no steps", true)
		return
	}
	v := meanProfile(p.resp.Steps)
	m.d.profile, m.d.profiledTo = v, p.resp.Steps[len(p.resp.Steps)-1].Step
	for _, s := range p.resp.Steps {
		m.d.applyMetrics(s.Metrics)
	}
	share := 0.0
	if v.stepS > 0 {
		share = 100 * v.spanSum() / v.stepS
	}
	m.setNotice(fmt.Sprintf("profiled %s: %s per step, parts add up to %.1f%%", v.label, fmtSeconds(v.stepS), share), false)
}

// detach ends the TUI, giving up control if it held it; the session keeps running.
func (m *Model) detach() tea.Cmd {
	if m.quitting {
		return tea.Quit
	}
	m.quitting = true
	m.busy = "detaching"
	if !m.d.isController() {
		m.cancel()
		return tea.Quit
	}
	c, cancel := m.c, m.cancel
	return func() tea.Msg {
		ctx, done := context.WithTimeout(context.Background(), 2*time.Second)
		defer done()
		_ = c.Release(ctx)
		cancel()
		return detachMsg{}
	}
}

// errText is an error's message without the RPC code prefix's noise.
func errText(err error) string {
	s := err.Error()
	for _, p := range []string{"failed_precondition: ", "unavailable: ", "invalid_argument: ", "internal: ", "canceled: "} {
		s = strings.TrimPrefix(s, p)
	}
	return s
}

// render lays the dashboard out at the current size. From the top: header, charts, stats,
// breakdown, log, status line, help. When the height runs short the log goes first, then the
// charts shrink, then they go; when the width runs short the charts stack.
func (m *Model) render() string {
	w, h := m.common.Width, m.common.Height
	if w <= 0 || h <= 0 {
		return ""
	}
	m.resize()
	header := m.header.View()
	footer := m.footer(w)
	statsH := 2
	if m.d.last != nil && len(m.d.last.GetExpertLoad()) > 0 {
		statsH = 3 // room for the expert load of a MoE run
	}
	m.stats.SetSize(w, statsH)
	m.breakdown.SetSize(w, 4)
	stats, brk := m.stats.View(), m.breakdown.View()
	fixed := lineCount(header) + lineCount(footer)
	rest := h - fixed
	// The middle blocks in order of importance: stats, breakdown, charts, log.
	if rest < lineCount(stats) {
		stats = fitLines(stats, w, max(rest, 0))
	}
	rest -= lineCount(stats)
	if rest < lineCount(brk) {
		brk = fitLines(brk, w, max(rest, 0))
	}
	rest -= lineCount(brk)
	chartsH := 0
	switch {
	case rest >= 6:
		chartsH = min(max(rest*3/5, 4), 18)
	case rest >= 3:
		chartsH = rest
	}
	logsH := rest - chartsH
	blocks := []string{header}
	if chartsH > 0 {
		blocks = append(blocks, m.charts(w, chartsH))
	}
	blocks = append(blocks, stats, brk)
	if logsH >= 2 {
		m.logs.SetSize(w, logsH)
		blocks = append(blocks, m.logs.View())
	}
	blocks = append(blocks, footer)
	var nonEmpty []string
	for _, b := range blocks {
		if b != "" {
			nonEmpty = append(nonEmpty, b)
		}
	}
	return fitLines(strings.Join(nonEmpty, "\n"), w, h)
}

// resize gives the shared size to the components that fill the width.
func (m *Model) resize() {
	w := m.common.Width
	m.header.SetSize(w, 1)
	m.help.SetWidth(w)
}

// charts draws the loss and lr charts in h lines: side by side when there is room, stacked
// when narrow (the lr chart goes first when there is not room for both).
func (m *Model) charts(w, h int) string {
	if w >= 60 {
		lw := (w - 1) / 2
		m.loss.SetSize(lw, h)
		m.lr.SetSize(w-lw-1, h)
		return lipgloss.JoinHorizontal(lipgloss.Top, m.loss.View(), " ", m.lr.View())
	}
	if h < 8 {
		m.loss.SetSize(w, h)
		return m.loss.View()
	}
	lh := h * 3 / 5
	m.loss.SetSize(w, lh)
	m.lr.SetSize(w, h-lh)
	return m.loss.View() + "\n" + m.lr.View()
}

// footer is the status line (action in flight, outcome of the last one) and the key help.
func (m *Model) footer(w int) string {
	st := m.common.Styles
	var status string
	switch {
	case m.busy != "":
		status = st.Notice.Render(m.busy + "…")
		if m.refused {
			status += st.Error.Render(" one action at a time: wait for it")
		}
	case m.notice != "" && m.failed:
		status = st.Error.Render(m.notice)
	case m.notice != "":
		status = st.Notice.Render(m.notice)
	case !m.d.connected:
		status = st.Muted.Render("connecting to the session…")
	}
	var hv string
	if m.showHelp {
		hv = m.help.FullHelpView(m.common.Keys.FullHelp())
	} else {
		hv = m.help.ShortHelpView(m.common.Keys.ShortHelp())
	}
	return fitLines(status, w, 1) + "\n" + fitLines(hv, w, 4)
}
