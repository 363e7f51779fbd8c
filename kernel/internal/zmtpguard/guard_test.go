package zmtpguard

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4/transport"
)

// memConn is a net.Conn that reads a fixed byte string and discards what is written.
type memConn struct {
	r      []byte
	off    int
	closed bool
}

func (c *memConn) Read(p []byte) (int, error) {
	if c.closed {
		return 0, net.ErrClosed
	}
	if c.off >= len(c.r) {
		return 0, io.EOF
	}
	n := copy(p, c.r[c.off:])
	c.off += n
	return n, nil
}
func (c *memConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *memConn) Close() error                     { c.closed = true; return nil }
func (c *memConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *memConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *memConn) SetDeadline(time.Time) error      { return nil }
func (c *memConn) SetReadDeadline(time.Time) error  { return nil }
func (c *memConn) SetWriteDeadline(time.Time) error { return nil }

// greeting is a NULL-mechanism ZMTP 3.0 greeting.
func greeting() []byte {
	g := make([]byte, greetingLen)
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:32], "NULL")
	return g
}

// frame encodes one frame with the given flags (LONG is added when the body needs it).
func frame(flags byte, body string) []byte {
	var b bytes.Buffer
	if len(body) > 255 {
		b.WriteByte(flags | flagLong)
		binary.Write(&b, binary.BigEndian, uint64(len(body)))
	} else {
		b.WriteByte(flags)
		b.WriteByte(byte(len(body)))
	}
	b.WriteString(body)
	return b.Bytes()
}

func cmdFrame(body string) []byte { return frame(flagCommand, body) }

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"tcp://127.0.0.1:5555":  "halo-tcp://127.0.0.1:5555",
		"ipc:///tmp/kernel-1":   "halo-ipc:///tmp/kernel-1",
		"inproc://x":            "inproc://x",
		"halo-tcp://[::1]:5555": "halo-tcp://[::1]:5555",
	} {
		if got := Endpoint(in); got != want {
			t.Errorf("Endpoint(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestListenerBoundsConnections checks that connections past MaxConns are closed at once and
// that a connection whose handshake never completes is closed after Handshake, making room.
func TestListenerBoundsConnections(t *testing.T) {
	lim := Limits{MaxConns: 2, Handshake: 300 * time.Millisecond}
	g := guard{inner: transport.New("tcp")}
	l, err := g.Listen(WithLimits(context.Background(), lim, discard), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c // never read: as a peer stuck before its greeting
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	closedWithin := func(c net.Conn, d time.Duration) bool {
		c.SetReadDeadline(time.Now().Add(d))
		_, err := c.Read(make([]byte, 1))
		return err == io.EOF
	}
	a, b := dial(), dial()
	<-accepted
	<-accepted
	third := dial()
	if !closedWithin(third, 200*time.Millisecond) {
		t.Fatal("a third connection was kept past MaxConns=2")
	}
	if !closedWithin(a, 2*time.Second) || !closedWithin(b, 2*time.Second) {
		t.Fatal("connections without a handshake were kept past the handshake limit")
	}
	dial()
	select {
	case <-accepted:
	case <-time.After(2 * time.Second):
		t.Fatal("no room for a new connection after the stalled ones were dropped")
	}
}
