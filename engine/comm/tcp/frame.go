package tcp

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// A frame on a connection between two processes is a fixed 48-byte header, Meta little-endian
// int64 values, then Len bytes of payload:
//
//	0  magic "HTC1"
//	4  type     (frameData, frameError, frameCredit, frameBye, frameAbort)
//	5  kind     collective kind code (kindCodes), 0 for control frames
//	6  step     the step of the collective this frame belongs to (all-reduce has two)
//	7  dtype    tensor.DType of the payload (0 when it carries no tensor data)
//	8  group    uint32, the group's number in the world (0 is the world group)
//	12 from     uint32, the sender's rank in the group
//	16 to       uint32, the receiver's rank in the group
//	20 nmeta    uint32, number of meta values
//	24 seq      uint64, the sender's collective (or point-to-point) sequence number
//	32 check    uint64, a hash of the group's name and members, so frames of a group the two
//	            processes built differently are refused
//	40 len      uint64, payload bytes
//
// Every field is checked before anything is allocated; a payload over 16 MiB is read into a
// buffer that grows with the bytes that actually arrive, so a peer that claims a huge length
// cannot make the receiver allocate it up front.
const (
	frameMagic  = "HTC1"
	headerSize  = 48
	maxMeta     = 1 << 16
	maxErrorMsg = 64 << 10
	// directRead is the payload size up to which the buffer is allocated at once.
	directRead = 16 << 20
)

// Frame types.
const (
	frameData   byte = 1 // a rank's contribution to a collective step, or a point-to-point message
	frameError  byte = 2 // in place of a contribution: the sender failed this collective (payload: why)
	frameCredit byte = 3 // the receiver consumed a point-to-point message: the sender may send one more
	frameBye    byte = 4 // the sending process closes its world after this frame
	frameAbort  byte = 5 // the sending process aborted the world (payload: why)
)

// lanes separate collectives from point-to-point messages, which are not ordered with them.
const (
	laneColl byte = 0
	laneP2P  byte = 1
)

// kindCodes number the collective kinds on the wire.
var kindCodes = []string{
	"", comm.KindAllReduce, comm.KindAllGather, comm.KindReduceScatter, comm.KindAllToAllDispatch,
	comm.KindAllToAllCombine, comm.KindBroadcast, comm.KindP2P, comm.KindBarrier,
}

func kindCode(kind string) byte {
	for i, k := range kindCodes {
		if k == kind {
			return byte(i)
		}
	}
	return 0
}

// frame is one decoded frame.
type frame struct {
	typ   byte
	kind  byte
	step  byte
	dtype tensor.DType
	group uint32
	from  uint32
	to    uint32
	seq   uint64
	check uint64
	meta  []int64
	data  []byte
}

func (f *frame) kindName() string {
	if int(f.kind) < len(kindCodes) {
		return kindCodes[f.kind]
	}
	return fmt.Sprintf("kind(%d)", f.kind)
}

func (f *frame) lane() byte {
	if f.kind == kindCode(comm.KindP2P) {
		return laneP2P
	}
	return laneColl
}

// header encodes f's header and meta (not its payload).
func (f *frame) header() []byte {
	b := make([]byte, headerSize, headerSize+8*len(f.meta))
	copy(b, frameMagic)
	b[4], b[5], b[6], b[7] = f.typ, f.kind, f.step, byte(f.dtype)
	binary.LittleEndian.PutUint32(b[8:], f.group)
	binary.LittleEndian.PutUint32(b[12:], f.from)
	binary.LittleEndian.PutUint32(b[16:], f.to)
	binary.LittleEndian.PutUint32(b[20:], uint32(len(f.meta)))
	binary.LittleEndian.PutUint64(b[24:], f.seq)
	binary.LittleEndian.PutUint64(b[32:], f.check)
	binary.LittleEndian.PutUint64(b[40:], uint64(len(f.data)))
	for _, m := range f.meta {
		b = binary.LittleEndian.AppendUint64(b, uint64(m))
	}
	return b
}

