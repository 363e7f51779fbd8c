package wire

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// ProtocolVersion is the messaging protocol version this package speaks.
const ProtocolVersion = "5.3"

// Delimiter separates the routing identities from the message proper.
const Delimiter = "<IDS|MSG>"

// Limits on what Parse accepts, so that hostile input cannot make the kernel allocate without
// bound.
const (
	// MaxIdentities bounds the routing prefix.
	MaxIdentities = 64
	// MaxBuffers bounds the binary buffers after the content.
	MaxBuffers = 256
)

// ErrBadSignature is wrapped by Parse's error when the signature does not match.
var ErrBadSignature = errors.New("wire: bad message signature")

// Header is the header of every message (and, in a reply, its parent header).
type Header struct {
	MsgID    string `json:"msg_id"`
	Session  string `json:"session"`
	Username string `json:"username"`
	Date     string `json:"date"`
	MsgType  string `json:"msg_type"`
	Version  string `json:"version"`
}

// Message is one Jupyter message.
type Message struct {
	// Identities are the ROUTER routing frames before the delimiter; a reply carries the
	// request's identities back.
	Identities [][]byte
	Header     Header
	// Parent is the parent header exactly as received or to be sent ("{}" when none).
	Parent json.RawMessage
	// Metadata and Content are JSON objects.
	Metadata json.RawMessage
	Content  json.RawMessage
	Buffers  [][]byte
}

// ParentHeader decodes Parent (a zero Header when it is empty).
func (m *Message) ParentHeader() (Header, error) {
	var h Header
	if len(m.Parent) == 0 {
		return h, nil
	}
	err := json.Unmarshal(m.Parent, &h)
	return h, err
}

// Signer signs and verifies messages with HMAC-SHA256. A Signer with an empty key signs with
// an empty signature and accepts any signature, as the protocol specifies.
type Signer struct {
	key []byte
}

// NewSigner returns a Signer for key (the connection file's "key").
func NewSigner(key string) *Signer { return &Signer{key: []byte(key)} }

// Enabled reports whether messages are signed.
func (s *Signer) Enabled() bool { return s != nil && len(s.key) > 0 }

func (s *Signer) mac(parts ...[]byte) []byte {
	h := hmac.New(sha256.New, s.key)
	for _, p := range parts {
		h.Write(p)
	}
	return h.Sum(nil)
}

// Sign returns the hex signature of header, parent, metadata and content.
func (s *Signer) Sign(header, parent, metadata, content []byte) string {
	if !s.Enabled() {
		return ""
	}
	return hex.EncodeToString(s.mac(header, parent, metadata, content))
}

// Verify reports whether sig is the signature of the four parts (compared in constant time).
func (s *Signer) Verify(sig, header, parent, metadata, content []byte) bool {
	if !s.Enabled() {
		return true
	}
	want := s.mac(header, parent, metadata, content)
	got := make([]byte, hex.DecodedLen(len(sig)))
	n, err := hex.Decode(got, sig)
	if err != nil {
		return false
	}
	return hmac.Equal(got[:n], want)
}

// Parse decodes the frames of one multipart message and verifies its signature. The error
// names the frame that is wrong; a signature mismatch wraps ErrBadSignature.
func Parse(frames [][]byte, s *Signer) (*Message, error) {
	d := -1
	for i, f := range frames {
		if i > MaxIdentities {
			break
		}
		if string(f) == Delimiter {
			d = i
			break
		}
	}
	if d < 0 {
		return nil, fmt.Errorf("wire: no %q delimiter among the first %d of %d frames", Delimiter, min(len(frames), MaxIdentities+1), len(frames))
	}
	rest := frames[d+1:]
	if len(rest) < 5 {
		return nil, fmt.Errorf("wire: %d frames after the delimiter; want at least 5 (signature, header, parent header, metadata, content)", len(rest))
	}
	if len(rest)-5 > MaxBuffers {
		return nil, fmt.Errorf("wire: %d buffers; at most %d are accepted", len(rest)-5, MaxBuffers)
	}
	sig, header, parent, metadata, content := rest[0], rest[1], rest[2], rest[3], rest[4]
	if !s.Verify(sig, header, parent, metadata, content) {
		return nil, fmt.Errorf("%w (signature frame %q)", ErrBadSignature, truncate(sig, 80))
	}
	m := &Message{Identities: frames[:d]}
	if err := json.Unmarshal(header, &m.Header); err != nil {
		return nil, fmt.Errorf("wire: header frame: %v", err)
	}
	if m.Header.MsgType == "" {
		return nil, fmt.Errorf("wire: header frame: no msg_type")
	}
	for _, p := range []struct {
		name string
		b    []byte
		dst  *json.RawMessage
	}{{"parent header", parent, &m.Parent}, {"metadata", metadata, &m.Metadata}, {"content", content, &m.Content}} {
		if err := checkObject(p.b); err != nil {
			return nil, fmt.Errorf("wire: %s frame: %v", p.name, err)
		}
		*p.dst = json.RawMessage(p.b)
	}
	if len(rest) > 5 {
		m.Buffers = rest[5:]
	}
	return m, nil
}

// checkObject reports whether b is one JSON object.
func checkObject(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || b[0] != '{' {
		return fmt.Errorf("not a JSON object (starts %q)", truncate(b, 20))
	}
	if !json.Valid(b) {
		var v any
		return json.Unmarshal(b, &v)
	}
	return nil
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

// Frames encodes m for sending, signing it with s. Empty Parent, Metadata or Content are sent
// as "{}".
func (m *Message) Frames(s *Signer) ([][]byte, error) {
	header, err := json.Marshal(m.Header)
	if err != nil {
		return nil, fmt.Errorf("wire: header of %s: %v", m.Header.MsgType, err)
	}
	obj := func(b json.RawMessage) []byte {
		if len(b) == 0 {
			return []byte("{}")
		}
		return b
	}
	parent, metadata, content := obj(m.Parent), obj(m.Metadata), obj(m.Content)
	out := make([][]byte, 0, len(m.Identities)+6+len(m.Buffers))
	out = append(out, m.Identities...)
	out = append(out, []byte(Delimiter), []byte(s.Sign(header, parent, metadata, content)), header, parent, metadata, content)
	out = append(out, m.Buffers...)
	return out, nil
}

// NewHeader returns a header for a new message of type msgType in session.
func NewHeader(msgType, session, username string) Header {
	return Header{
		MsgID:    NewID(),
		Session:  session,
		Username: username,
		Date:     time.Now().UTC().Format("2006-01-02T15:04:05.000000Z"),
		MsgType:  msgType,
		Version:  ProtocolVersion,
	}
}

// NewID returns a random UUID (version 4) as a string.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
