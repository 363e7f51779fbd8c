package server

import (
	"sync"
	"time"

	halov1 "github.com/halo-shell/halo-shell/session/proto/halo/v1"
)

// DefaultEventBuffer is an observer's buffer when it asks for none.
const DefaultEventBuffer = 256

// maxEventBuffer bounds what an observer may ask for.
const maxEventBuffer = 1 << 16

// maxMetricsHistory is how many of the latest metrics events the hub keeps for observers that
// ask for history when they subscribe.
const maxMetricsHistory = 4096

// reasonLoaded is the reason of the state event that a newly loaded model publishes; the
// metrics history starts again from it.
const reasonLoaded = "loaded"

// hub fans events out to observers. publish never blocks: each observer has a bounded queue
// that drops its oldest event when full and counts the drops.
type hub struct {
	mu     sync.Mutex
	seq    int64
	subs   map[*subscriber]struct{}
	closed bool
	// history holds the latest metrics events of the loaded model, oldest first.
	history []*halov1.Event
}

type subscriber struct {
	mu      sync.Mutex
	queue   []*halov1.Event
	max     int
	dropped int64
	closed  bool
	notify  chan struct{} // capacity 1: "something changed"
}

func newHub() *hub { return &hub{subs: map[*subscriber]struct{}{}} }

// subscribe adds an observer with a buffer of n events (DefaultEventBuffer when n <= 0).
func (h *hub) subscribe(n int) *subscriber {
	s, _ := h.subscribeWithHistory(n, 0)
	return s
}

// subscribeWithHistory is subscribe that also returns up to past of the latest metrics
// events, oldest first: exactly those published before the subscription, so that none is
// both in the history and in the subscriber's queue, and none is in neither.
func (h *hub) subscribeWithHistory(n, past int) (*subscriber, []*halov1.Event) {
	if n <= 0 {
		n = DefaultEventBuffer
	}
	n = min(n, maxEventBuffer)
	s := &subscriber{max: n, notify: make(chan struct{}, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	var hist []*halov1.Event
	if past > 0 {
		hist = append(hist, h.history[max(0, len(h.history)-past):]...)
	}
	if h.closed {
		s.closed = true
		s.wake()
		return s, hist
	}
	h.subs[s] = struct{}{}
	return s, hist
}

func (h *hub) unsubscribe(s *subscriber) {
	h.mu.Lock()
	delete(h.subs, s)
	h.mu.Unlock()
}

// observers is the number of subscribers.
func (h *hub) observers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// publish stamps ev with the next sequence number and the time and queues it for every
// observer.
func (h *hub) publish(ev *halov1.Event) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.seq++
	ev.Seq = h.seq
	ev.UnixMs = time.Now().UnixMilli()
	switch {
	case ev.GetMetrics() != nil:
		if len(h.history) >= maxMetricsHistory {
			h.history = append(h.history[:0], h.history[len(h.history)-maxMetricsHistory+1:]...)
		}
		h.history = append(h.history, ev)
	case ev.GetState().GetReason() == reasonLoaded:
		h.history = nil
	}
	subs := make([]*subscriber, 0, len(h.subs))
	for s := range h.subs {
		subs = append(subs, s)
	}
	h.mu.Unlock()
	for _, s := range subs {
		s.push(ev)
	}
}

// close ends every subscription (after their queued events).
func (h *hub) close() {
	h.mu.Lock()
	h.closed = true
	subs := h.subs
	h.subs = map[*subscriber]struct{}{}
	h.mu.Unlock()
	for s := range subs {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.wake()
	}
}

func (s *subscriber) wake() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

func (s *subscriber) push(ev *halov1.Event) {
	s.mu.Lock()
	if len(s.queue) >= s.max {
		copy(s.queue, s.queue[1:])
		s.queue = s.queue[:len(s.queue)-1]
		s.dropped++
	}
	s.queue = append(s.queue, ev)
	s.mu.Unlock()
	s.wake()
}

// take returns the queued events, preceded by a DroppedEvent when some were dropped since the
// last take, and whether the subscription has ended.
func (s *subscriber) take() ([]*halov1.Event, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*halov1.Event
	if s.dropped > 0 {
		out = append(out, &halov1.Event{UnixMs: time.Now().UnixMilli(), Kind: &halov1.Event_Dropped{Dropped: &halov1.DroppedEvent{Count: s.dropped}}})
		s.dropped = 0
	}
	out = append(out, s.queue...)
	s.queue = s.queue[:0:0]
	return out, s.closed
}
