package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/halo-shell/halo-shell/internal/switches"
	"github.com/halo-shell/halo-shell/kernel/internal/wire"
	"github.com/halo-shell/halo-shell/kernel/internal/zmtpguard"
)

// Config configures a Kernel.
type Config struct {
	// Conn says where to listen and how to sign (from the connection file).
	Conn *ConnectionInfo
	// Interp runs the cells.
	Interp Interpreter
	// Logger receives the kernel's log (default: slog.Default()).
	Logger *slog.Logger
	// Banner is shown by front-ends in kernel_info (default: a line naming halo-shell).
	Banner string
	// Version is the implementation version in kernel_info (default "dev").
	Version string
	// Limits bound what one peer of a socket may send before its messages are checked:
	// frame and message sizes, frames per message, handshake time, open connections. A
	// peer that goes past them is disconnected and logged; the kernel goes on serving.
	// Zero fields take DefaultWireLimits.
	Limits WireLimits
}

// WireLimits bound what one ZeroMQ peer may make the kernel allocate or wait for.
type WireLimits = zmtpguard.Limits

// DefaultWireLimits are the limits of a Config that sets none: frames of 64 MiB, messages
// of 256 MiB and 4096 frames, 10 seconds to finish a handshake, 128 connections per socket.
// HALO_KERNEL_MAX_FRAME and HALO_KERNEL_MAX_MESSAGE change the first two.
var DefaultWireLimits = zmtpguard.DefaultLimits

var (
	swMaxFrame = switches.Register(switches.Switch{Name: "HALO_KERNEL_MAX_FRAME", Kind: switches.Tuning,
		Doc: "Largest ZeroMQ frame (bytes) a Jupyter kernel peer may send; a peer that declares more is disconnected before anything is allocated (default 64 MiB)."})
	swMaxMessage = switches.Register(switches.Switch{Name: "HALO_KERNEL_MAX_MESSAGE", Kind: switches.Tuning,
		Doc: "Largest multipart message (bytes, all frames) a Jupyter kernel peer may send (default 256 MiB)."})
)

// limitsFrom fills the limits lim leaves at zero from the switches; a value that is not a
// positive number of bytes is logged and ignored.
func limitsFrom(lim WireLimits, log *slog.Logger) WireLimits {
	for _, f := range []struct {
		sw  *switches.Switch
		dst *int64
	}{{swMaxFrame, &lim.MaxFrame}, {swMaxMessage, &lim.MaxMessage}} {
		v, ok := f.sw.Lookup()
		if !ok || *f.dst > 0 {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			log.Warn("kernel: ignoring a switch that is not a positive number of bytes", "switch", f.sw.Name, "value", v)
			continue
		}
		*f.dst = n
	}
	return lim
}

// Kernel serves one Jupyter connection. Create it with New and call Run.
type Kernel struct {
	cfg     Config
	conn    wire.ConnectionInfo
	signer  *wire.Signer
	log     *slog.Logger
	session string // this kernel's session id, in every header it sends

	shell, control, stdin, iopub, hb zmq4.Socket

	iopubMu sync.Mutex // iopub is shared by the shell and control goroutines and by cell output

	handlers map[string]handler
	shellQ   chan *wire.Message // shell requests waiting for the shell goroutine

	// Shell state, owned by the shell goroutine.
	execCount int
	history   []historyEntry

	runMu     sync.Mutex
	cancelRun context.CancelFunc // cancels the running cell; nil when none

	ctx      context.Context // ends when the kernel stops
	stop     context.CancelFunc
	shutdown chan struct{}
	once     sync.Once
}

