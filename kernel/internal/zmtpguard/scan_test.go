package zmtpguard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
)

var testLimits = Limits{MaxFrame: 1 << 10, MaxMessage: 4 << 10, MaxFrames: 8, Handshake: time.Hour, MaxConns: 4}

func ready(props ...string) []byte {
	body := "\x05READY"
	for i := 0; i+1 < len(props); i += 2 {
		var vl [4]byte
		binary.BigEndian.PutUint32(vl[:], uint32(len(props[i+1])))
		body += string([]byte{byte(len(props[i]))}) + props[i] + string(vl[:]) + props[i+1]
	}
	return cmdFrame(body)
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func longHeader(flags byte, size uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{flags | flagLong}, size)
}

func TestScannerRefusesWhatBreaksALimit(t *testing.T) {
	hs := cat(greeting(), ready("Socket-Type", "DEALER"))
	cases := []struct {
		name string
		in   []byte
		want string // "" when the input is accepted
	}{
		{"handshake and a message", cat(hs, frame(flagMore, "id"), frame(0, "hello")), ""},
		{"frame at MaxFrame", cat(hs, frame(0, strings.Repeat("x", 1<<10))), ""},
		{"messages each under MaxMessage", cat(hs, frame(flagMore, strings.Repeat("x", 1000)), frame(0, strings.Repeat("x", 1000)),
			frame(flagMore, strings.Repeat("x", 1000)), frame(0, strings.Repeat("x", 1000))), ""},
		{"READY without a socket type", cat(greeting(), cmdFrame("\x05READY")), `Socket-Type "" is not a ZMTP socket type`},
		{"READY with an unknown socket type", cat(greeting(), ready("Socket-Type", "STREAM")), `Socket-Type "STREAM" is not`},
		{"READY socket type named in lower case", cat(greeting(), ready("socket-type", "REQ")), ""},
		{"READY socket type named in upper case", cat(greeting(), ready("SOCKET-TYPE", "REQ")), `Socket-Type "" is not`},
		{"READY socket type given twice", cat(greeting(), ready("Socket-Type", "REQ", "Socket-Type", "bogus")), `Socket-Type "bogus" is not`},
		{"other command name is left to zmq4", cat(greeting(), cmdFrame("\x05ERROR\x03bad")), ""},
		{"frame over MaxFrame", cat(hs, longHeader(0, 1<<10+1)), "over the limit of 1024 bytes (MaxFrame)"},
		{"2^40", cat(hs, longHeader(0, 1<<40)), "declares 1099511627776 bytes"},
		{"2^63-1", cat(hs, longHeader(0, math.MaxInt64)), "declares 9223372036854775807 bytes"},
		{"2^64-1", cat(hs, longHeader(flagMore, math.MaxUint64)), "declares 18446744073709551615 bytes"},
		{"message over MaxMessage", cat(hs, frame(flagMore, strings.Repeat("x", 1000)), frame(flagMore, strings.Repeat("x", 1000)),
			frame(flagMore, strings.Repeat("x", 1000)), frame(flagMore, strings.Repeat("x", 1000)), frame(0, strings.Repeat("x", 200))),
			"reaches 4200 bytes, over the limit of 4096 bytes (MaxMessage)"},
		{"too many frames", cat(hs, bytes.Repeat([]byte{flagMore, 0}, 9)), "more than 8 frames (MaxFrames)"},
		{"huge command after the handshake", cat(hs, longHeader(flagCommand, 1<<20)), "command frame declares 1048576 bytes"},
		{"huge handshake command", cat(greeting(), longHeader(flagCommand, 1<<40)), "command frame declares"},
		{"data before the handshake", cat(greeting(), frame(0, "hello")), "not a single command frame"},
		{"handshake command with MORE", cat(greeting(), frame(flagCommand|flagMore, "\x05READY")), "not a single command frame"},
		{"empty handshake command", cat(greeting(), cmdFrame("")), "handshake command is empty"},
		{"handshake name past the end", cat(greeting(), cmdFrame("\x09READY")), "name claims 9 bytes of 5"},
		{"READY cut inside a name", cat(greeting(), cmdFrame("\x05READY\x0bSoc")), "cut inside a property"},
		{"READY cut before the value length", cat(greeting(), cmdFrame("\x05READY\x04Sock")), "cut inside a property"},
		{"READY value past the end", cat(greeting(), cmdFrame("\x05READY\x04Sock\x00\x00\x00\x09DEALER")), `property "Sock" claims a 9-byte value, 6 bytes are left`},
		{"READY property with an empty name", cat(greeting(), cmdFrame("\x05READY\x00\x00\x00\x00\x00")), "empty name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, chunk := range []int{len(tc.in), 1, 7} {
				s := newScanner(testLimits)
				var err error
				for i := 0; i < len(tc.in) && err == nil; i += chunk {
					err = s.scan(tc.in[i:min(i+chunk, len(tc.in))])
				}
				switch {
				case tc.want == "" && err != nil:
					t.Fatalf("chunks of %d: refused: %v", chunk, err)
				case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
					t.Fatalf("chunks of %d: err = %v, want one containing %q", chunk, err, tc.want)
				}
				var ge *Error
				if err != nil && !errors.As(err, &ge) {
					t.Fatalf("err %T is not an *Error", err)
				}
				if err != nil && s.scan([]byte{0}) != err {
					t.Fatal("a scanner that refused once accepts more bytes")
				}
			}
		})
	}
}

