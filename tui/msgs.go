package tui

import (
	"context"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/halo-shell/halo-shell/session"
)

// Session states, short names.
const (
	stateEmpty   = session.StateEmpty
	stateIdle    = session.StateIdle
	stateRunning = session.StateRunning
	statePaused  = session.StatePaused
)

// eventMsg is one session event, with the channel it came from so that the next wait reads
// the same stream.
type eventMsg struct {
	ev *session.Event
	s  stream
}

// stream is an event subscription: the channel and the function that says why it ended.
type stream struct {
	ch  <-chan *session.Event
	end func() error
}

// eventsEndedMsg says the event stream ended (err nil: the session closed it).
type eventsEndedMsg struct{ err error }

// subscribedMsg is the outcome of subscribing to events.
type subscribedMsg struct {
	ch  <-chan *session.Event
	end func() error
	err error
}

// resubscribeMsg asks to subscribe again after the stream ended.
type resubscribeMsg struct{}

// statusMsg is the outcome of a Status call.
type statusMsg struct {
	st    *session.StatusResponse
	asked time.Time
	err   error
}

// statusTickMsg asks for the next status poll.
type statusTickMsg struct{}

// actionMsg is the outcome of a control call (pause, resume, run, step, take-over).
type actionMsg struct {
	action  string
	asked   time.Time
	st      *session.StatusResponse
	metrics []*session.StepMetrics
	err     error
}

// profileMsg is the outcome of a Profile call.
type profileMsg struct {
	resp *session.ProfileResponse
	err  error
}

// frameMsg asks for a frame with the events that arrived since the last one.
type frameMsg struct{}

// detachMsg says control was given up and the program may quit.
type detachMsg struct{}

// waitEvent is the pump: a command that waits for the next event of ch and delivers it as one
// message; Update answers each eventMsg with the next waitEvent, so events arrive in order, one
// at a time.
func waitEvent(s stream) tea.Cmd {
	return func() tea.Msg {
		ev, ok := <-s.ch
		if !ok {
			var err error
			if s.end != nil {
				err = s.end()
			}
			return eventsEndedMsg{err: err}
		}
		return eventMsg{ev: ev, s: s}
	}
}

func (m *Model) subscribe() tea.Cmd {
	c, ctx, buf := m.c, m.ctx, m.opts.EventBuffer
	return func() tea.Msg {
		ch, end, err := c.EventsWithHistory(ctx, buf, maxHistory)
		return subscribedMsg{ch: ch, end: end, err: err}
	}
}

func (m *Model) subscribed(s subscribedMsg) tea.Cmd {
	if s.err != nil {
		return m.eventsEnded(eventsEndedMsg{err: s.err})
	}
	m.d.connected, m.streamErr = true, ""
	return waitEvent(stream{ch: s.ch, end: s.end})
}

// eventsEnded marks the view disconnected and subscribes again a little later.
func (m *Model) eventsEnded(e eventsEndedMsg) tea.Cmd {
	if m.quitting {
		return nil
	}
	msg := "event stream ended"
	if e.err != nil {
		msg += ": " + errText(e.err)
	}
	// Say it once, not at every retry.
	if m.d.connected || msg != m.streamErr {
		m.d.addLog(time.Now(), "warn", msg+"; reconnecting")
	}
	m.streamErr = msg
	m.d.connected = false
	return tea.Tick(m.opts.ReconnectEvery, func(time.Time) tea.Msg { return resubscribeMsg{} })
}

func (m *Model) fetchStatus() tea.Cmd {
	c, ctx := m.c, m.ctx
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		asked := time.Now()
		st, err := c.Status(ctx)
		return statusMsg{st: st, asked: asked, err: err}
	}
}

func (m *Model) statusTick() tea.Cmd {
	return tea.Tick(m.opts.StatusEvery, func(time.Time) tea.Msg { return statusTickMsg{} })
}
