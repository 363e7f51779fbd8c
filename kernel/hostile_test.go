package kernel

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// rawPeer is a ZMTP 3.0 peer written by hand, so that a test can send bytes no ZeroMQ
// library would: a frame header declaring 2^40 bytes, a READY command with broken metadata.
type rawPeer struct {
	t    *testing.T
	conn net.Conn
}

func dialRaw(t *testing.T, port int) *rawPeer {
	t.Helper()
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawPeer{t: t, conn: c}
}

// greet sends the 64-byte greeting of a NULL-mechanism client and reads the kernel's.
func (p *rawPeer) greet() {
	p.t.Helper()
	var g [64]byte
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:32], "NULL")
	p.write(g[:])
	var back [64]byte
	p.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(p.conn, back[:]); err != nil {
		p.t.Fatalf("reading the kernel's greeting: %v", err)
	}
}

// ready sends a READY command whose metadata is body (name, value pairs already encoded).
func (p *rawPeer) ready(metadata []byte) {
	body := append([]byte("\x05READY"), metadata...)
	p.write(append([]byte{0x04, byte(len(body))}, body...))
}

func property(k, v string) []byte {
	b := []byte{byte(len(k))}
	b = append(b, k...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
	return append(b, v...)
}

func (p *rawPeer) write(b []byte) {
	p.t.Helper()
	if _, err := p.conn.Write(b); err != nil {
		p.t.Fatalf("writing to the kernel: %v", err)
	}
}

// longHeader is the header of a long frame declaring size bytes.
func longHeader(size uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{0x02}, size)
}

// waitClosed reads until the kernel closes the connection. It skips the kernel's own READY.
func (p *rawPeer) waitClosed(within time.Duration) error {
	p.conn.SetReadDeadline(time.Now().Add(within))
	_, err := io.Copy(io.Discard, p.conn)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("the kernel kept the connection open for %v", within)
	}
	return nil
}