// walk is a plain reading of a ZMTP stream, independent of the scanner: it returns the body
// sizes of the frames of each complete message, and false when a header or body is cut.
func walk(b []byte) (msgs [][]uint64, complete bool) {
	if len(b) < greetingLen {
		return nil, len(b) == 0
	}
	b = b[greetingLen:]
	var cur []uint64
	for len(b) > 0 {
		fl := b[0]
		var size uint64
		if fl&flagLong != 0 {
			if len(b) < 9 {
				return msgs, false
			}
			size, b = binary.BigEndian.Uint64(b[1:9]), b[9:]
		} else {
			if len(b) < 2 {
				return msgs, false
			}
			size, b = uint64(b[1]), b[2:]
		}
		if size > uint64(len(b)) {
			return msgs, false
		}
		b = b[size:]
		cur = append(cur, size)
		if fl&flagMore == 0 {
			msgs, cur = append(msgs, cur), nil
		}
	}
	return msgs, len(cur) == 0
}

// FuzzScanner checks that the scanner never panics, gives the same verdict however the
// bytes are cut into reads, and never accepts a complete stream whose frames or messages
// break the limits.
func FuzzScanner(f *testing.F) {
	hs := cat(greeting(), ready("Socket-Type", "DEALER"))
	f.Add(cat(hs, frame(flagMore, "id"), frame(0, "hello")), uint8(3))
	f.Add(cat(hs, longHeader(0, 1<<40)), uint8(1))
	f.Add(cat(hs, longHeader(0, math.MaxInt64)), uint8(5))
	f.Add(cat(greeting(), cmdFrame("\x05READY\x04Sock")), uint8(2))
	f.Add(cat(hs, bytes.Repeat([]byte{flagMore, 0}, 9)), uint8(4))
	f.Fuzz(func(t *testing.T, in []byte, chunk uint8) {
		whole := newScanner(testLimits).scan(in)
		s := newScanner(testLimits)
		var pieces error
		step := int(chunk%16) + 1
		for i := 0; i < len(in) && pieces == nil; i += step {
			pieces = s.scan(in[i:min(i+step, len(in))])
		}
		if (whole == nil) != (pieces == nil) || whole != nil && whole.Error() != pieces.Error() {
			t.Fatalf("whole: %v; in reads of %d: %v", whole, step, pieces)
		}
		if whole != nil {
			return
		}
		msgs, _ := walk(in)
		for _, m := range msgs {
			var sum uint64
			for _, size := range m {
				if size > uint64(testLimits.MaxFrame) {
					t.Fatalf("accepted a frame of %d bytes", size)
				}
				sum += size
			}
			if sum > uint64(testLimits.MaxMessage) || len(m) > testLimits.MaxFrames {
				t.Fatalf("accepted a message of %d frames, %d bytes", len(m), sum)
			}
		}
	})
}

// FuzzGuardedZMQ4 feeds arbitrary bytes, through the guard, to zmq4's own handshake and frame
// reader on the server side of a ROUTER, as a peer on the kernel's ports would. Without the
// guard a 2^40 header ends the fuzzing process (out of memory) and a short READY property
// list panics inside zmq4.
func FuzzGuardedZMQ4(f *testing.F) {
	hs := cat(greeting(), ready("Socket-Type", "DEALER", "Identity", "peer"))
	f.Add(cat(hs, frame(flagMore, "id"), frame(0, "hello")))
	f.Add(cat(hs, longHeader(0, 1<<40)))
	f.Add(cat(hs, longHeader(0, math.MaxInt64)))
	f.Add(cat(greeting(), cmdFrame("\x05READY\x04Sock")))
	f.Add(cat(greeting(), cmdFrame("\x05READY\x0bSocket-Type\x00\x00\x00\x06DEA")))
	f.Add(cat(hs, frame(flagCommand, "\x04PING\x00\x01"), frame(0, "")))
	f.Add(cat(greeting(), ready("Identity", "x")))
	f.Fuzz(func(t *testing.T, in []byte) {
		raw := &memConn{r: in}
		c := newConn(raw, settings{lim: testLimits, log: discard}, func() {})
		defer c.Close()
		zc, err := zmq4.Open(c, null.Security(), zmq4.Router, zmq4.SocketIdentity("kernel"), true, nil)
		if err != nil {
			return
		}
		for range 1 << 12 {
			msg, err := zc.RecvMsg()
			if err != nil {
				return
			}
			var sum int
			for _, fr := range msg.Frames {
				sum += len(fr)
			}
			if len(msg.Frames) > testLimits.MaxFrames || int64(sum) > testLimits.MaxMessage {
				t.Fatalf("zmq4 delivered %d frames, %d bytes", len(msg.Frames), sum)
			}
		}
	})
}
