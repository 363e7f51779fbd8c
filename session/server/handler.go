package server

import (
	"context"
	"time"

	"connectrpc.com/connect/v2"

	"github.com/halo-shell/halo-shell/session"
	halov1 "github.com/halo-shell/halo-shell/session/proto/halo/v1"
	"github.com/halo-shell/halo-shell/session/proto/halo/v1/halov1connect"
)

// handler implements the RPCs: control calls check the controller, then submit a command to
// the engine goroutine; read-only calls read the engine's snapshot.
type handler struct {
	halov1connect.UnimplementedSessionServiceHandler
	s *Server
}

var _ halov1connect.SessionServiceHandler = (*handler)(nil)

// control checks the caller controls the session, then runs fn on the engine goroutine.
func control[T any](h *handler, ctx context.Context, fn func(c *command) (any, error)) (T, error) {
	var zero T
	if err := h.s.requireControl(ctx); err != nil {
		return zero, err
	}
	return engineCall[T](h, ctx, fn)
}

func engineCall[T any](h *handler, ctx context.Context, fn func(c *command) (any, error)) (T, error) {
	var zero T
	v, err := h.s.eng.submit(ctx, fn)
	if err != nil {
		return zero, err
	}
	r, ok := v.(T)
	if !ok {
		return zero, connect.Errorf(connect.CodeInternal, "session: internal error: reply of type %T", v)
	}
	return r, nil
}

func (h *handler) Load(ctx context.Context, r *halov1.LoadRequest) (*halov1.LoadResponse, error) {
	var confine func(what, path string) (string, error)
	if isTCP(ctx) {
		confine = h.s.confine
		if _, err := confine("config", r.ConfigPath); err != nil {
			return nil, err
		}
	}
	resp, err := control[*halov1.LoadResponse](h, ctx, func(*command) (any, error) { return h.s.eng.cmdLoad(r, confine) })
	if err != nil {
		return nil, scrubError(err)
	}
	resp.Status = h.s.status()
	return resp, nil
}

func (h *handler) Step(ctx context.Context, r *halov1.StepRequest) (*halov1.StepResponse, error) {
	return control[*halov1.StepResponse](h, ctx, func(c *command) (any, error) { return h.s.eng.cmdStep(c, int(r.N)) })
}

func (h *handler) Run(ctx context.Context, r *halov1.RunRequest) (*halov1.RunResponse, error) {
	_, err := control[*halov1.StatusResponse](h, ctx, func(*command) (any, error) { return h.s.eng.cmdRun(r.MaxSteps) })
	if err != nil {
		return nil, err
	}
	return &halov1.RunResponse{Status: h.s.status()}, nil
}

func (h *handler) Pause(ctx context.Context, _ *halov1.PauseRequest) (*halov1.PauseResponse, error) {
	if _, err := control[*halov1.StatusResponse](h, ctx, func(*command) (any, error) { return h.s.eng.cmdPause() }); err != nil {
		return nil, err
	}
	return &halov1.PauseResponse{Status: h.s.status()}, nil
}

func (h *handler) Resume(ctx context.Context, _ *halov1.ResumeRequest) (*halov1.ResumeResponse, error) {
	if _, err := control[*halov1.StatusResponse](h, ctx, func(*command) (any, error) { return h.s.eng.cmdResume() }); err != nil {
		return nil, err
	}
	return &halov1.ResumeResponse{Status: h.s.status()}, nil
}

func (h *handler) Eval(ctx context.Context, _ *halov1.EvalRequest) (*halov1.EvalResponse, error) {
	return control[*halov1.EvalResponse](h, ctx, func(c *command) (any, error) { return h.s.eng.cmdEval(c.ctx) })
}

func (h *handler) Generate(ctx context.Context, r *halov1.GenerateRequest, st halov1connect.SessionServiceGenerateServerStream) error {
	if err := h.s.requireControl(ctx); err != nil {
		return err
	}
	if r.MaxNewTokens <= 0 || r.MaxNewTokens > 4096 {
		return connect.Errorf(connect.CodeInvalidArgument, "session: generate: max_new_tokens must be between 1 and 4096, got %d", r.MaxNewTokens)
	}
	if r.Temperature < 0 || r.TopK < 0 || r.TopP < 0 || r.TopP > 1 {
		return connect.NewError(connect.CodeInvalidArgument, "session: generate: temperature, top_k must be >= 0 and top_p within [0, 1]")
	}
	// The engine fills out (sized for every token, so it never waits) and never closes it.
	out := make(chan *halov1.GenerateResponse, int(r.MaxNewTokens)+2)
	errc := make(chan error, 1)
	go func() {
		_, err := h.s.eng.submit(ctx, func(*command) (any, error) { return h.s.eng.cmdGenerate(r, out) })
		errc <- err
	}()
	for {
		select {
		case m := <-out:
			if err := st.Send(m); err != nil {
				return err
			}
		case err := <-errc:
			for {
				select {
				case m := <-out:
					if err == nil {
						if serr := st.Send(m); serr != nil {
							return serr
						}
					}
				default:
					return err
				}
			}
		}
	}
}

