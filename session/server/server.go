package server

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connecthttp"

	"github.com/halo-shell/halo-shell/engine/profile"
	"github.com/halo-shell/halo-shell/engine/train"
	"github.com/halo-shell/halo-shell/session"
	halov1 "github.com/halo-shell/halo-shell/session/proto/halo/v1"
	"github.com/halo-shell/halo-shell/session/proto/halo/v1/halov1connect"
)

// Options configure a session server.
type Options struct {
	// Name of the session (default DefaultName); it names the socket in RuntimeDir.
	Name string
	// Socket overrides the socket path (tests); empty means Paths.Socket.
	Socket string
	// Listen is an extra "tcp://HOST:PORT" address; calls on it need the bearer token.
	// HOST empty means 127.0.0.1. An address other machines can reach needs AllowRemote.
	Listen string
	// AllowRemote lets Listen bind an address other than loopback (with a warning).
	AllowRemote bool
	// TLSCert and TLSKey, PEM files, make the Listen address serve TLS.
	TLSCert, TLSKey string
	// SaveOnStop is a directory where stopping (SIGTERM, Stop) saves a checkpoint first.
	SaveOnStop string
	// ConfigPath, when set, is loaded at start with Method (default sft) and Overrides.
	ConfigPath string
	Method     string
	Overrides  []string
	// TraceFile, for ServeRun, records every step of the run and writes them as a
	// Chrome/Perfetto trace (JSON) to this file at the end (each op is then followed by a
	// device sync, which slows GPU steps).
	TraceFile string
	// Logger receives the session's log (default slog.Default()).
	Logger *slog.Logger
}

// Server is a running session: the engine goroutine, the RPC handlers and the listeners.
type Server struct {
	o     Options
	log   *slog.Logger
	hub   *hub
	eng   *engine
	paths session.Paths
	token string
	tls   *tls.Config // of the TCP listener; nil for plaintext
	// workDir is the process's working directory: relative paths resolve against it, and
	// remote clients may name paths only inside it (and SaveOnStop).
	workDir string
	unixLn  net.Listener
	tcpLn   net.Listener
	https   []*http.Server

	mu         sync.Mutex
	controller string
	clients    map[string]*clientRec
	lease      time.Duration // see clients.go
	janitorEnd chan struct{}

	closeOnce sync.Once
	closed    chan struct{}
}

type ctxKey int

const keyTCP ctxKey = 1

