package zmtpguard

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/text/cases"
	"golang.org/x/text/language"
)

// ZMTP 3 framing (rfc.zeromq.org/spec/23): a 64-byte greeting, then frames. A frame is a
// flags byte, a size (one byte, or eight big-endian bytes when the LONG flag is set) and
// that many body bytes. A message is a run of frames whose flags carry MORE, ended by one
// that does not. The first frame a peer sends after its greeting is a command: READY for
// the NULL mechanism, whose body is a name and a list of properties.
const (
	greetingLen = 64

	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04

	// maxCommand bounds a command frame. Commands are a name and a few properties (socket
	// type, an identity of at most 255 bytes); 64 KiB leaves room for any real one.
	maxCommand = 64 << 10
)

type scanState uint8

const (
	inGreeting scanState = iota
	inFlags
	inSize
	inBody
)

// scanner follows the bytes a peer sends and refuses a frame header that breaks a limit
// before any of it reaches the ZMTP implementation, which allocates a frame's body as soon
// as it has read the header. It checks the peer's first command (READY) as a whole, since
// the implementation's metadata parser indexes past the end of a short property list. It
// keeps no more than one command body; every other byte is counted and passed on.
type scanner struct {
	lim Limits

	state scanState
	left  int // bytes of the greeting still to come

	flags   byte
	sizeBuf [8]byte
	sizeLen int // 1 or 8
	sizeGot int

	body      uint64 // body bytes of the current frame still to come
	msgBytes  uint64 // body bytes of the current message so far
	msgFrames int    // frames of the current message so far

	handshook bool   // the peer's first command has arrived and was checked
	cmd       []byte // that command's body while it arrives

	err error // the first limit broken; every later scan returns it
}

func newScanner(lim Limits) *scanner {
	return &scanner{lim: lim.withDefaults(), left: greetingLen}
}

// scan follows p, the next bytes from the peer. It returns an *Error at the first byte that
// breaks a limit or the handshake's format; the bytes before it in p are not to be trusted
// either, so the caller drops the connection.
func (s *scanner) scan(p []byte) error {
	if s.err != nil {
		return s.err
	}
	for i := 0; i < len(p); {
		switch s.state {
		case inGreeting:
			n := min(s.left, len(p)-i)
			i += n
			s.left -= n
			if s.left == 0 {
				s.state = inFlags
			}
		case inFlags:
			s.flags = p[i]
			i++
			s.sizeLen, s.sizeGot = 1, 0
			if s.flags&flagLong != 0 {
				s.sizeLen = 8
			}
			s.state = inSize
		case inSize:
			s.sizeBuf[s.sizeGot] = p[i]
			i++
			s.sizeGot++
			if s.sizeGot < s.sizeLen {
				continue
			}
			size := uint64(s.sizeBuf[0])
			if s.sizeLen == 8 {
				size = binary.BigEndian.Uint64(s.sizeBuf[:])
			}
			if err := s.header(size); err != nil {
				return s.fail(err)
			}
			s.body = size
			s.state = inBody
			if size == 0 {
				if err := s.endFrame(); err != nil {
					return s.fail(err)
				}
			}
		case inBody:
			n := uint64(len(p) - i)
			if n > s.body {
				n = s.body
			}
			if !s.handshook {
				s.cmd = append(s.cmd, p[i:i+int(n)]...)
			}
			i += int(n)
			s.body -= n
			if s.body == 0 {
				if err := s.endFrame(); err != nil {
					return s.fail(err)
				}
			}
		}
	}
	return nil
}

func (s *scanner) fail(err *Error) error {
	s.err = err
	return err
}