// alive checks that the kernel still answers kernel_info on shell and echoes on heartbeat.
func (c *client) alive(t *testing.T) {
	t.Helper()
	c.send(c.shell, "kernel_info_request", map[string]any{})
	if r := c.recv(c.shellR, "kernel_info_reply"); r["status"] != "ok" {
		t.Fatalf("kernel_info_reply = %v", r)
	}
	if err := c.hb.Send(zmq4.NewMsgString("ping")); err != nil {
		t.Fatal(err)
	}
	type recv struct {
		m   zmq4.Msg
		err error
	}
	got := make(chan recv, 1)
	go func() {
		m, err := c.hb.Recv()
		got <- recv{m, err}
	}()
	select {
	case r := <-got:
		if r.err != nil || len(r.m.Frames) != 1 || string(r.m.Frames[0]) != "ping" {
			t.Fatalf("heartbeat after hostile input = %v, %v", r.m, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no heartbeat echo within 10s")
	}
}

func TestHostileFrameHeadersDropTheConnectionOnly(t *testing.T) {
	c, k, _ := startKernel(t, &lineInterp{})
	conn := k.Conn()
	ports := []struct {
		name, peerType string
		port           int
	}{
		{"shell", "DEALER", conn.ShellPort},
		{"control", "DEALER", conn.ControlPort},
		{"stdin", "DEALER", conn.StdinPort},
		{"iopub", "SUB", conn.IOPubPort},
		{"heartbeat", "REQ", conn.HBPort},
	}
	cases := []struct {
		name string
		send func(p *rawPeer, peerType string)
	}{
		{"2^40 after handshake", func(p *rawPeer, typ string) {
			p.greet()
			p.ready(property("Socket-Type", typ))
			p.write(longHeader(1 << 40))
		}},
		{"2^63-1 after handshake", func(p *rawPeer, typ string) {
			p.greet()
			p.ready(property("Socket-Type", typ))
			p.write(longHeader(math.MaxInt64))
		}},
		{"2^64-1 after handshake", func(p *rawPeer, typ string) {
			p.greet()
			p.ready(property("Socket-Type", typ))
			p.write(longHeader(math.MaxUint64))
		}},
		{"2^40 as the handshake command", func(p *rawPeer, typ string) {
			p.greet()
			p.write(append([]byte{0x06}, longHeader(1 << 40)[1:]...))
		}},
		{"many frames of one message", func(p *rawPeer, typ string) {
			p.greet()
			p.ready(property("Socket-Type", typ))
			more := make([]byte, 2*100000) // 100000 empty frames, each with MORE set
			for i := 0; i < len(more); i += 2 {
				more[i] = 0x01
			}
			p.write(more)
		}},
		{"READY metadata cut inside a name", func(p *rawPeer, typ string) {
			p.greet()
			p.ready([]byte{0x0b, 'S', 'o', 'c'})
		}},
		{"READY without a socket type", func(p *rawPeer, typ string) {
			p.greet()
			p.ready(property("Identity", "peer"))
		}},
		{"READY metadata cut before the value length", func(p *rawPeer, typ string) {
			p.greet()
			p.ready([]byte{0x04, 'S', 'o', 'c', 'k'})
		}},
	}
	for _, tc := range cases {
		for _, port := range ports {
			t.Run(tc.name+"/"+port.name, func(t *testing.T) {
				p := dialRaw(t, port.port)
				tc.send(p, port.peerType)
				if err := p.waitClosed(10 * time.Second); err != nil {
					t.Error(err)
				}
				c.alive(t)
			})
		}
	}
}

func TestStalledHandshakeDoesNotBlockOtherPeers(t *testing.T) {
	c, k, _ := startKernelWith(t, &lineInterp{}, WireLimits{Handshake: 300 * time.Millisecond})
	conn := k.Conn()
	// Peers that connect and send nothing, or only half a greeting, hold zmq4's accept
	// goroutine of that socket until the handshake limit closes them.
	silent := dialRaw(t, conn.ShellPort)
	half := dialRaw(t, conn.HBPort)
	half.write([]byte{0xff, 0, 0})
	// A new client on the same ports is served once the stalled peers are dropped.
	start := time.Now()
	fresh, err := newClient(t, conn)
	if err != nil {
		t.Fatal(err)
	}
	fresh.alive(t)
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("a new peer waited %v behind stalled ones", d)
	}
	for _, p := range []*rawPeer{silent, half} {
		if err := p.waitClosed(5 * time.Second); err != nil {
			t.Error(err)
		}
	}
	c.alive(t)
}

func TestHeartbeatSurvivesAMessageWithoutEnvelope(t *testing.T) {
	c, k, _ := startKernel(t, &lineInterp{})
	// A REQ-typed peer that sends a frame with no empty delimiter: zmq4's REP socket fails
	// that Recv; the heartbeat must go on for the next peer.
	p := dialRaw(t, k.Conn().HBPort)
	p.greet()
	p.ready(property("Socket-Type", "REQ"))
	p.write([]byte{0x00, 0x04, 'p', 'i', 'n', 'g'})
	time.Sleep(100 * time.Millisecond)
	p.conn.Close()
	c.alive(t)
}

func TestWireLimitsAreConfigurable(t *testing.T) {
	c, k, _ := startKernelWith(t, &lineInterp{}, WireLimits{MaxFrame: 4096})
	p := dialRaw(t, k.Conn().ShellPort)
	p.greet()
	p.ready(property("Socket-Type", "DEALER"))
	p.write(longHeader(8192))
	if err := p.waitClosed(5 * time.Second); err != nil {
		t.Error(err)
	}
	c.alive(t)
}

func TestLargeSignedMessagePassesTheGuard(t *testing.T) {
	c, _, _ := startKernel(t, &lineInterp{})
	big := strings.Repeat("x", 3<<20) // one frame of 3 MiB, read in many pieces
	reply, out := c.execute("print "+big, nil)
	if reply["status"] != "ok" {
		t.Fatalf("execute_reply = %v", reply)
	}
	var got int
	for _, m := range out {
		if m.Header.MsgType == "stream" {
			var s struct{ Text string }
			json.Unmarshal(m.Content, &s)
			got += len(s.Text)
		}
	}
	if got != len(big) {
		t.Fatalf("the cell printed %d bytes, want %d", got, len(big))
	}
}

func TestWireLimitSwitch(t *testing.T) {
	t.Setenv("HALO_KERNEL_MAX_FRAME", "2048")
	c, k, _ := startKernel(t, &lineInterp{})
	p := dialRaw(t, k.Conn().ShellPort)
	p.greet()
	p.ready(property("Socket-Type", "DEALER"))
	p.write(longHeader(4096))
	if err := p.waitClosed(5 * time.Second); err != nil {
		t.Error(err)
	}
	c.alive(t)
	if got := limitsFrom(WireLimits{MaxFrame: 100}, slog.Default()).MaxFrame; got != 100 {
		t.Errorf("Config.Limits.MaxFrame 100 gave %d: the Config wins over the switch", got)
	}
}

func TestWireMessageLimitSwitch(t *testing.T) {
	t.Setenv("HALO_KERNEL_MAX_MESSAGE", "5000")
	c, k, _ := startKernel(t, &lineInterp{})
	p := dialRaw(t, k.Conn().ShellPort)
	p.greet()
	p.ready(property("Socket-Type", "DEALER"))
	for range 3 { // 6000 bytes in one message, in frames of 2000
		p.write(append([]byte{0x03}, longHeader(2000)[1:]...))
		p.write(make([]byte, 2000))
	}
	if err := p.waitClosed(5 * time.Second); err != nil {
		t.Error(err)
	}
	c.alive(t)
}