func (h *handler) Save(ctx context.Context, r *halov1.SaveRequest) (*halov1.SaveResponse, error) {
	if isTCP(ctx) {
		if _, err := h.s.confine("save directory", r.Dir); err != nil {
			return nil, err
		}
	}
	return control[*halov1.SaveResponse](h, ctx, func(*command) (any, error) { return h.s.eng.cmdSave(r.Dir) })
}

func (h *handler) GetHyper(ctx context.Context, _ *halov1.GetHyperRequest) (*halov1.Hyper, error) {
	snap := h.s.eng.snapshot()
	if snap.hyper == nil {
		return nil, precondition("no model is loaded: load a config first")
	}
	return snap.hyper, nil
}

func (h *handler) SetHyper(ctx context.Context, r *halov1.SetHyperRequest) (*halov1.Hyper, error) {
	return control[*halov1.Hyper](h, ctx, func(*command) (any, error) { return h.s.eng.cmdSetHyper(r) })
}

func (h *handler) SetLayout(ctx context.Context, r *halov1.SetLayoutRequest) (*halov1.SetLayoutResponse, error) {
	return control[*halov1.SetLayoutResponse](h, ctx, func(*command) (any, error) { return h.s.eng.cmdSetLayout(r.Layout) })
}

func (h *handler) Inspect(ctx context.Context, r *halov1.InspectRequest) (*halov1.InspectResponse, error) {
	if r.Activations {
		if err := h.s.requireControl(ctx); err != nil {
			return nil, err
		}
	}
	return engineCall[*halov1.InspectResponse](h, ctx, func(*command) (any, error) { return h.s.eng.cmdInspect(r) })
}

func (h *handler) Profile(ctx context.Context, r *halov1.ProfileRequest) (*halov1.ProfileResponse, error) {
	return control[*halov1.ProfileResponse](h, ctx, func(c *command) (any, error) { return h.s.eng.cmdProfile(c, int(r.Steps), r.Trace) })
}

func (h *handler) Status(ctx context.Context, _ *halov1.StatusRequest) (*halov1.StatusResponse, error) {
	return h.s.status(), nil
}

func (h *handler) Events(ctx context.Context, r *halov1.EventsRequest, st halov1connect.SessionServiceEventsServerStream) error {
	if r.Buffer < 0 || r.History < 0 {
		return connect.Errorf(connect.CodeInvalidArgument, "session: events: buffer and history must be >= 0, got %d and %d", r.Buffer, r.History)
	}
	sub, past := h.s.hub.subscribeWithHistory(int(r.Buffer), int(r.History))
	defer h.s.hub.unsubscribe(sub)
	// The first event is the current state, so an observer starts from a known place; the
	// history it asked for follows.
	snap := h.s.eng.snapshot()
	first := &halov1.Event{Kind: &halov1.Event_State{State: &halov1.StateEvent{State: snap.state, Step: snap.step, Controller: h.s.currentController(), Reason: "attached"}}}
	if err := st.Send(first); err != nil {
		return err
	}
	for _, ev := range past {
		if err := st.Send(ev); err != nil {
			return err
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sub.notify:
		}
		evs, closed := sub.take()
		for _, ev := range evs {
			if err := st.Send(ev); err != nil {
				return err
			}
		}
		if closed {
			return nil
		}
	}
}

func (h *handler) Control(ctx context.Context, r *halov1.ControlRequest) (*halov1.ControlResponse, error) {
	id := clientID(ctx)
	if id == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, "session: control calls need a client id (header "+session.HeaderClientID+")")
	}
	s := h.s
	if r.ClientName != "" {
		s.seen(id, r.ClientName)
	}
	s.mu.Lock()
	expired := s.expireLocked(time.Now())
	prev := s.controller
	switch r.Action {
	case halov1.ControlAction_CONTROL_ACTION_CLAIM:
		if prev != "" && prev != id {
			err := s.notControllerLocked()
			s.mu.Unlock()
			s.publishControl("", expired)
			return nil, err
		}
		s.controller = id
	case halov1.ControlAction_CONTROL_ACTION_TAKE_OVER:
		s.controller = id
	case halov1.ControlAction_CONTROL_ACTION_RELEASE:
		if prev == id {
			s.controller = ""
		}
	default:
		s.mu.Unlock()
		s.publishControl("", expired)
		return nil, connect.Errorf(connect.CodeInvalidArgument, "session: control: unknown action %v (claim, take_over or release)", r.Action)
	}
	now := s.controller
	desc := s.describeLocked(id)
	s.mu.Unlock()
	s.publishControl("", expired)
	if now != prev {
		s.log.Info("control changed", "from", prev, "to", now)
		reason := "control released by " + desc
		if now != "" {
			reason = "control taken by " + desc
		}
		s.publishControl(now, reason)
	}
	return &halov1.ControlResponse{Controller: now, Previous: prev}, nil
}