// header checks a frame header declaring size body bytes.
func (s *scanner) header(size uint64) *Error {
	isCmd := s.flags&flagCommand != 0
	if !s.handshook {
		if !isCmd || s.flags&flagMore != 0 {
			return &Error{Reason: fmt.Sprintf("the first frame after the greeting (flags %#02x) is not a single command frame; the ZMTP handshake starts with READY", s.flags)}
		}
	}
	if isCmd && size > maxCommand {
		return &Error{Reason: fmt.Sprintf("a command frame declares %d bytes, over the %d bytes any ZMTP command needs", size, maxCommand)}
	}
	if size > uint64(s.lim.MaxFrame) {
		return &Error{Reason: fmt.Sprintf("a frame declares %d bytes, over the limit of %d bytes (MaxFrame)", size, s.lim.MaxFrame)}
	}
	s.msgFrames++
	if s.msgFrames > s.lim.MaxFrames {
		return &Error{Reason: fmt.Sprintf("a message has more than %d frames (MaxFrames)", s.lim.MaxFrames)}
	}
	if s.msgBytes+size > uint64(s.lim.MaxMessage) {
		return &Error{Reason: fmt.Sprintf("a message reaches %d bytes, over the limit of %d bytes (MaxMessage)", s.msgBytes+size, s.lim.MaxMessage)}
	}
	s.msgBytes += size
	return nil
}

// endFrame is called once a frame's body has arrived in full.
func (s *scanner) endFrame() *Error {
	s.state = inFlags
	if !s.handshook {
		if err := checkCommand(s.cmd); err != nil {
			return err
		}
		s.handshook, s.cmd = true, nil
	}
	if s.flags&flagMore == 0 {
		s.msgBytes, s.msgFrames = 0, 0
	}
	return nil
}

// checkCommand checks the body of the peer's first command: a name, and for READY a list
// of properties that fills the body exactly (a name of 1 to 255 bytes, a 4-byte value
// length, the value) and names a known Socket-Type. Other commands are left to the ZMTP
// implementation, which refuses them without reading past their end.
func checkCommand(b []byte) *Error {
	if len(b) == 0 {
		return &Error{Reason: "the handshake command is empty"}
	}
	n := int(b[0])
	if 1+n > len(b) {
		return &Error{Reason: fmt.Sprintf("the handshake command's name claims %d bytes of %d", n, len(b)-1)}
	}
	if string(b[1:1+n]) != "READY" {
		return nil
	}
	sockType := ""
	for p := b[1+n:]; len(p) > 0; {
		kl := int(p[0])
		if kl == 0 {
			return &Error{Reason: "READY metadata has a property with an empty name"}
		}
		if 1+kl+4 > len(p) {
			return &Error{Reason: fmt.Sprintf("READY metadata is cut inside a property (%d bytes left)", len(p))}
		}
		vl := uint64(binary.BigEndian.Uint32(p[1+kl:]))
		rest := uint64(len(p) - 1 - kl - 4)
		if vl > rest {
			return &Error{Reason: fmt.Sprintf("READY metadata: property %q claims a %d-byte value, %d bytes are left", truncate(string(p[1:1+kl])), vl, rest)}
		}
		// zmq4 title-cases names (with a Caser of its own each time: a Caser is not safe
		// for concurrent use) and keeps the last value of a repeated one.
		if cases.Title(language.Und, cases.NoLower).String(string(p[1:1+kl])) == "Socket-Type" {
			sockType = string(p[1+kl+4 : 1+kl+4+int(vl)])
		}
		p = p[1+kl+4+int(vl):]
	}
	// zmq4 panics on a socket type it does not know.
	if !socketTypes[sockType] {
		return &Error{Reason: fmt.Sprintf("READY metadata: Socket-Type %q is not a ZMTP socket type", truncate(sockType))}
	}
	return nil
}

var socketTypes = map[string]bool{"PAIR": true, "PUB": true, "SUB": true, "REQ": true, "REP": true,
	"DEALER": true, "ROUTER": true, "PULL": true, "PUSH": true, "XPUB": true, "XSUB": true}

// truncate shortens a peer's string for an error message.
func truncate(s string) string {
	if len(s) > 32 {
		return s[:32] + "..."
	}
	return s
}
