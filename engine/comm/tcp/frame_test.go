package tcp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

func encode(f *frame) []byte { return append(f.header(), f.data...) }

func TestFrameRoundTrip(t *testing.T) {
	for _, f := range []*frame{
		{typ: frameData, kind: kindCode(comm.KindAllReduce), step: 1, dtype: tensor.BF16, group: 3, from: 1, to: 2, seq: 77, check: 0xdeadbeef, meta: []int64{-1, 40}, data: make([]byte, 40)},
		{typ: frameData, kind: kindCode(comm.KindBarrier)},
		{typ: frameError, kind: kindCode(comm.KindBroadcast), data: []byte("root disagrees")},
		{typ: frameCredit, kind: 0, group: 1, from: 2, to: 0},
		{typ: frameBye},
		{typ: frameAbort, data: []byte("rank 3 failed")},
	} {
		got, err := readFrame(bytes.NewReader(encode(f)), 1<<20)
		if err != nil {
			t.Fatalf("%+v: %v", f, err)
		}
		if !bytes.Equal(encode(got), encode(f)) {
			t.Errorf("round trip of %+v gave %+v", f, got)
		}
	}
}

// header returns a valid data frame header with fields patched by fn.
func rawHeader(fn func(h []byte)) []byte {
	f := &frame{typ: frameData, kind: kindCode(comm.KindAllGather), dtype: tensor.F32}
	h := f.header()
	fn(h)
	return h
}

func TestBadFramesAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{"wrong magic", rawHeader(func(h []byte) { copy(h, "HTTP") }), "not a halo-shell tcp frame"},
		{"unknown type", rawHeader(func(h []byte) { h[4] = 9 }), "unknown type 9"},
		{"unknown kind", rawHeader(func(h []byte) { h[5] = 200 }), "unknown collective kind 200"},
		{"unknown dtype", rawHeader(func(h []byte) { h[7] = 77 }), "unknown dtype 77"},
		{"payload over the limit", rawHeader(func(h []byte) { binary.LittleEndian.PutUint64(h[40:], 1<<50) }), "the limit is"},
		{"partial element", rawHeader(func(h []byte) { binary.LittleEndian.PutUint64(h[40:], 6) }), "not a whole number of f32 elements"},
		{"too much meta", rawHeader(func(h []byte) { binary.LittleEndian.PutUint32(h[20:], 1<<20) }), "meta values"},
		{"credit with payload", rawHeader(func(h []byte) { h[4] = frameCredit; binary.LittleEndian.PutUint64(h[40:], 4) }), "want none"},
		{"huge error message", rawHeader(func(h []byte) { h[4] = frameError; binary.LittleEndian.PutUint64(h[40:], 1<<30) }), "error frame with a message"},
		{"payload cut short", append(rawHeader(func(h []byte) { binary.LittleEndian.PutUint64(h[40:], 8) }), 1, 2, 3), "cut short"},
		{"meta cut short", append(rawHeader(func(h []byte) { binary.LittleEndian.PutUint32(h[20:], 2) }), 1, 2, 3), "meta cut short"},
		{"header cut short", []byte("HTC1\x01"), "unexpected EOF"},
	} {
		_, err := readFrame(bytes.NewReader(tc.in), 1<<20)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

func TestLargePayloadGrowsAsItArrives(t *testing.T) {
	// A frame that claims 64 MiB but carries 3 bytes fails without allocating 64 MiB first;
	// one that carries all of it arrives intact.
	f := &frame{typ: frameData, kind: kindCode(comm.KindP2P), dtype: tensor.U8, data: make([]byte, 2*directRead+5)}
	for i := range f.data {
		f.data[i] = byte(i * 7)
	}
	got, err := readFrame(bytes.NewReader(encode(f)), 1<<30)
	if err != nil || !bytes.Equal(got.data, f.data) {
		t.Fatalf("large frame: err %v, equal %v", err, err == nil && bytes.Equal(got.data, f.data))
	}
	h := rawHeader(func(h []byte) { h[7] = byte(tensor.U8); binary.LittleEndian.PutUint64(h[40:], 64<<20) })
	_, err = readFrame(bytes.NewReader(append(h, 1, 2, 3)), 1<<30)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("truncated large frame: got %v, want unexpected EOF", err)
	}
}

func FuzzReadFrame(f *testing.F) {
	f.Add(encode(&frame{typ: frameData, kind: 1, step: 1, dtype: tensor.F32, group: 2, seq: 5, meta: []int64{16}, data: make([]byte, 16)}))
	f.Add(encode(&frame{typ: frameError, kind: 3, data: []byte("no")}))
	f.Add(encode(&frame{typ: frameCredit}))
	f.Add(encode(&frame{typ: frameAbort, data: []byte("x")}))
	f.Add([]byte("HTC1"))
	f.Add(rawHeader(func(h []byte) { binary.LittleEndian.PutUint64(h[40:], 1<<62) }))
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := readFrame(bytes.NewReader(b), 1<<20)
		if err != nil {
			return
		}
		// A frame that decodes re-encodes to the bytes it came from.
		enc := encode(fr)
		if !bytes.Equal(enc, b[:len(enc)]) {
			t.Fatalf("decoded %+v re-encodes to %x, input %x", fr, enc, b[:len(enc)])
		}
	})
}