// New creates the session's socket (and TCP listener) and starts the engine goroutine.
// Serve then answers calls until Shutdown.
func New(o Options) (*Server, error) {
	if o.Name == "" {
		o.Name = session.DefaultName
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	p, err := session.PathsFor(o.Name)
	if err != nil {
		return nil, err
	}
	if o.Socket != "" {
		p.Socket = o.Socket
	} else if _, err := session.EnsureRuntimeDir(); err != nil {
		return nil, err
	}
	s := &Server{o: o, log: o.Logger.With("session", o.Name), hub: newHub(), paths: p, clients: map[string]*clientRec{},
		lease: controlLease(), janitorEnd: make(chan struct{}), closed: make(chan struct{})}
	s.workDir = workDirOf()
	if s.tls, err = tlsConfig(o); err != nil {
		return nil, err
	}
	if s.unixLn, err = listenUnix(p.Socket); err != nil {
		return nil, err
	}
	if o.Listen != "" {
		if err := s.listenTCP(o.Listen); err != nil {
			s.unixLn.Close()
			os.Remove(p.Socket)
			return nil, err
		}
	}
	if o.Socket == "" {
		_ = os.WriteFile(p.Pid, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600)
	}
	s.eng = newEngine(o.Name, s.log, s.hub, o.SaveOnStop)
	s.eng.controller = s.currentController
	return s, nil
}

// maxSocketPath is the longest unix socket path Linux accepts (sun_path less its NUL).
const maxSocketPath = 107

// listenUnix listens on path with mode 0600, replacing a stale socket that nobody answers on
// and refusing when a live session holds it.
func listenUnix(path string) (net.Listener, error) {
	if len(path) > maxSocketPath {
		return nil, fmt.Errorf("session: socket path %s is %d bytes, more than the %d a unix socket allows; set HALO_SESSION_DIR to a shorter directory", path, len(path), maxSocketPath)
	}
	if _, err := os.Stat(path); err == nil {
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("session: %s: a session is already listening there; attach to it or stop it first", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("session: removing stale socket %s: %w", path, err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("session: listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("session: socket %s: %w", path, err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(true)
	return ln, nil
}

func (s *Server) listenTCP(listen string) error {
	addr, err := session.ParseListen(listen)
	if err != nil {
		return err
	}
	warning, err := checkBind(listen, addr, s.o)
	if err != nil {
		return err
	}
	if warning != "" {
		s.log.Warn(warning)
	}
	var tok [32]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return fmt.Errorf("session: generating a token: %w", err)
	}
	s.token = hex.EncodeToString(tok[:])
	f, err := os.OpenFile(s.paths.Token, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("session: token file: %w", err)
	}
	_, werr := f.WriteString(s.token + "\n")
	cerr := f.Close()
	if err := errors.Join(werr, cerr, os.Chmod(s.paths.Token, 0o600)); err != nil {
		return fmt.Errorf("session: token file %s: %w", s.paths.Token, err)
	}
	if s.tcpLn, err = net.Listen("tcp", addr); err != nil {
		return fmt.Errorf("session: listen on %s: %w", addr, err)
	}
	_ = os.WriteFile(s.paths.TCP, []byte("tcp://"+s.tcpLn.Addr().String()+"\n"), 0o600)
	return nil
}

// Socket is the unix socket path.
func (s *Server) Socket() string { return s.paths.Socket }

// TCPAddr is "tcp://HOST:PORT" of the TCP listener, or "" without one.
func (s *Server) TCPAddr() string {
	if s.tcpLn == nil {
		return ""
	}
	return "tcp://" + s.tcpLn.Addr().String()
}

// Token is the bearer token TCP clients must send ("" without TCP).
func (s *Server) Token() string { return s.token }

// Serve answers calls and runs the engine until ctx ends or Shutdown is called; then it stops
// at the next step boundary (saving when SaveOnStop is set), closes the listeners, removes the
// socket and returns nil. When Options.ConfigPath does not load, it stops the same way and
// returns the load's error.
func (s *Server) Serve(ctx context.Context) error {
	go s.eng.loop()
	var loadErr error
	loaded := make(chan struct{})
	if s.o.ConfigPath != "" {
		// The config loads while the socket answers (observers see the session loading); a
		// config that does not load stops the session, and Serve returns why. The load is
		// handed to the engine before the socket opens, so every command a client sends
		// runs after it (a step sent at once does not find the session without a model).
		c, err := s.eng.enqueue(ctx, func(*command) (any, error) {
			return s.eng.cmdLoad(&halov1.LoadRequest{ConfigPath: s.o.ConfigPath, Method: s.o.Method, Overrides: s.o.Overrides}, nil)
		})
		go func() {
			defer close(loaded)
			if err == nil {
				_, err = s.eng.await(ctx, c)
			}
			stopping := false
			select {
			case <-s.closed:
				stopping = true
			default:
			}
			if err != nil && ctx.Err() == nil && !stopping {
				loadErr = fmt.Errorf("session: loading %s: %w", s.o.ConfigPath, err)
				s.eng.logEvent(slog.LevelError, loadErr.Error())
				s.Shutdown()
			}
		}()
	} else {
		close(loaded)
	}
	s.startHTTP()
	select {
	case <-ctx.Done():
	case <-s.closed:
	}
	s.finish()
	<-loaded
	return loadErr
}

// Shutdown asks Serve to stop (at the next step boundary).
func (s *Server) Shutdown() { s.closeOnce.Do(func() { close(s.closed) }) }

// httpHandler is the RPC service as an http.Handler.
func (s *Server) httpHandler() http.Handler {
	cs := connect.NewServer(s.recoverInterceptor, s.authInterceptor)
	halov1connect.RegisterSessionServiceHandler(cs, &handler{s: s})
	mux := http.NewServeMux()
	connecthttp.Mount(mux, cs, connecthttp.WithReadMaxBytes(maxRequestBytes))
	return mux
}

// maxRequestBytes bounds a request message (inline configs are the largest).
const maxRequestBytes = 16 << 20

func (s *Server) startHTTP() {
	mux := s.httpHandler()
	protos := new(http.Protocols)
	protos.SetUnencryptedHTTP2(true)
	protos.SetHTTP1(true)
	serve := func(ln net.Listener, tcp bool) {
		// Pings find connections whose peer vanished without closing them (a TCP client's
		// machine gone), so their calls end and a controller among them loses control.
		hs := &http.Server{Handler: mux, Protocols: protos, ReadHeaderTimeout: 10 * time.Second,
			HTTP2:    &http.HTTP2Config{SendPingTimeout: 5 * time.Second, PingTimeout: 5 * time.Second},
			ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
		if tcp {
			hs.ConnContext = func(ctx context.Context, _ net.Conn) context.Context { return context.WithValue(ctx, keyTCP, true) }
		}
		serveFn := hs.Serve
		if tcp && s.tls != nil {
			tp := new(http.Protocols)
			tp.SetHTTP1(true)
			tp.SetHTTP2(true)
			hs.Protocols, hs.TLSConfig = tp, s.tls
			serveFn = func(ln net.Listener) error { return hs.ServeTLS(ln, "", "") }
		}
		s.https = append(s.https, hs)
		go func() {
			if err := serveFn(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("serving", "addr", ln.Addr().String(), "err", err)
			}
		}()
	}
	go s.janitor(s.janitorEnd)
	serve(s.unixLn, false)
	if s.tcpLn != nil {
		serve(s.tcpLn, true)
	}
	s.log.Info("session serving", "socket", s.paths.Socket, "tcp", s.TCPAddr(), "pid", os.Getpid())
}

// finish stops the engine (saving when configured), then the listeners.
func (s *Server) finish() {
	close(s.janitorEnd)
	s.eng.stop()
	if !s.eng.launch {
		<-s.eng.done
	}
	s.hub.close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, hs := range s.https {
		if err := hs.Shutdown(ctx); err != nil {
			hs.Close()
		}
	}
	s.unixLn.Close()
	if s.tcpLn != nil {
		s.tcpLn.Close()
		os.Remove(s.paths.Token)
		os.Remove(s.paths.TCP)
	}
	os.Remove(s.paths.Socket)
	if s.o.Socket == "" {
		os.Remove(s.paths.Pid)
	}
	s.log.Info("session stopped")
}

// Serve runs a session until ctx ends (see Server.Serve).
func Serve(ctx context.Context, o Options) error {
	s, err := New(o)
	if err != nil {
		return err
	}
	return s.Serve(ctx)
}

// ---- interceptors ----

func (s *Server) recoverInterceptor(next connect.ServerFunc) connect.ServerFunc {
	return func(ctx context.Context, spec connect.Spec, st connect.ServerStream) (err error) {
		defer func() {
			if r := recover(); r != nil {
				s.log.Error("handler panicked", "procedure", spec.Procedure, "panic", r)
				err = connect.Errorf(connect.CodeInternal, "session: internal error in %s", spec.Procedure)
			}
		}()
		return next(ctx, spec, st)
	}
}

// authInterceptor checks the bearer token of calls that came over TCP, before any payload is
// read, and records which clients call.
func (s *Server) authInterceptor(next connect.ServerFunc) connect.ServerFunc {
	return func(ctx context.Context, spec connect.Spec, st connect.ServerStream) error {
		info, _ := connect.CallInfoForServerContext(ctx)
		if tcp, _ := ctx.Value(keyTCP).(bool); tcp {
			got := ""
			if info != nil {
				got = info.RequestHeader().Get("Authorization")
			}
			peer := ""
			if info != nil {
				peer = info.PeerAddr
			}
			tok, ok := strings.CutPrefix(got, "Bearer ")
			switch {
			case got == "":
				s.log.Warn("refused unauthenticated call", "procedure", spec.Procedure, "peer", peer, "reason", "no token")
				return connect.NewError(connect.CodeUnauthenticated, "session: this TCP endpoint needs a bearer token (Authorization: Bearer TOKEN); the token is in the session's .token file beside its socket")
			case !ok || subtle.ConstantTimeCompare([]byte(tok), []byte(s.token)) != 1:
				s.log.Warn("refused unauthenticated call", "procedure", spec.Procedure, "peer", peer, "reason", "wrong token")
				return connect.NewError(connect.CodeUnauthenticated, "session: wrong bearer token; use the token from the session's .token file beside its socket")
			}
		}
		if info != nil {
			leave := s.enter(info.RequestHeader().Get(session.HeaderClientID), info.RequestHeader().Get(session.HeaderClientName))
			defer leave()
		}
		return next(ctx, spec, st)
	}
}

func (s *Server) status() *halov1.StatusResponse {
	snap := s.eng.snapshot()
	r := &halov1.StatusResponse{Name: s.o.Name, State: snap.state, Step: snap.step, TotalSteps: snap.total,
		ConfigSummary: snap.summary, Device: snap.device, Hyper: snap.hyper, LastError: snap.lastErr, LastMetrics: snap.last,
		Pid: int64(os.Getpid()), Layout: snap.layout.Layout, Devices: snap.layout.Devices, SavedStep: snap.saved}
	s.mu.Lock()
	reason := s.expireLocked(time.Now())
	r.Controller = s.controller
	r.Clients = s.clientsLocked(time.Now())
	s.mu.Unlock()
	s.publishControl("", reason)
	return r
}

// ---- ServeRun: batch runs as sessions ----

// ServeRun runs train.Run on t while serving it as the session o.Name: observers attach by
// name, and the controller may pause, resume, profile the next steps, inspect, evaluate,
// generate, change hyperparameters and save between steps (Step, Run and Load are refused:
// the batch loop steps by itself). It returns train.Run's result when the run ends or ctx is
// cancelled (then train.Run saves a checkpoint). For Profile to work, build t with NewTrainer.
func ServeRun(ctx context.Context, o Options, t *train.Trainer, ro train.RunOptions) (train.RunResult, error) {
	s, err := New(o)
	if err != nil {
		return train.RunResult{}, err
	}
	e := s.eng
	e.launch = true
	e.install(t)
	s.startHTTP()
	done := make(chan struct{})
	defer func() {
		close(done)
		s.finish()
	}()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.closed:
			cancel()
		case <-done:
		}
	}()
	e.publishState("launch run")
	userOnStep := ro.OnStep
	tracing := o.TraceFile != "" && e.rec != nil
	var traced []profile.Step
	if o.TraceFile != "" && e.rec == nil {
		e.logEvent(slog.LevelWarn, "no trace: the trainer's backend was opened without profiling support (build it with server.NewTrainer, not train.New)")
	}
	if tracing {
		e.rec.Enable(true, true)
		e.rec.BeginStep(t.Steps() + 1)
	}
	ro.OnStep = func(m train.StepMetrics) {
		// A step boundary: publish, then serve commands; block here while paused.
		e.endCapture(true)
		var ps *profile.Step
		if (e.prof != nil || tracing) && e.rec != nil {
			if st, ok := e.rec.EndStep(); ok {
				ps = &st
				if tracing {
					traced = append(traced, st)
				}
			}
			e.rec.Enable(tracing, tracing)
			e.rec.Steps()
		}
		pm := metricsPB(m)
		e.addDeviceMetrics(pm)
		if e.prof == nil {
			ps = nil // a traced step is published as a profile only when one was asked for
		}
		e.afterStep(pm, ps)
		if userOnStep != nil {
			userOnStep(m)
		}
		e.serveBoundary(runCtx)
		if (e.prof != nil || tracing) && e.rec != nil && !t.Done() {
			e.rec.Enable(true, tracing || e.prof.trace)
			e.rec.BeginStep(t.Steps() + 1)
		}
		e.beginCapture()
	}
	res, err := train.Run(runCtx, t, ro)
	if e.prof != nil {
		e.prof.waiter.reply(e.profileResponse(e.prof), nil)
		e.prof = nil
	}
	if tracing {
		e.rec.Enable(false, false)
		if terr := writeTraceFile(o.TraceFile, traced, e.rec.writeTrace); terr != nil {
			e.logEvent(slog.LevelError, terr.Error())
			err = errors.Join(err, terr)
		} else {
			e.logEvent(slog.LevelInfo, fmt.Sprintf("wrote a trace of %d steps to %s", len(traced), o.TraceFile))
		}
	}
	e.stopping = true
	e.publishState("run finished")
	close(e.done)
	return res, err
}

// writeTraceFile writes steps as a Chrome/Perfetto trace, atomically.
func writeTraceFile(path string, steps []profile.Step, write func(io.Writer, []profile.Step) error) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("session: trace: %w", err)
	}
	werr := write(f, steps)
	if err := errors.Join(werr, f.Close()); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("session: trace %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("session: trace: %w", err)
	}
	return nil
}
