package server

import (
	"context"
	"fmt"
	"sort"
	"time"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connectproto"

	"github.com/halo-shell/halo-shell/internal/switches"
	"github.com/halo-shell/halo-shell/session"
	halov1 "github.com/halo-shell/halo-shell/session/proto/halo/v1"
)

// Clients and control.
//
// Every call carrying a client id enters the client table for its duration (clientRec.active
// counts calls and streams in progress, lastSeen is the last time one began or ended). A
// client is alive while it has a call or stream in progress, or for the control lease after
// its last one. The controller keeps control only while alive: a session client that controls
// renews its lease (a Claim every session.LeaseRenewEvery), so a controller that was killed,
// or whose machine vanished (HTTP/2 pings close its connections), loses control within the
// lease and anyone may then claim it. Clients that are not alive are forgotten by the janitor,
// so one-shot clients (session status, list) leave the table within seconds.

var swControlLease = switches.Register(switches.Switch{Name: "HALO_CONTROL_LEASE", Kind: switches.Tuning, Default: "6s",
	Doc: "How long a session keeps a controlling client that has no call or stream in progress and has stopped renewing its lease (a Go duration, at least 3s; clients renew every 2s)."})

// minControlLease keeps the lease above the clients' renewal period with room for one late
// renewal.
const minControlLease = 3 * time.Second

// maxClients bounds the client table; ids beyond it are served but not listed.
const maxClients = 4096

type clientRec struct {
	name      string
	connected time.Time
	lastSeen  time.Time
	active    int // calls and streams in progress
}

// controlLease is the lease from HALO_CONTROL_LEASE (the default when it does not parse).
func controlLease() time.Duration {
	d, err := time.ParseDuration(swControlLease.Value())
	if err != nil {
		d, _ = time.ParseDuration(swControlLease.Default)
	}
	return max(d, minControlLease)
}

func (s *Server) aliveLocked(c *clientRec, now time.Time) bool {
	return c != nil && (c.active > 0 || now.Sub(c.lastSeen) < s.lease)
}

// enter records that client id began a call and returns the function that ends it.
func (s *Server) enter(id, name string) func() {
	if id == "" || len(id) > 128 {
		return func() {}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.touchLocked(id, name)
	if c == nil {
		return func() {}
	}
	c.active++
	return func() {
		s.mu.Lock()
		c.active--
		c.lastSeen = time.Now()
		s.mu.Unlock()
	}
}

// seen records a client's name (Control calls carry it in the request).
func (s *Server) seen(id, name string) {
	if id == "" || len(id) > 128 {
		return
	}
	s.mu.Lock()
	s.touchLocked(id, name)
	s.mu.Unlock()
}

// touchLocked finds or adds client id and marks it seen now; nil when the table is full.
func (s *Server) touchLocked(id, name string) *clientRec {
	now := time.Now()
	c := s.clients[id]
	if c == nil {
		if len(s.clients) >= maxClients {
			return nil
		}
		c = &clientRec{connected: now}
		s.clients[id] = c
	}
	c.lastSeen = now
	if name != "" && len(name) <= 128 {
		c.name = name
	}
	return c
}

// expireLocked releases control from a controller that is no longer alive and returns the
// reason to publish ("" when control did not change).
func (s *Server) expireLocked(now time.Time) string {
	if s.controller == "" {
		return ""
	}
	c := s.clients[s.controller]
	if s.aliveLocked(c, now) {
		return ""
	}
	desc := s.describeLocked(s.controller)
	s.log.Info("control released: the controller is gone", "client", s.controller, "lease", s.lease)
	s.controller = ""
	return fmt.Sprintf("control released: client %s is gone (no call, stream or renewal for %s)", desc, s.lease)
}

// expireControl is expireLocked with the lock taken and the state event published.
func (s *Server) expireControl() {
	s.mu.Lock()
	reason := s.expireLocked(time.Now())
	s.mu.Unlock()
	s.publishControl("", reason)
}

// publishControl tells observers that control changed.
func (s *Server) publishControl(now, reason string) {
	if reason == "" {
		return
	}
	snap := s.eng.snapshot()
	s.hub.publish(&halov1.Event{Kind: &halov1.Event_State{State: &halov1.StateEvent{State: snap.state, Step: snap.step, Controller: now, Reason: reason}}})
}

// janitor expires a gone controller and forgets clients that are no longer alive, every
// second until stop is closed.
func (s *Server) janitor(stop <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		now := time.Now()
		s.mu.Lock()
		reason := s.expireLocked(now)
		for id, c := range s.clients {
			if id != s.controller && !s.aliveLocked(c, now) {
				delete(s.clients, id)
			}
		}
		s.mu.Unlock()
		s.publishControl("", reason)
	}
}

func clientID(ctx context.Context) string {
	if info, ok := connect.CallInfoForServerContext(ctx); ok {
		return info.RequestHeader().Get(session.HeaderClientID)
	}
	return ""
}

// requireControl lets a control call through when its client is the controller, making it the
// controller when nobody is (or when the controller is gone).
func (s *Server) requireControl(ctx context.Context) error {
	id := clientID(ctx)
	if id == "" {
		return connect.NewError(connect.CodeInvalidArgument, "session: control calls need a client id (header "+session.HeaderClientID+")")
	}
	s.mu.Lock()
	expired := s.expireLocked(time.Now())
	var err error
	taken := ""
	switch s.controller {
	case "":
		s.controller = id
		s.log.Info("client took control", "client", id)
		taken = "control taken by " + s.describeLocked(id)
	case id:
	default:
		err = s.notControllerLocked()
	}
	now := s.controller
	s.mu.Unlock()
	s.publishControl("", expired)
	s.publishControl(now, taken)
	return err
}

// TakeOverHint names every way to take control, for refusals.
const TakeOverHint = "to take control: `:takeover` in the REPL (or `halo-shell repl --take-over`), `%takeover` in a notebook, halo.TakeOver() in a cell, `t` in the TUI; control also passes on by itself within seconds when its holder exits"

// notControllerLocked is the refusal of a control call, naming the controller and how long
// ago it last called.
func (s *Server) notControllerLocked() error {
	idle := ""
	if c := s.clients[s.controller]; c != nil {
		switch {
		case c.active > 0:
			idle = ", busy with a call"
		default:
			idle = fmt.Sprintf(", last call %s ago", time.Since(c.lastSeen).Round(time.Second))
		}
	}
	err := connect.Errorf(connect.CodeFailedPrecondition, "session %q is controlled by client %s%s; observe, or %s", s.o.Name, s.describeLocked(s.controller), idle, TakeOverHint)
	nc := &halov1.NotController{Controller: s.controller}
	if c := s.clients[s.controller]; c != nil {
		nc.ControllerName = c.name
	}
	if d, derr := connectproto.NewErrorDetail(nc); derr == nil {
		err = err.WithDetail(d)
	}
	return err
}

func (s *Server) describeLocked(id string) string {
	if c := s.clients[id]; c != nil && c.name != "" {
		return fmt.Sprintf("%s (%s)", id, c.name)
	}
	return id
}

// clientsLocked lists the clients that are alive, oldest first.
func (s *Server) clientsLocked(now time.Time) []*halov1.ClientInfo {
	var out []*halov1.ClientInfo
	for id, c := range s.clients {
		if id != s.controller && !s.aliveLocked(c, now) {
			continue
		}
		out = append(out, &halov1.ClientInfo{Id: id, Name: c.name, Controller: id == s.controller, ConnectedUnixMs: c.connected.UnixMilli()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ConnectedUnixMs < out[j].ConnectedUnixMs })
	return out
}

func (s *Server) currentController() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.controller
}