// New binds the kernel's sockets. Ports given as 0 in cfg.Conn are chosen by the system; Conn
// returns the connection info with the ports actually bound.
func New(ctx context.Context, cfg Config) (*Kernel, error) {
	if cfg.Conn == nil {
		return nil, errors.New("kernel: no connection info")
	}
	if cfg.Interp == nil {
		return nil, errors.New("kernel: no interpreter")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.Banner == "" {
		cfg.Banner = "halo-shell (Go " + runtime.Version() + "): Go cells and % magics against a live engine session"
	}
	k := &Kernel{
		cfg:      cfg,
		conn:     *cfg.Conn,
		signer:   wire.NewSigner(cfg.Conn.Key),
		log:      cfg.Logger,
		session:  wire.NewID(),
		shutdown: make(chan struct{}),
		shellQ:   make(chan *wire.Message, 64),
	}
	k.handlers = k.handlerTable()
	if !k.signer.Enabled() {
		k.log.Warn("kernel: the connection file has no key: messages are neither signed nor checked")
	}
	sctx, stop := context.WithCancel(ctx)
	k.ctx, k.stop = sctx, stop
	type sock struct {
		name string
		s    *zmq4.Socket
		mk   func(context.Context, ...zmq4.Option) zmq4.Socket
		port *int
	}
	socks := []sock{
		{"shell", &k.shell, zmq4.NewRouter, &k.conn.ShellPort},
		{"control", &k.control, zmq4.NewRouter, &k.conn.ControlPort},
		{"stdin", &k.stdin, zmq4.NewRouter, &k.conn.StdinPort},
		{"iopub", &k.iopub, zmq4.NewPub, &k.conn.IOPubPort},
		{"heartbeat", &k.hb, zmq4.NewRep, &k.conn.HBPort},
	}
	limits := limitsFrom(cfg.Limits, k.log)
	for _, s := range socks {
		// Every socket listens through the guard, which drops a peer whose frame headers
		// break cfg.Limits before zmq4 allocates their bodies.
		gctx := zmtpguard.WithLimits(sctx, limits, k.log.With("socket", s.name))
		zlog := slog.NewLogLogger(k.log.With("socket", s.name).Handler(), slog.LevelDebug)
		*s.s = s.mk(gctx, zmq4.WithTimeout(30*time.Second), zmq4.WithLogger(zlog))
		ep := k.conn.Endpoint(*s.port)
		if err := (*s.s).Listen(zmtpguard.Endpoint(ep)); err != nil {
			k.closeSockets()
			stop()
			return nil, fmt.Errorf("kernel: %s socket: listen on %s: %w", s.name, ep, err)
		}
		if a, ok := (*s.s).Addr().(*net.TCPAddr); ok && *s.port == 0 {
			*s.port = a.Port
		}
	}
	return k, nil
}

// Conn is the connection info with the bound ports.
func (k *Kernel) Conn() ConnectionInfo { return k.conn }

func (k *Kernel) closeSockets() {
	for _, s := range []zmq4.Socket{k.shell, k.control, k.stdin, k.iopub, k.hb} {
		if s != nil {
			_ = s.Close()
		}
	}
}

// Run serves requests until a shutdown_request arrives or ctx ends, then closes the sockets.
func (k *Kernel) Run(ctx context.Context) error {
	defer k.closeSockets()
	defer k.stop()
	k.publish(nil, "status", map[string]any{"execution_state": "starting"})
	shellQ := k.shellQ
	var wg sync.WaitGroup
	wg.Add(4)
	go func() { defer wg.Done(); k.heartbeat() }()
	go func() { defer wg.Done(); k.drain("stdin", k.stdin) }()
	go func() { defer wg.Done(); k.receive("shell", k.shell, shellQ) }()
	go func() { defer wg.Done(); k.serveControl() }()
	done := make(chan struct{})
	go func() { defer close(done); k.serveShell(shellQ) }()
	var err error
	select {
	case <-ctx.Done():
		err = ctx.Err()
	case <-k.shutdown:
		time.Sleep(100 * time.Millisecond) // let iopub deliver the last idle status
	}
	k.interruptRun()
	k.stop()
	k.closeSockets()
	<-done
	wg.Wait()
	if c, ok := k.cfg.Interp.(interface{ Close() error }); ok {
		if cerr := c.Close(); cerr != nil {
			k.log.Warn("kernel: closing the interpreter", "err", cerr)
		}
	}
	return err
}

// requestShutdown ends Run.
func (k *Kernel) requestShutdown() {
	k.once.Do(func() { close(k.shutdown) })
}

func (k *Kernel) stopping() bool {
	select {
	case <-k.shutdown:
		return true
	default:
		return false
	}
}

// receive reads one router socket, parses and verifies each message and queues the good ones.
func (k *Kernel) receive(name string, s zmq4.Socket, q chan<- *wire.Message) {
	defer close(q)
	for {
		raw, err := s.Recv()
		if err != nil {
			if !k.stopping() {
				k.log.Debug("kernel: socket closed", "socket", name, "err", err)
			}
			return
		}
		m, err := wire.Parse(raw.Frames, k.signer)
		if err != nil {
			if errors.Is(err, wire.ErrBadSignature) {
				k.log.Warn("kernel: dropped a message with a bad signature", "socket", name, "err", err)
			} else {
				k.log.Warn("kernel: dropped a malformed message", "socket", name, "frames", len(raw.Frames), "err", err)
			}
			continue
		}
		select {
		case q <- m:
		case <-k.ctx.Done():
			return
		}
	}
}

func (k *Kernel) drain(name string, s zmq4.Socket) {
	for {
		raw, err := s.Recv()
		if err != nil {
			return
		}
		if m, err := wire.Parse(raw.Frames, k.signer); err == nil {
			k.log.Debug("kernel: ignored message", "socket", name, "msg_type", m.Header.MsgType)
		}
	}
}

// heartbeat echoes every ping. A ping that zmq4 cannot take (a frame without the REQ
// envelope) or a reply to a peer that is gone costs that ping only: the heartbeat stops
// with the kernel, never because of what one peer sent.
func (k *Kernel) heartbeat() {
	for {
		m, err := k.hb.Recv()
		if err == nil {
			err = k.hb.Send(m)
		}
		if err != nil {
			if k.stopping() || k.ctx.Err() != nil {
				return
			}
			k.log.Warn("kernel: heartbeat: dropped a ping", "err", err)
		}
	}
}

func (k *Kernel) serveShell(q <-chan *wire.Message) {
	var backlog []*wire.Message // requests taken from q while aborting
	for {
		var m *wire.Message
		if len(backlog) > 0 {
			m, backlog = backlog[0], backlog[1:]
		} else {
			var ok bool
			if m, ok = <-q; !ok {
				return
			}
		}
		if k.stopping() {
			return
		}
		taken := k.dispatch(k.shell, m, q)
		backlog = append(backlog, taken...)
	}
}

// takeQueued empties q without waiting: after a cell failed with stop_on_error, the execute
// requests already waiting are answered "aborted" (before the failed cell's reply is sent, so
// that a request the client sends after seeing that reply is never aborted). It returns the
// other requests, to be served as usual.
func (k *Kernel) takeQueued(q <-chan *wire.Message) (aborted, others []*wire.Message) {
	for {
		select {
		case m, ok := <-q:
			if !ok {
				return aborted, others
			}
			if m.Header.MsgType == "execute_request" {
				aborted = append(aborted, m)
			} else {
				others = append(others, m)
			}
		default:
			return aborted, others
		}
	}
}

func (k *Kernel) abort(m *wire.Message) {
	k.publish(m, "status", map[string]any{"execution_state": "busy"})
	k.reply(k.shell, m, "execute_reply", map[string]any{"status": "aborted", "execution_count": k.execCount})
	k.publish(m, "status", map[string]any{"execution_state": "idle"})
}

func (k *Kernel) serveControl() {
	q := make(chan *wire.Message, 16)
	go k.receive("control", k.control, q)
	for m := range q {
		k.dispatch(k.control, m, nil)
	}
}

// dispatch runs the handler of m between busy and idle and sends its reply. When the request
// is an execution that failed with stop_on_error, the execute requests waiting in q are
// aborted and the other requests taken from q are returned for the caller to serve.
func (k *Kernel) dispatch(sock zmq4.Socket, m *wire.Message, q <-chan *wire.Message) (taken []*wire.Message) {
	t := m.Header.MsgType
	h, ok := k.handlers[t]
	k.publish(m, "status", map[string]any{"execution_state": "busy"})
	var (
		after   func()
		aborted []*wire.Message
	)
	defer func() {
		k.publish(m, "status", map[string]any{"execution_state": "idle"})
		for _, a := range aborted {
			k.abort(a)
		}
		if after != nil {
			after()
		}
	}()
	if !ok {
		k.log.Warn("kernel: unsupported message type", "msg_type", t)
		return nil
	}
	var r result
	func() {
		defer func() {
			if p := recover(); p != nil {
				k.log.Error("kernel: handler panicked", "msg_type", t, "panic", p)
				r = result{content: errorReply(fmt.Errorf("internal error handling %s: %v", t, p))}
			}
		}()
		r = h.fn(m)
	}()
	if r.content == nil {
		return nil
	}
	if r.abort && q != nil {
		aborted, taken = k.takeQueued(q)
	}
	k.reply(sock, m, h.reply, r.content)
	after = r.after
	return taken
}

// errorReply is the content of a reply for a handler that failed.
func errorReply(err error) map[string]any {
	ename, evalue, tb := errorContent(err)
	return map[string]any{"status": "error", "ename": ename, "evalue": evalue, "traceback": tb}
}

func (k *Kernel) newMessage(parent *wire.Message, msgType string, content any) (*wire.Message, error) {
	c, err := json.Marshal(content)
	if err != nil {
		return nil, fmt.Errorf("kernel: encoding %s content: %w", msgType, err)
	}
	m := &wire.Message{Header: wire.NewHeader(msgType, k.session, "halo-shell"), Content: c}
	if parent != nil {
		hb, err := json.Marshal(parent.Header)
		if err != nil {
			return nil, err
		}
		m.Parent = hb
	}
	return m, nil
}

// reply sends a reply to request m on sock (shell or control).
func (k *Kernel) reply(sock zmq4.Socket, m *wire.Message, msgType string, content any) {
	r, err := k.newMessage(m, msgType, content)
	if err != nil {
		k.log.Error("kernel: reply", "msg_type", msgType, "err", err)
		return
	}
	r.Identities = m.Identities
	frames, err := r.Frames(k.signer)
	if err == nil {
		err = sock.Send(zmq4.NewMsgFrom(frames...))
	}
	if err != nil && !k.stopping() {
		k.log.Warn("kernel: sending reply", "msg_type", msgType, "err", err)
	}
}

// publish sends a message on iopub (parent may be nil). It may be called from any goroutine.
func (k *Kernel) publish(parent *wire.Message, msgType string, content any) {
	m, err := k.newMessage(parent, msgType, content)
	if err != nil {
		k.log.Error("kernel: publish", "msg_type", msgType, "err", err)
		return
	}
	m.Identities = [][]byte{[]byte("kernel." + k.session + "." + msgType)}
	frames, err := m.Frames(k.signer)
	if err != nil {
		k.log.Error("kernel: publish", "msg_type", msgType, "err", err)
		return
	}
	k.iopubMu.Lock()
	defer k.iopubMu.Unlock()
	if err := k.iopub.Send(zmq4.NewMsgFrom(frames...)); err != nil && !k.stopping() {
		k.log.Warn("kernel: publishing", "msg_type", msgType, "err", err)
	}
}

// Interrupt cancels the running cell, as interrupt_request does (for a SIGINT handler). It
// reports whether a cell was running.
func (k *Kernel) Interrupt() bool { return k.interruptRun() }

func (k *Kernel) interruptRun() bool {
	k.runMu.Lock()
	defer k.runMu.Unlock()
	if k.cancelRun != nil {
		k.cancelRun()
		return true
	}
	return false
}

// WriteConnectionFile writes ci as a connection file (0600), for tests and tools that start a
// kernel themselves.
func WriteConnectionFile(path string, ci ConnectionInfo) error {
	b, err := json.MarshalIndent(ci, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// ConnectionInfo is the content of a Jupyter connection file.
type ConnectionInfo = wire.ConnectionInfo

// ReadConnectionFile reads and validates a Jupyter connection file.
func ReadConnectionFile(path string) (*ConnectionInfo, error) { return wire.ReadConnectionFile(path) }
