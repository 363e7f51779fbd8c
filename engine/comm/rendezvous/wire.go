package rendezvous

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
)

// Frames on the wire: a 4-byte magic, one byte of message type, a 4-byte big-endian body
// length, then the body (JSON). Bodies are bounded by maxBody, so a hostile or confused peer
// cannot make a node allocate more than that.
const (
	magic         = "HRZ1"
	maxBody       = 1 << 20
	maxPayload    = 64 << 10
	maxHost       = 255
	challengeSize = 32
	macSize       = 32
)

// Message types.
const (
	msgChallenge byte = 'C' // node 0 -> node: a random challenge
	msgHello     byte = 'H' // node -> node 0: who I am, and the answer to the challenge
	msgWorld     byte = 'W' // node 0 -> node: the agreed world
	msgError     byte = 'E' // node 0 -> node: why the node or the rendezvous was refused
)

type challengeMsg struct {
	Nonce []byte `json:"nonce"`
}

type helloMsg struct {
	NodeRank int    `json:"node_rank"`
	NNodes   int    `json:"nnodes"`
	Devices  int    `json:"devices"`
	Host     string `json:"host"`
	Addr     string `json:"addr,omitempty"`
	MAC      []byte `json:"mac"`
}

type worldMsg struct {
	Nodes   []Node `json:"nodes"`
	Payload []byte `json:"payload"`
}

type errorMsg struct {
	Message string `json:"message"`
}

func writeFrame(w io.Writer, typ byte, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	if len(b) > maxBody {
		return fmt.Errorf("message of %d bytes exceeds the limit of %d", len(b), maxBody)
	}
	hdr := make([]byte, 0, 9+len(b))
	hdr = append(hdr, magic...)
	hdr = append(hdr, typ)
	hdr = binary.BigEndian.AppendUint32(hdr, uint32(len(b)))
	_, err = w.Write(append(hdr, b...))
	return err
}

// readFrame reads one frame and returns its type and body.
func readFrame(r io.Reader) (byte, []byte, error) {
	var hdr [9]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	if string(hdr[:4]) != magic {
		return 0, nil, fmt.Errorf("not a halo-shell rendezvous message (starts with %q, want %q); is HOST:PORT the rendezvous of node 0?", hdr[:4], magic)
	}
	n := binary.BigEndian.Uint32(hdr[5:])
	if n > maxBody {
		return 0, nil, fmt.Errorf("message body of %d bytes exceeds the limit of %d", n, maxBody)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, fmt.Errorf("message body cut short: %w", err)
	}
	return hdr[4], body, nil
}

// decode reads the body of one message of type typ into v and checks it. An error frame
// (msgError) is returned as a *RefusedError.
func decode(r io.Reader, typ byte, v any) error {
	got, body, err := readFrame(r)
	if err != nil {
		return err
	}
	if got == msgError && typ != msgError {
		var e errorMsg
		if err := strictUnmarshal(body, &e); err != nil {
			return fmt.Errorf("bad error message: %w", err)
		}
		return &RefusedError{Message: e.Message}
	}
	if got != typ {
		return fmt.Errorf("got message type %q, want %q", got, typ)
	}
	if err := strictUnmarshal(body, v); err != nil {
		return fmt.Errorf("bad %q message: %w", typ, err)
	}
	if c, ok := v.(interface{ check() error }); ok {
		return c.check()
	}
	return nil
}

func strictUnmarshal(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("trailing data after the message")
	}
	return nil
}

func (m *challengeMsg) check() error {
	if len(m.Nonce) != challengeSize {
		return fmt.Errorf("challenge of %d bytes, want %d", len(m.Nonce), challengeSize)
	}
	return nil
}

func (m *helloMsg) check() error {
	switch {
	case len(m.MAC) != macSize:
		return fmt.Errorf("hello: answer of %d bytes, want %d", len(m.MAC), macSize)
	case m.NNodes < 1 || m.NNodes > MaxNodes:
		return fmt.Errorf("hello: nnodes %d outside 1..%d", m.NNodes, MaxNodes)
	case m.Devices < 0 || m.Devices > MaxDevicesPerNode:
		return fmt.Errorf("hello: device count %d outside 0..%d", m.Devices, MaxDevicesPerNode)
	case len(m.Host) > maxHost:
		return fmt.Errorf("hello: host name of %d bytes is longer than %d", len(m.Host), maxHost)
	}
	if err := checkAddr(m.Addr); err != nil {
		return fmt.Errorf("hello: %v", err)
	}
	return nil
}

func (m *worldMsg) check() error {
	if len(m.Nodes) < 1 || len(m.Nodes) > MaxNodes {
		return fmt.Errorf("world: %d nodes, want 1..%d", len(m.Nodes), MaxNodes)
	}
	if len(m.Payload) > maxPayload {
		return fmt.Errorf("world: payload of %d bytes exceeds %d", len(m.Payload), maxPayload)
	}
	for i, n := range m.Nodes {
		if n.Rank != i {
			return fmt.Errorf("world: node %d has rank %d", i, n.Rank)
		}
		if n.Devices < 0 || n.Devices > MaxDevicesPerNode {
			return fmt.Errorf("world: node %d has %d devices, want 0..%d", i, n.Devices, MaxDevicesPerNode)
		}
		if len(n.Host) > maxHost {
			return fmt.Errorf("world: node %d host name too long", i)
		}
		if err := checkAddr(n.Addr); err != nil {
			return fmt.Errorf("world: node %d: %v", i, err)
		}
	}
	return nil
}

// checkAddr accepts an empty address or HOST:PORT (HOST may be empty) of bounded length.
func checkAddr(a string) error {
	if a == "" {
		return nil
	}
	if len(a) > maxHost+8 {
		return fmt.Errorf("address of %d bytes is longer than %d", len(a), maxHost+8)
	}
	if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
		return fmt.Errorf("address %q is not HOST:PORT", a)
	}
	return nil
}

// RefusedError is node 0's refusal, as the refused node sees it.
type RefusedError struct{ Message string }

func (e *RefusedError) Error() string { return "refused by node 0: " + e.Message }
