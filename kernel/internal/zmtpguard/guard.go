// Package zmtpguard bounds what a ZeroMQ peer can make this process allocate or wait for,
// without changing the ZMTP implementation (github.com/go-zeromq/zmq4). That implementation
// allocates a frame's body as soon as it has read the frame's header, before any message
// signature can be checked, so one unauthenticated header declaring 2^40 bytes ends the
// process; it also indexes past the end of a short READY property list, and it completes
// each handshake on its accept goroutine, so one peer that connects and sends nothing stops
// every later peer from connecting.
//
// The guard sits between the socket and zmq4, as a transport ("halo-tcp", "halo-ipc"): each
// accepted connection's bytes are followed frame by frame (a small state machine; no bytes
// are kept except the first command's), and a connection that declares a frame or a message
// over its Limits, sends a malformed handshake, or does not finish its handshake in time is
// closed and logged before zmq4 sees the offending header. The socket goes on serving its
// other peers. Use Endpoint to turn a "tcp://" or "ipc://" address into a guarded one, and
// WithLimits to set the limits and logger of the sockets made from a context.
//
// It is not a ZMTP implementation: it never answers a peer, and it checks only what zmq4
// would otherwise trust.
package zmtpguard

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// Limits bound one peer of one socket. Zero fields take the defaults.
type Limits struct {
	// MaxFrame is the largest frame body a peer may declare, in bytes (default 64 MiB).
	MaxFrame int64
	// MaxMessage bounds the sum of the frame bodies of one multipart message (default 256 MiB).
	MaxMessage int64
	// MaxFrames bounds the frames of one multipart message (default 4096; a Jupyter message
	// has its routing identities, a delimiter, a signature, four JSON parts and its buffers).
	MaxFrames int
	// Handshake is the time a peer has to send its greeting and READY command (default 10s).
	Handshake time.Duration
	// MaxConns bounds the connections open at once on one listening socket (default 128):
	// each may hold a declared frame of MaxFrame bytes while its body arrives.
	MaxConns int
}

// DefaultLimits are the limits of a socket whose context carries none.
var DefaultLimits = Limits{
	MaxFrame:   64 << 20,
	MaxMessage: 256 << 20,
	MaxFrames:  4096,
	Handshake:  10 * time.Second,
	MaxConns:   128,
}

func (l Limits) withDefaults() Limits {
	if l.MaxFrame <= 0 {
		l.MaxFrame = DefaultLimits.MaxFrame
	}
	if l.MaxMessage <= 0 {
		l.MaxMessage = DefaultLimits.MaxMessage
	}
	if l.MaxFrames <= 0 {
		l.MaxFrames = DefaultLimits.MaxFrames
	}
	if l.Handshake <= 0 {
		l.Handshake = DefaultLimits.Handshake
	}
	if l.MaxConns <= 0 {
		l.MaxConns = DefaultLimits.MaxConns
	}
	return l
}

// Error says why a connection was dropped. It is a net.Error that is not a timeout, so that
// zmq4 marks the connection closed and forgets it.
type Error struct {
	Reason string
}

func (e *Error) Error() string   { return "zmtpguard: " + e.Reason }
func (e *Error) Timeout() bool   { return false }
func (e *Error) Temporary() bool { return false }

var _ net.Error = (*Error)(nil)

type ctxKey struct{}

type settings struct {
	lim Limits
	log *slog.Logger
}

// WithLimits returns a context whose sockets (zmq4.NewRouter(ctx), ...) listening on a
// guarded endpoint use lim, and log each dropped connection to log (nil: slog.Default()).
func WithLimits(ctx context.Context, lim Limits, log *slog.Logger) context.Context {
	return context.WithValue(ctx, ctxKey{}, settings{lim: lim.withDefaults(), log: log})
}

func settingsOf(ctx context.Context) settings {
	s, ok := ctx.Value(ctxKey{}).(settings)
	if !ok {
		s.lim = DefaultLimits
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	return s
}

// Guarded transports, by the name of the plain transport they wrap.
var schemes = map[string]string{"tcp": "halo-tcp", "ipc": "halo-ipc"}

func init() {
	for plain, guarded := range schemes {
		network := plain
		if plain == "ipc" {
			network = "unix"
		}
		if err := zmq4.RegisterTransport(guarded, guard{inner: transport.New(network)}); err != nil {
			panic(err)
		}
	}
}

// Endpoint returns the guarded form of a "tcp://" or "ipc://" ZeroMQ endpoint; other
// endpoints are returned as they are.
func Endpoint(ep string) string {
	scheme, rest, ok := strings.Cut(ep, "://")
	if g, known := schemes[scheme]; ok && known {
		return g + "://" + rest
	}
	return ep
}

// guard is a zmq4 transport whose connections are followed by a scanner.
type guard struct {
	inner transport.Transport
}

func (g guard) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := g.inner.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	s := settingsOf(ctx)
	return newConn(c, s, func() {}), nil
}

func (g guard) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := g.inner.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return &listener{Listener: l, set: settingsOf(ctx)}, nil
}

func (g guard) Addr(ep string) (string, error) { return g.inner.Addr(ep) }

type listener struct {
	net.Listener
	set  settings
	mu   sync.Mutex
	open int
}

// Accept returns the next connection, guarded. Connections past MaxConns are closed at once.
func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.mu.Lock()
		full := l.open >= l.set.lim.MaxConns
		if !full {
			l.open++
		}
		l.mu.Unlock()
		if full {
			l.set.log.Warn("zmtpguard: refused a connection: too many open", "local", l.Addr().String(),
				"remote", c.RemoteAddr().String(), "max_conns", l.set.lim.MaxConns)
			c.Close()
			continue
		}
		return newConn(c, l.set, func() {
			l.mu.Lock()
			l.open--
			l.mu.Unlock()
		}), nil
	}
}

// conn follows what its peer sends. zmq4 reads a connection from one goroutine at a time.
type conn struct {
	net.Conn
	set    settings
	scan   *scanner
	closed atomic.Bool
	onDone func()

	// served is set by the first Read after the peer's handshake command: zmq4 has taken
	// the connection into a socket. The handshake timer closes a connection not served by
	// then, both a peer that sends too little and one that zmq4 refused and abandoned.
	served atomic.Bool
	timer  *time.Timer
}

func newConn(c net.Conn, set settings, onDone func()) *conn {
	g := &conn{Conn: c, set: set, scan: newScanner(set.lim), onDone: onDone}
	g.timer = time.AfterFunc(set.lim.Handshake, func() {
		if !g.served.Load() {
			g.drop(&Error{Reason: fmt.Sprintf("the ZMTP handshake did not complete within %v", set.lim.Handshake)})
		}
	})
	return g
}

func (c *conn) Read(p []byte) (int, error) {
	if c.scan.handshook && !c.served.Load() {
		c.served.Store(true)
		c.timer.Stop()
	}
	n, err := c.Conn.Read(p)
	if serr := c.scan.scan(p[:n]); serr != nil {
		c.drop(serr)
		return 0, serr
	}
	return n, err
}

// drop logs why and closes the connection (once).
func (c *conn) drop(why error) {
	if c.closed.Swap(true) {
		return
	}
	c.set.log.Warn("zmtpguard: dropped a connection", "local", c.LocalAddr().String(),
		"remote", c.RemoteAddr().String(), "err", why)
	// The handshake timer is left to fire: it may be the caller, and finds c closed.
	c.Conn.Close()
	c.onDone()
}

func (c *conn) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	c.timer.Stop()
	err := c.Conn.Close()
	c.onDone()
	return err
}
