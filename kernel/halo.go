package kernel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"html"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/halo-shell/halo-shell/cell"
	"github.com/halo-shell/halo-shell/session"
)

// HaloOptions configure the notebook interpreter.
type HaloOptions struct {
	// Session is the session to attach to (a name, a socket path or tcp://HOST:PORT; default
	// session.DefaultName). A named session that does not answer is started.
	Session string
	// ClientID identifies the kernel to the session. Use StableClientID(key) so that a
	// restarted kernel of the same notebook keeps control of the session.
	ClientID string
	// Start says how to start a session that is not running.
	Start session.StartOptions
	// WorkerCommand runs the cells' interpreter process (default: this executable with the
	// argument cell-worker).
	WorkerCommand []string
}

// StableClientID derives a session client id from a connection file's key: Jupyter keeps the
// key across restarts of one notebook's kernel, so the restarted kernel is the same client to
// the session (and keeps control of it), while other notebooks are other clients. An empty key
// gives a random id.
func StableClientID(key string) string {
	if key == "" {
		return "kernel-" + session.NewClientID()
	}
	h := sha256.Sum256([]byte("halo-shell kernel client\x00" + key))
	return "kernel-" + hex.EncodeToString(h[:8])
}

// Halo is the notebook Interpreter: Go cells and % magics run by package cell against an
// engine session, with live progress for cells that train.
//
// Cells that step or run the session (%step, %run, halo.Step, halo.Run...) show a progress
// display updated in place (update_display_data) from the session's metrics events; %run
// follows the background run until it stops, and interrupting the cell stops the following,
// not the run (use %pause for that).
type Halo struct {
	it  cell.Evaluator
	opt HaloOptions

	mu  sync.Mutex
	out *Output // the running cell's output; nil between cells
}

// NewHalo returns the notebook interpreter. It attaches to the session on first use.
func NewHalo(o HaloOptions) (*Halo, error) {
	if o.Session == "" {
		o.Session = session.DefaultName
	}
	if o.ClientID == "" {
		o.ClientID = session.NewClientID()
	}
	h := &Halo{opt: o}
	// Cells run in a child process, so that one that overflows its stack or its memory ends
	// the child (reported as the cell's error, and replaced) while the kernel goes on.
	it, err := cell.NewSupervised(cell.SupervisedOptions{Options: cell.Options{
		Session:    o.Session,
		ClientName: "kernel",
		Stdout:     routeWriter{h, false},
		Stderr:     routeWriter{h, true},
		OnDisplay: func(b cell.Bundle) {
			if out := h.current(); out != nil {
				out.Display(Bundle(b), "")
			}
		},
	}, ClientID: o.ClientID, Start: o.Start, Command: o.WorkerCommand})
	if err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	h.it = it
	return h, nil
}

func (h *Halo) current() *Output {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.out
}

// routeWriter sends the interpreter's standard streams to the running cell.
type routeWriter struct {
	h      *Halo
	stderr bool
}

func (w routeWriter) Write(p []byte) (int, error) {
	out := w.h.current()
	if out == nil {
		return len(p), nil
	}
	if w.stderr {
		return out.Stderr().Write(p)
	}
	return out.Stdout().Write(p)
}

// Execute runs one cell.
func (h *Halo) Execute(ctx context.Context, code string, out *Output) (Bundle, error) {
	h.mu.Lock()
	h.out = out
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.out = nil
		h.mu.Unlock()
	}()
	kind := progressKind(code)
	var (
		f *follower
		c *session.Client
	)
	if kind != noProgress {
		if cl, err := h.it.Session(); err == nil {
			c = cl
			f = follow(ctx, c, out)
		}
	}
	res, err := h.it.Eval(ctx, code)
	var final *session.StatusResponse
	if f != nil {
		if err == nil && kind == runProgress {
			final = f.untilStopped(ctx, c)
		}
		f.stop()
	}
	if err != nil {
		return nil, cellError(err)
	}
	if final != nil && endsWithRun(code) {
		// The command's own result is the status when the run started; show how it ended.
		return runEnded(final), nil
	}
	if res.Value == nil {
		return nil, nil
	}
	return Bundle(res.Value), nil
}