// decodeHeader checks a header and returns the frame it starts, the number of meta values and
// the payload length. maxPayload bounds the payload of data frames.
func decodeHeader(h []byte, maxPayload uint64) (*frame, int, uint64, error) {
	if len(h) != headerSize {
		return nil, 0, 0, fmt.Errorf("frame header of %d bytes, want %d", len(h), headerSize)
	}
	if string(h[:4]) != frameMagic {
		return nil, 0, 0, fmt.Errorf("not a halo-shell tcp frame (starts with %q, want %q); is the peer a halo-shell process of this run?", h[:4], frameMagic)
	}
	f := &frame{typ: h[4], kind: h[5], step: h[6], dtype: tensor.DType(h[7])}
	f.group = binary.LittleEndian.Uint32(h[8:])
	f.from = binary.LittleEndian.Uint32(h[12:])
	f.to = binary.LittleEndian.Uint32(h[16:])
	nmeta := binary.LittleEndian.Uint32(h[20:])
	f.seq = binary.LittleEndian.Uint64(h[24:])
	f.check = binary.LittleEndian.Uint64(h[32:])
	n := binary.LittleEndian.Uint64(h[40:])
	if nmeta > maxMeta {
		return nil, 0, 0, fmt.Errorf("frame with %d meta values, the limit is %d", nmeta, maxMeta)
	}
	switch f.typ {
	case frameData:
		if f.kind == 0 || int(f.kind) >= len(kindCodes) {
			return nil, 0, 0, fmt.Errorf("data frame of unknown collective kind %d", f.kind)
		}
		if f.dtype != tensor.Invalid && !f.dtype.Valid() {
			return nil, 0, 0, fmt.Errorf("data frame of %s with unknown dtype %d", f.kindName(), h[7])
		}
		if n > maxPayload {
			return nil, 0, 0, fmt.Errorf("data frame of %s with a payload of %d bytes, the limit is %d (Config.MaxMessage)", f.kindName(), n, maxPayload)
		}
		if sz := f.dtype.Size(); sz > 0 && n%uint64(sz) != 0 {
			return nil, 0, 0, fmt.Errorf("data frame of %s: %d bytes is not a whole number of %s elements", f.kindName(), n, f.dtype)
		}
	case frameError, frameAbort:
		if n > maxErrorMsg {
			return nil, 0, 0, fmt.Errorf("error frame with a message of %d bytes, the limit is %d", n, maxErrorMsg)
		}
		if f.typ == frameError && (f.kind == 0 || int(f.kind) >= len(kindCodes)) {
			return nil, 0, 0, fmt.Errorf("error frame of unknown collective kind %d", f.kind)
		}
	case frameCredit, frameBye:
		if n != 0 || nmeta != 0 {
			return nil, 0, 0, fmt.Errorf("control frame of type %d carries %d meta values and %d payload bytes, want none", f.typ, nmeta, n)
		}
	default:
		return nil, 0, 0, fmt.Errorf("frame of unknown type %d", f.typ)
	}
	return f, int(nmeta), n, nil
}

// readFrame reads one frame from r.
func readFrame(r io.Reader, maxPayload uint64) (*frame, error) {
	var h [headerSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	f, nmeta, n, err := decodeHeader(h[:], maxPayload)
	if err != nil {
		return nil, err
	}
	if nmeta > 0 {
		mb := make([]byte, 8*nmeta)
		if _, err := io.ReadFull(r, mb); err != nil {
			return nil, fmt.Errorf("frame meta cut short: %w", noEOF(err))
		}
		f.meta = make([]int64, nmeta)
		for i := range f.meta {
			f.meta[i] = int64(binary.LittleEndian.Uint64(mb[8*i:]))
		}
	}
	if f.data, err = readPayload(r, n); err != nil {
		return nil, fmt.Errorf("frame payload of %d bytes cut short: %w", n, noEOF(err))
	}
	return f, nil
}

// readPayload reads n bytes, growing its buffer only as bytes arrive beyond directRead.
func readPayload(r io.Reader, n uint64) ([]byte, error) {
	if n <= directRead {
		b := make([]byte, n)
		_, err := io.ReadFull(r, b)
		return b, err
	}
	b := make([]byte, 0, directRead)
	for uint64(len(b)) < n {
		if len(b) == cap(b) {
			nb := make([]byte, len(b), min(uint64(2*cap(b)), n))
			copy(nb, b)
			b = nb
		}
		k, err := io.ReadFull(r, b[len(b):cap(b)])
		b = b[:len(b)+k]
		if err != nil {
			return nil, err
		}
	}
	return b, nil
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