// inject writes raw bytes on process from's connection to process to.
func inject(t *testing.T, ws []*World, from, to int, b []byte) {
	t.Helper()
	p := ws[from].peers[to]
	p.wmu.Lock()
	defer p.wmu.Unlock()
	if _, err := p.conn.Write(b); err != nil {
		t.Fatal(err)
	}
}

func TestBadFrameFromPeerAbortsWithClearError(t *testing.T) {
	for _, tc := range []struct {
		name string
		raw  func(w *World) []byte
		want string
	}{
		{"wrong sequence number", func(w *World) []byte {
			c := w.Comm(0)
			return encode(&frame{typ: frameData, kind: kindCode(comm.KindBarrier), group: c.g.id, from: 0, to: 1, seq: 7, check: c.g.check})
		}, "collective sequence number 7, this rank is at 0"},
		{"another collective", func(w *World) []byte {
			c := w.Comm(0)
			return encode(&frame{typ: frameData, kind: kindCode(comm.KindAllGather), group: c.g.id, from: 0, to: 1, check: c.g.check})
		}, "called all_gather while rank 1 called barrier"},
		{"another group", func(w *World) []byte {
			c := w.Comm(0)
			return encode(&frame{typ: frameData, kind: kindCode(comm.KindBarrier), group: c.g.id, from: 0, to: 1, check: 12345})
		}, "group built differently"},
		{"wrong length", func(*World) []byte {
			return rawHeader(func(h []byte) { binary.LittleEndian.PutUint64(h[40:], 3) })
		}, "not a whole number of f32 elements"},
		{"not a frame", func(*World) []byte { return []byte("GET / HTTP/1.1\r\n\r\n" + strings.Repeat("x", 40)) }, "not a halo-shell tcp frame"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws := joinInProcess(t, []int{1, 1}, 20*time.Second)
			inject(t, ws, 0, 1, tc.raw(ws[0]))
			err := ws[1].Comm(0).Barrier()
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "barrier") {
				t.Fatalf("got %v, want an error of the barrier containing %q", err, tc.want)
			}
			// The world is aborted on both processes. Process 0 may complete the barrier it
			// was sent the frames of (process 1 sends before it receives); its next one fails.
			if err := ws[1].Comm(0).Barrier(); err == nil || !strings.Contains(err.Error(), "aborted") {
				t.Errorf("process 1 after the bad frame: %v, want an aborted world", err)
			}
			err = ws[0].Comm(0).Barrier()
			if err == nil {
				err = ws[0].Comm(0).Barrier()
			}
			// (When process 1 closed the connection, process 0's write may fail before its
			// reader sees the end: that error names the peer as gone.)
			if err == nil || !(strings.Contains(err.Error(), "aborted") || strings.Contains(err.Error(), "is gone")) {
				t.Errorf("process 0 after the bad frame: %v, want an aborted world", err)
			}
		})
	}
}

func TestMeshHandshake(t *testing.T) {
	id := []byte("world-id")
	for _, tc := range []struct {
		name, token string
		node        int
		id          []byte
		want        string // empty: accepted
	}{
		{"right token", "right", 1, id, ""},
		{"wrong token", "wrong", 1, id, "wrong token"},
		{"another world", "right", 1, []byte("other-world"), "wrong token"},
		{"lower node dials", "right", 0, id, "may not connect"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			acceptor := &World{node: 0, peers: make([]*peer, 2)}
			type res struct {
				node int
				err  error
			}
			done := make(chan res, 1)
			go func() {
				n, err := acceptor.acceptHello(a, id, "right", time.Now().Add(5*time.Second))
				if err != nil {
					a.Close()
				}
				done <- res{n, err}
			}()
			nonce := make([]byte, 32)
			if _, err := io.ReadFull(b, nonce); err != nil {
				t.Fatal(err)
			}
			h := append([]byte(helloMagic), binary.BigEndian.AppendUint32(nil, uint32(tc.node))...)
			go b.Write(append(h, meshMAC(tc.token, tc.id, nonce, tc.node)...))
			var ack [1]byte
			_, ackErr := io.ReadFull(b, ack[:])
			r := <-done
			if tc.want == "" {
				if r.err != nil || r.node != tc.node || ackErr != nil || ack[0] != ackByte {
					t.Fatalf("got node %d, err %v, ack %q (%v); want node %d accepted", r.node, r.err, ack[0], ackErr, tc.node)
				}
				return
			}
			if r.err == nil || !strings.Contains(r.err.Error(), tc.want) || ackErr == nil {
				t.Fatalf("got %v (ack error %v), want a refusal containing %q", r.err, ackErr, tc.want)
			}
		})
	}
}