// cellError turns the interpreter's error into the notebook's error output.
func cellError(err error) error {
	var ce *cell.Error
	if !errors.As(err, &ce) {
		return err
	}
	name := map[cell.ErrorKind]string{
		cell.KindCompile:     "CompileError",
		cell.KindPanic:       "Panic",
		cell.KindAPI:         "SessionError",
		cell.KindInterrupted: "Interrupted",
		cell.KindCrash:       "InterpreterCrash",
	}[ce.Kind]
	if name == "" {
		name = "Error"
	}
	tb := []string{"\x1b[0;31m" + name + "\x1b[0m: " + firstLine(ce.Message)}
	if rest := strings.SplitN(ce.Message, "\n", 2); len(rest) == 2 {
		tb = append(tb, strings.Split(rest[1], "\n")...)
	}
	tb = append(tb, ce.Trace...)
	return &Error{Name: name, Value: ce.Message, Traceback: tb}
}

// Complete completes Go names, package members and magics.
func (h *Halo) Complete(code string, cursor int) ([]string, int, int) {
	if c, ok := any(h.it).(interface {
		Complete(src string, cursor int) (int, []string)
	}); ok {
		start, ms := c.Complete(code, cursor)
		return ms, start, cursor
	}
	return nil, cursor, cursor
}

// Inspect documents the magic at the cursor (%step, %set, ...).
func (h *Halo) Inspect(code string, cursor, detail int) (Bundle, bool) {
	lineStart := strings.LastIndexByte(code[:cursor], '\n') + 1
	line := code[lineStart:]
	if i := strings.IndexByte(line, '\n'); i >= 0 {
		line = line[:i]
	}
	t := strings.TrimSpace(line)
	if t == "" || (t[0] != '%' && t[0] != ':') {
		return nil, false
	}
	name, _, _ := strings.Cut(t[1:], " ")
	for _, c := range cell.Commands() {
		if c.Name == strings.ToLower(name) {
			doc := cell.Help("%", c.Name)
			return Bundle{"text/plain": []byte(doc), "text/html": []byte("<pre>" + html.EscapeString(doc) + "</pre>")}, true
		}
	}
	return nil, false
}

// Shutdown gives up control of the session when the kernel stops for good (not on restart,
// so that the restarted kernel goes on controlling it).
func (h *Halo) Shutdown(restart bool) {
	if restart {
		return
	}
	if ok, _ := h.it.Attached(); !ok {
		return
	}
	if c, err := h.it.Session(); err == nil {
		// The interpreter first, so that nothing renews control after it is released.
		h.it.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = c.Release(ctx)
	}
}

// Close detaches from the session, which keeps running.
func (h *Halo) Close() error { return h.it.Close() }

type progress int

const (
	noProgress   progress = iota
	stepProgress          // steps run while the cell runs
	runProgress           // a background run starts; follow it until it stops
)

// progressKind says whether a cell trains: a %step or %run magic, or a halo.Step or halo.Run
// call.
func progressKind(code string) progress {
	k := noProgress
	for _, line := range strings.Split(code, "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "%") || strings.HasPrefix(t, ":") {
			c, err := cell.ParseCommand(t)
			if err != nil {
				continue
			}
			switch c.Name {
			case "run", "resume":
				return runProgress
			case "step", "profile":
				k = stepProgress
			}
			continue
		}
		if strings.Contains(t, "halo.Run") || strings.Contains(t, "halo.Resume") {
			return runProgress
		}
		if strings.Contains(t, "halo.Step") || strings.Contains(t, "halo.Profile") {
			k = stepProgress
		}
	}
	return k
}

// follower shows the metrics of steps as they happen in one display, updated in place.
type follower struct {
	out    *Output
	id     string
	cancel context.CancelFunc
	done   chan struct{}
	state  chan struct{} // a state event arrived
}

// follow subscribes to the session's events for the duration of a cell.
func follow(ctx context.Context, c *session.Client, out *Output) *follower {
	fctx, cancel := context.WithCancel(ctx)
	ch, _, err := c.Events(fctx, 1024)
	if err != nil {
		cancel()
		return nil
	}
	f := &follower{out: out, id: "halo-progress-" + session.NewClientID(), cancel: cancel,
		done: make(chan struct{}), state: make(chan struct{}, 1)}
	go f.loop(ch)
	return f
}

func (f *follower) loop(ch <-chan *session.Event) {
	defer close(f.done)
	var (
		shown    bool
		last     time.Time
		pending  *session.StepMetrics
		steps    int
		lastStep int64 = -1
	)
	flush := func() {
		if pending == nil {
			return
		}
		b := progressBundle(pending, steps)
		if !shown {
			f.out.Display(b, f.id)
			shown = true
		} else {
			f.out.UpdateDisplay(b, f.id)
		}
		pending, last = nil, time.Now()
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				flush()
				return
			}
			m := ev.GetMetrics()
			if m == nil {
				if p := ev.GetProfile(); p != nil {
					m = p.Metrics
				}
			}
			if m != nil {
				// A profiled step arrives twice, as metrics and as a profile carrying the
				// same metrics: count each step once.
				if m.Step != lastStep {
					steps++
					lastStep = m.Step
				}
				pending = m
				if time.Since(last) > 200*time.Millisecond {
					flush()
				}
			}
			if ev.GetState() != nil {
				select {
				case f.state <- struct{}{}:
				default:
				}
			}
		case <-tick.C:
			flush()
		}
	}
}

// untilStopped waits until the session is no longer running and returns its status; nil when
// the cell was interrupted or the session did not answer.
func (f *follower) untilStopped(ctx context.Context, c *session.Client) *session.StatusResponse {
	for {
		st, err := c.Status(ctx)
		if err != nil {
			return nil
		}
		if st.State != session.StateRunning {
			return st
		}
		select {
		case <-f.state:
		case <-time.After(time.Second):
		case <-ctx.Done():
			return nil
		}
	}
}

// endsWithRun reports whether the last line of a cell is a %run or %resume command.
func endsWithRun(code string) bool {
	lines := strings.Split(strings.TrimSpace(code), "\n")
	c, err := cell.ParseCommand(strings.TrimSpace(lines[len(lines)-1]))
	return err == nil && (c.Name == "run" || c.Name == "resume")
}

// runEnded describes the session after a followed run.
func runEnded(st *session.StatusResponse) Bundle {
	state := strings.ToLower(strings.TrimPrefix(st.State.String(), "STATE_"))
	s := fmt.Sprintf("run ended: session %s %s at step %d/%d", st.Name, state, st.Step, st.TotalSteps)
	if m := st.LastMetrics; m != nil {
		s += fmt.Sprintf(", loss %.4f", m.Loss)
	}
	if st.LastError != "" {
		s += "\nlast error: " + st.LastError
	}
	return Bundle{"text/plain": []byte(s)}
}

// stop ends the subscription after showing the last metrics.
func (f *follower) stop() {
	time.Sleep(50 * time.Millisecond) // let the last step's event arrive
	f.cancel()
	<-f.done
}

// progressBundle renders one step's metrics for the live progress display.
func progressBundle(m *session.StepMetrics, steps int) Bundle {
	fields := [][2]string{
		{"step", fmt.Sprint(m.Step)},
		{"loss", fmt.Sprintf("%.4f", m.Loss)},
		{"lr", fmt.Sprintf("%.3g", m.Lr)},
		{"grad norm", fmt.Sprintf("%.3g", m.GradNorm)},
		{"tok/s", fmt.Sprintf("%.0f", m.TokensPerS)},
		{"s/step", fmt.Sprintf("%.3f", m.StepTimeS)},
		{"steps in this cell", fmt.Sprint(steps)},
	}
	var t, hb strings.Builder
	hb.WriteString(`<table class="halo-progress"><tr>`)
	for i, f := range fields {
		if i > 0 {
			t.WriteString("  ")
		}
		fmt.Fprintf(&t, "%s %s", f[0], f[1])
		fmt.Fprintf(&hb, "<th>%s</th>", html.EscapeString(f[0]))
	}
	hb.WriteString("</tr><tr>")
	for _, f := range fields {
		fmt.Fprintf(&hb, "<td>%s</td>", html.EscapeString(f[1]))
	}
	hb.WriteString("</tr></table>")
	return Bundle{"text/plain": []byte(t.String()), "text/html": []byte(hb.String())}
}

var _ io.Writer = routeWriter{}
