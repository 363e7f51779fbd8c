package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// T is a tensor on the rank's backend.
type T = tensor.Tensor

// Comm is one local rank's communicator in one group.
type Comm struct {
	w    *World
	g    *group
	rank int
	b    backend.Backend

	// Owned by the rank's goroutine.
	seq              uint64
	sendSeq, recvSeq []uint64

	comm.Accounting
}

var _ comm.Communicator = (*Comm)(nil)

func (c *Comm) Rank() int                { return c.rank }
func (c *Comm) Size() int                { return len(c.g.members) }
func (c *Comm) Group() string            { return c.g.name }
func (c *Comm) Backend() backend.Backend { return c.b }

// run times fn as a collective of kind over bytes and records it, as the in-process
// communicator does.
func (c *Comm) run(kind string, bytes int64, fn func() error) error {
	return c.Run(kind, c.g.name, bytes, fn)
}

func (c *Comm) errf(kind, format string, args ...any) error {
	return fmt.Errorf("tcp: group %s rank %d: %s: %s", c.g.name, c.rank, kind, fmt.Sprintf(format, args...))
}

// peerName names group rank j for messages.
func (c *Comm) peerName(j int) string {
	g := c.g.members[j]
	return fmt.Sprintf("rank %d (global rank %d on node %d)", j, g, c.w.nodeOf(g))
}

// op is one call of a collective on one rank: every rank sends and takes the same frames
// whatever happens, so a failure on one rank reaches the others as an error frame instead of
// leaving them waiting. fatal errors (a lost peer, a timeout, frames out of order) abort the
// world; err is the first error of this call that leaves the world usable (a mismatch of sizes
// or dtypes, a failed download, a peer's error frame).
type op struct {
	c        *Comm
	kind     string
	code     byte
	seq      uint64
	deadline time.Time
	err      error
}

func (c *Comm) begin(kind string) (*op, error) {
	o := &op{c: c, kind: kind, code: kindCode(kind), seq: c.seq, deadline: time.Now().Add(c.w.timeout)}
	c.seq++
	if err := c.w.abortCause(); err != nil {
		return nil, c.errf(kind, "the world was aborted: %v", err)
	}
	return o, nil
}

func (o *op) fail(err error) {
	if o.err == nil && err != nil {
		o.err = err
	}
}

// peers lists the other ranks of the group starting after this one, so that the ranks do not
// all send to the same rank first.
func (c *Comm) peers() []int {
	n := len(c.g.members)
	out := make([]int, 0, n-1)
	for k := 1; k < n; k++ {
		out = append(out, (c.rank+k)%n)
	}
	return out
}

// send sends a data frame of this collective to group rank j, or an error frame when o.err is
// set and data is nil.
func (o *op) send(step byte, j int, dt tensor.DType, meta []int64, data []byte) error {
	c := o.c
	f := &frame{typ: frameData, kind: o.code, step: step, dtype: dt, group: c.g.id,
		from: uint32(c.rank), to: uint32(j), seq: o.seq, check: c.g.check, meta: meta, data: data}
	return c.sendFrame(f, j, o.kind, o.deadline)
}

func (o *op) sendErr(step byte, j int) error {
	c := o.c
	msg := []byte("failed")
	if o.err != nil {
		msg = []byte(o.err.Error())
	}
	if len(msg) > maxErrorMsg {
		msg = msg[:maxErrorMsg]
	}
	f := &frame{typ: frameError, kind: o.code, step: step, group: c.g.id,
		from: uint32(c.rank), to: uint32(j), seq: o.seq, check: c.g.check, data: msg}
	return c.sendFrame(f, j, o.kind, o.deadline)
}

// sendFrame hands f to group rank j: directly when j lives in this process, over its
// connection otherwise. A failed write aborts the world.
func (c *Comm) sendFrame(f *frame, j int, kind string, deadline time.Time) error {
	node := c.w.nodeOf(c.g.members[j])
	if node == c.w.node {
		c.w.deliver(f)
		return nil
	}
	p := c.w.peers[node]
	if err := p.write(f, deadline); err != nil {
		if cause := c.w.abortCause(); cause != nil {
			return c.errf(kind, "sending to %s: the world was aborted: %v", c.peerName(j), cause)
		}
		return c.w.fatal(c.errf(kind, "sending to %s: %v; the process of that rank is gone, stuck or unreachable: check its log, then restart the run", c.peerName(j), err))
	}
	return nil
}

// take waits for the next frame of stream k, sent by group rank j.
func (c *Comm) take(k boxKey, j int, kind string, deadline time.Time) (*frame, error) {
	m := c.w.box(k)
	var gone chan struct{}
	var p *peer
	if node := c.w.nodeOf(c.g.members[j]); node != c.w.node {
		p = c.w.peers[node]
		gone = p.gone
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if f := m.pop(); f != nil {
			return f, nil
		}
		if cause := c.w.abortCause(); cause != nil {
			return nil, c.errf(kind, "waiting for %s: the world was aborted: %v", c.peerName(j), cause)
		}
		if p != nil {
			select {
			case <-gone:
				if f := m.pop(); f != nil {
					return f, nil
				}
				return nil, c.errf(kind, "waiting for %s: %v", c.peerName(j), p.goneErr)
			default:
			}
		}
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline))
		}
		select {
		case <-m.ready:
		case <-c.w.aborted:
		case <-gone:
		case <-timer.C:
			if f := m.pop(); f != nil {
				return f, nil
			}
			return nil, c.w.fatal(c.errf(kind, "timed out after %v waiting for %s: that rank is stuck, slower than the timeout or running other collectives; raise the timeout (Config.Timeout) if it is only slow", c.w.timeout, c.peerName(j)))
		}
	}
}

// recv takes the step's frame from group rank j. It returns nil (and records why in o.err)
// for an error frame or a frame of another dtype; a non-nil error is fatal.
func (o *op) recv(step byte, j int, dt tensor.DType) (*frame, error) {
	c := o.c
	f, err := c.take(boxKey{group: c.g.id, from: uint32(j), to: uint32(c.rank), lane: laneColl}, j, o.kind, o.deadline)
	if err != nil {
		return nil, err
	}
	if err := o.check(f, step, j); err != nil {
		return nil, err
	}
	if f.typ == frameError {
		o.fail(c.errf(o.kind, "%s failed: %s", c.peerName(j), f.data))
		return nil, nil
	}
	if f.dtype != dt {
		o.fail(c.errf(o.kind, "rank %d has dtype %s, rank %d %s", c.rank, dt, j, f.dtype))
		return nil, nil
	}
	return f, nil
}

// check refuses a frame that does not belong to this step of this collective: the ranks have
// fallen out of step, so the world is aborted.
func (o *op) check(f *frame, step byte, j int) error {
	c := o.c
	switch {
	case f.check != c.g.check:
		return c.w.fatal(c.errf(o.kind, "bad frame from %s: it belongs to a group built differently (hash %x, this rank's %x); every process must call Split with the same groups in the same order", c.peerName(j), f.check, c.g.check))
	case f.seq != o.seq:
		return c.w.fatal(c.errf(o.kind, "bad frame from %s: collective sequence number %d, this rank is at %d; the ranks ran different numbers of collectives in this group", c.peerName(j), f.seq, o.seq))
	case f.kind != o.code:
		return c.w.fatal(c.errf(o.kind, "%s called %s while rank %d called %s; every rank must run the same collectives in the same order", c.peerName(j), f.kindName(), c.rank, o.kind))
	case f.step != step:
		return c.w.fatal(c.errf(o.kind, "bad frame from %s: step %d of the collective, this rank is at step %d (do the ranks agree on the root?)", c.peerName(j), f.step, step))
	}
	return nil
}

// exchange runs one step in which every rank sends to every other: out(j) gives the meta and
// payload for rank j (ignored, and an error frame sent instead, when o.err is set), and in is
// called with every frame received. It returns a fatal error only.
func (o *op) exchange(step byte, dt tensor.DType, out func(j int) ([]int64, []byte), in func(j int, f *frame)) error {
	c := o.c
	failed := o.err != nil
	for _, j := range c.peers() {
		var err error
		if failed {
			err = o.sendErr(step, j)
		} else {
			meta, data := out(j)
			err = o.send(step, j, dt, meta, data)
		}
		if err != nil {
			return err
		}
	}
	for _, j := range c.peers() {
		f, err := o.recv(step, j, dt)
		if err != nil {
			return err
		}
		if f != nil && in != nil {
			in(j, f)
		}
	}
	return nil
}

// abandon takes part in a collective this rank cannot run (its arguments are wrong): it sends
// error frames for each of its steps and drains the others' frames, so that every rank returns
// an error instead of waiting.
func (c *Comm) abandon(kind string, steps int, err error) error {
	o, berr := c.begin(kind)
	if berr != nil {
		return berr
	}
	o.err = err
	for s := range steps {
		if ferr := o.exchange(byte(s), tensor.Invalid, nil, nil); ferr != nil {
			return errors.Join(err, ferr)
		}
	}
	return err
}

func (c *Comm) download(t T) ([]byte, error) {
	buf := make([]byte, t.Bytes())
	if err := c.b.Download(buf, t); err != nil {
		return nil, err
	}
	return buf, nil
}

func checkFloat(c *Comm, kind string, t T) error {
	if t.IsNil() {
		return c.errf(kind, "nil tensor")
	}
	if !t.DType().IsFloat() {
		return c.errf(kind, "tensor %v has dtype %s; reductions need f32, bf16 or f16", t, t.DType())
	}
	return nil
}

// reduceChunk is how many elements reduce accumulates at a time (its float64 buffer stays in
// cache and no tensor-sized temporary is allocated).
const reduceChunk = 4096

// reduce adds the contributions (each a part of the same length) in rank order in float64 and
// rounds once to dt, element by element exactly as the in-process communicator does, so both
// give the same bits.
func reduce(parts [][]byte, dt tensor.DType, op comm.ReduceOp) ([]byte, error) {
	if !dt.IsFloat() {
		return nil, fmt.Errorf("cannot reduce %s", dt)
	}
	es := dt.Size()
	n := len(parts[0]) / es
	out := make([]byte, n*es)
	var acc [reduceChunk]float64
	for lo := 0; lo < n; lo += reduceChunk {
		a := acc[:min(reduceChunk, n-lo)]
		clear(a)
		for _, p := range parts {
			p = p[lo*es:]
			switch dt {
			case tensor.F32:
				for i := range a {
					a[i] += float64(math.Float32frombits(binary.LittleEndian.Uint32(p[4*i:])))
				}
			case tensor.BF16:
				for i := range a {
					a[i] += float64(tensor.BF16ToF32(binary.LittleEndian.Uint16(p[2*i:])))
				}
			case tensor.F16:
				for i := range a {
					a[i] += float64(tensor.F16ToF32(binary.LittleEndian.Uint16(p[2*i:])))
				}
			}
		}
		o := out[lo*es:]
		for i, v := range a {
			if op == comm.Avg {
				v /= float64(len(parts))
			}
			f := float32(v)
			switch dt {
			case tensor.F32:
				binary.LittleEndian.PutUint32(o[4*i:], math.Float32bits(f))
			case tensor.BF16:
				binary.LittleEndian.PutUint16(o[2*i:], tensor.F32ToBF16(f))
			case tensor.F16:
				binary.LittleEndian.PutUint16(o[2*i:], tensor.F32ToF16(f))
			}
		}
	}
	return out, nil
}

// partOf is the element range [lo, hi) of rank j's part of numel elements over n ranks.
func partOf(j, n, numel int) (int, int) { return j * numel / n, (j + 1) * numel / n }

// AllReduce implements comm.Communicator. Rank r reduces part r of every rank's tensor (sent
// to it by each rank) in rank order, then every rank sends its reduced part to every other: two
// steps, each element reduced once, the same result on every rank.
func (c *Comm) AllReduce(t T, op comm.ReduceOp) error {
	const kind = comm.KindAllReduce
	if err := checkFloat(c, kind, t); err != nil {
		return c.abandon(kind, 2, err)
	}
	return c.run(kind, t.Bytes(), func() error {
		o, err := c.begin(kind)
		if err != nil {
			return err
		}
		dt, n, numel, es := t.DType(), c.Size(), t.Numel(), t.DType().Size()
		data, err := c.download(t)
		if err != nil {
			o.fail(c.errf(kind, "%v", err))
		}
		total := []int64{t.Bytes()}
		slice := func(j int) []byte {
			lo, hi := partOf(j, n, numel)
			return data[lo*es : hi*es]
		}
		parts := make([][]byte, n)
		if data != nil {
			parts[c.rank] = slice(c.rank)
		}
		err = o.exchange(0, dt, func(j int) ([]int64, []byte) { return total, slice(j) }, func(j int, f *frame) {
			if len(f.meta) != 1 || f.meta[0] != t.Bytes() || len(f.data) != len(parts[c.rank]) {
				o.fail(c.errf(kind, "rank %d has %d bytes, this rank %d; every rank must pass the same shape", j, metaAt(f, 0), t.Bytes()))
				return
			}
			parts[j] = f.data
		})
		if err != nil {
			return err
		}
		var mine []byte
		if o.err == nil {
			mine, err = reduce(parts, dt, op)
			if err != nil {
				o.fail(c.errf(kind, "%v", err))
			}
		}
		err = o.exchange(1, dt, func(int) ([]int64, []byte) { return total, mine }, func(j int, f *frame) {
			if o.err != nil {
				return
			}
			lo, hi := partOf(j, n, numel)
			if len(f.data) != (hi-lo)*es {
				o.fail(c.errf(kind, "rank %d sent a reduced part of %d bytes, want %d", j, len(f.data), (hi-lo)*es))
				return
			}
			copy(data[lo*es:], f.data)
		})
		if err != nil {
			return err
		}
		if o.err != nil {
			return o.err
		}
		copy(slice(c.rank), mine)
		return c.b.Upload(t, data)
	})
}

func metaAt(f *frame, i int) int64 {
	if i < len(f.meta) {
		return f.meta[i]
	}
	return -1
}

// AllGather implements comm.Communicator.
func (c *Comm) AllGather(dst, src T) error {
	const kind = comm.KindAllGather
	var verr error
	switch {
	case src.IsNil() || dst.IsNil():
		verr = c.errf(kind, "nil tensor")
	case dst.DType() != src.DType():
		verr = c.errf(kind, "dst %v and src %v differ in dtype", dst, src)
	case int64(dst.Numel()) != int64(src.Numel())*int64(c.Size()):
		verr = c.errf(kind, "dst %v must hold %d x %d elements (group size x src)", dst, c.Size(), src.Numel())
	}
	if verr != nil {
		return c.abandon(kind, 1, verr)
	}
	return c.run(kind, src.Bytes(), func() error {
		o, err := c.begin(kind)
		if err != nil {
			return err
		}
		data, err := c.download(src)
		if err != nil {
			o.fail(c.errf(kind, "%v", err))
		}
		parts := make([][]byte, c.Size())
		parts[c.rank] = data
		size := []int64{src.Bytes()}
		err = o.exchange(0, src.DType(), func(int) ([]int64, []byte) { return size, data }, func(j int, f *frame) {
			if int64(len(f.data)) != src.Bytes() {
				o.fail(c.errf(kind, "rank %d sends %d bytes, this rank %d; every rank must pass the same shape", j, len(f.data), src.Bytes()))
				return
			}
			parts[j] = f.data
		})
		if err != nil {
			return err
		}
		if o.err != nil {
			return o.err
		}
		return c.uploadParts(dst, parts)
	})
}

// ReduceScatter implements comm.Communicator.
func (c *Comm) ReduceScatter(dst, src T, op comm.ReduceOp) error {
	const kind = comm.KindReduceScatter
	verr := checkFloat(c, kind, src)
	switch {
	case verr != nil:
	case dst.IsNil() || dst.DType() != src.DType():
		verr = c.errf(kind, "dst %v must be a tensor of src's dtype %s", dst, src.DType())
	case int64(src.Numel()) != int64(dst.Numel())*int64(c.Size()):
		verr = c.errf(kind, "src %v must hold %d x %d elements (group size x dst)", src, c.Size(), dst.Numel())
	}
	if verr != nil {
		return c.abandon(kind, 1, verr)
	}
	return c.run(kind, src.Bytes(), func() error {
		o, err := c.begin(kind)
		if err != nil {
			return err
		}
		dt, k, es := src.DType(), dst.Numel(), src.DType().Size()
		data, err := c.download(src)
		if err != nil {
			o.fail(c.errf(kind, "%v", err))
		}
		slice := func(j int) []byte { return data[j*k*es : (j+1)*k*es] }
		parts := make([][]byte, c.Size())
		if data != nil {
			parts[c.rank] = slice(c.rank)
		}
		total := []int64{src.Bytes()}
		err = o.exchange(0, dt, func(j int) ([]int64, []byte) { return total, slice(j) }, func(j int, f *frame) {
			if len(f.meta) != 1 || f.meta[0] != src.Bytes() || len(f.data) != k*es {
				o.fail(c.errf(kind, "rank %d has %d bytes, this rank %d; every rank must pass the same shape", j, metaAt(f, 0), src.Bytes()))
				return
			}
			parts[j] = f.data
		})
		if err != nil {
			return err
		}
		if o.err != nil {
			return o.err
		}
		res, err := reduce(parts, dt, op)
		if err != nil {
			return c.errf(kind, "%v", err)
		}
		return c.b.Upload(dst, res)
	})
}

// AllToAll implements comm.Communicator.
func (c *Comm) AllToAll(dst, src T, send, recv []int, phase comm.Phase) error {
	kind := comm.KindAllToAllDispatch
	if phase == comm.Combine {
		kind = comm.KindAllToAllCombine
	}
	n := c.Size()
	verr := func() error {
		if src.IsNil() || dst.IsNil() {
			return c.errf(kind, "nil tensor")
		}
		if dst.DType() != src.DType() {
			return c.errf(kind, "dst %v and src %v differ in dtype", dst, src)
		}
		if len(send) != n || len(recv) != n {
			return c.errf(kind, "%d send and %d recv counts for a group of %d", len(send), len(recv), n)
		}
		return nil
	}()
	if verr != nil {
		return c.abandon(kind, 1, verr)
	}
	srw, drw, err := comm.AllToAllRows(dst, src, send, recv)
	if err != nil {
		return c.abandon(kind, 1, c.errf(kind, "%v", err))
	}
	return c.run(kind, src.Bytes(), func() error {
		o, err := c.begin(kind)
		if err != nil {
			return err
		}
		data, err := c.download(src)
		if err != nil {
			o.fail(c.errf(kind, "%v", err))
		}
		offs := make([]int64, n+1)
		for j, x := range send {
			offs[j+1] = offs[j] + int64(x)
		}
		rows := func(j int) []byte { return data[offs[j]*srw : offs[j+1]*srw] }
		parts := make([][]byte, n)
		if data != nil {
			if send[c.rank] != recv[c.rank] {
				o.fail(c.errf(kind, "rank %d sends %d rows to this rank, which expects %d", c.rank, send[c.rank], recv[c.rank]))
			} else {
				parts[c.rank] = rows(c.rank)
			}
		}
		err = o.exchange(0, src.DType(), func(j int) ([]int64, []byte) { return []int64{srw, int64(send[j])}, rows(j) }, func(j int, f *frame) {
			if len(f.meta) != 2 || f.meta[1] != int64(recv[j]) {
				o.fail(c.errf(kind, "rank %d sends %d rows to this rank, which expects %d", j, metaAt(f, 1), recv[j]))
				return
			}
			if recv[j] > 0 && f.meta[0] != drw {
				o.fail(c.errf(kind, "rank %d sends rows of %d bytes, this rank receives rows of %d", j, f.meta[0], drw))
				return
			}
			if int64(len(f.data)) != int64(recv[j])*drw {
				o.fail(c.errf(kind, "rank %d sent %d bytes for %d rows of %d bytes", j, len(f.data), recv[j], drw))
				return
			}
			parts[j] = f.data
		})
		if err != nil {
			return err
		}
		if o.err != nil {
			return o.err
		}
		return c.uploadParts(dst, parts)
	})
}

// Broadcast implements comm.Communicator. Every rank first tells every other its root and size
// (so a disagreement is an error on every rank), then the root sends its tensor.
func (c *Comm) Broadcast(t T, root int) error {
	const kind = comm.KindBroadcast
	if t.IsNil() {
		return c.abandon(kind, 1, c.errf(kind, "nil tensor"))
	}
	if root < 0 || root >= c.Size() {
		return c.abandon(kind, 1, c.errf(kind, "root %d is outside the group of %d", root, c.Size()))
	}
	return c.run(kind, t.Bytes(), func() error {
		o, err := c.begin(kind)
		if err != nil {
			return err
		}
		var data []byte
		if c.rank == root {
			if data, err = c.download(t); err != nil {
				o.fail(c.errf(kind, "%v", err))
			}
		}
		hdr := []int64{int64(root), t.Bytes()}
		err = o.exchange(0, t.DType(), func(int) ([]int64, []byte) { return hdr, nil }, func(j int, f *frame) {
			switch {
			case len(f.meta) != 2:
				o.fail(c.errf(kind, "rank %d sent a malformed header", j))
			case f.meta[0] != int64(root):
				o.fail(c.errf(kind, "rank %d broadcasts from root %d, this rank from %d", j, f.meta[0], root))
			case f.meta[1] != t.Bytes():
				o.fail(c.errf(kind, "rank %d has %d bytes, this rank %d", j, f.meta[1], t.Bytes()))
			}
		})
		if err != nil {
			return err
		}
		// Every rank saw every header, so every rank agrees on whether the data step runs.
		if o.err != nil {
			return o.err
		}
		if c.rank == root {
			for _, j := range c.peers() {
				if err := o.send(1, j, t.DType(), nil, data); err != nil {
					return err
				}
			}
			return nil
		}
		f, err := o.recv(1, root, t.DType())
		if err != nil {
			return err
		}
		if f == nil {
			return o.err
		}
		if int64(len(f.data)) != t.Bytes() {
			return c.errf(kind, "root %d sent %d bytes, this rank has %d", root, len(f.data), t.Bytes())
		}
		return c.b.Upload(t, f.data)
	})
}

// Send implements comm.Communicator: it returns once the message is on its way, waiting only
// when MaxInFlight messages to peer have not been received yet.
func (c *Comm) Send(t T, peer int) error {
	if t.IsNil() {
		return c.errf(comm.KindP2P, "send: nil tensor")
	}
	if peer < 0 || peer >= c.Size() || peer == c.rank {
		return c.errf(comm.KindP2P, "send to rank %d: the peer must be another rank of the group of %d", peer, c.Size())
	}
	return c.run(comm.KindP2P, t.Bytes(), func() error {
		const kind = comm.KindP2P
		if err := c.w.abortCause(); err != nil {
			return c.errf(kind, "send to rank %d: the world was aborted: %v", peer, err)
		}
		data, err := c.download(t)
		if err != nil {
			return c.errf(kind, "send: %v", err)
		}
		deadline := time.Now().Add(c.w.timeout)
		credits := c.w.creditsOf(c.g.id, uint32(c.rank), uint32(peer))
		timer := time.NewTimer(c.w.timeout)
		defer timer.Stop()
		var gone chan struct{}
		if node := c.w.nodeOf(c.g.members[peer]); node != c.w.node {
			gone = c.w.peers[node].gone
		}
		select {
		case credits <- struct{}{}:
		case <-c.w.aborted:
			return c.errf(kind, "send to %s: the world was aborted: %v", c.peerName(peer), c.w.abortCause())
		case <-gone:
			return c.errf(kind, "send to %s: %v", c.peerName(peer), c.w.peers[c.w.nodeOf(c.g.members[peer])].goneErr)
		case <-timer.C:
			return c.w.fatal(c.errf(kind, "send to %s: timed out after %v with %d messages not yet received; that rank is stuck or not calling Recv", c.peerName(peer), c.w.timeout, MaxInFlight))
		}
		f := &frame{typ: frameData, kind: kindCode(kind), dtype: t.DType(), group: c.g.id, from: uint32(c.rank),
			to: uint32(peer), seq: c.sendSeq[peer], check: c.g.check, data: data}
		c.sendSeq[peer]++
		return c.sendFrame(f, peer, kind, deadline)
	})
}

// Recv implements comm.Communicator.
func (c *Comm) Recv(t T, peer int) error {
	if t.IsNil() {
		return c.errf(comm.KindP2P, "recv: nil tensor")
	}
	if peer < 0 || peer >= c.Size() || peer == c.rank {
		return c.errf(comm.KindP2P, "recv from rank %d: the peer must be another rank of the group of %d", peer, c.Size())
	}
	return c.run(comm.KindP2P, 0, func() error {
		const kind = comm.KindP2P
		if err := c.w.abortCause(); err != nil {
			return c.errf(kind, "recv from rank %d: the world was aborted: %v", peer, err)
		}
		deadline := time.Now().Add(c.w.timeout)
		f, err := c.take(boxKey{group: c.g.id, from: uint32(peer), to: uint32(c.rank), lane: laneP2P}, peer, kind, deadline)
		if err != nil {
			return err
		}
		if f.check != c.g.check || f.seq != c.recvSeq[peer] {
			return c.w.fatal(c.errf(kind, "bad message from %s: sequence number %d in group hash %x, want %d in %x", c.peerName(peer), f.seq, f.check, c.recvSeq[peer], c.g.check))
		}
		c.recvSeq[peer]++
		credit := &frame{typ: frameCredit, group: c.g.id, from: uint32(c.rank), to: uint32(peer)}
		if err := c.sendFrame(credit, peer, kind, deadline); err != nil {
			return err
		}
		if int64(len(f.data)) != t.Bytes() {
			return c.errf(kind, "recv from rank %d: message has %d bytes, tensor %v has %d", peer, len(f.data), t, t.Bytes())
		}
		return c.b.Upload(t, f.data)
	})
}

// Barrier implements comm.Communicator.
func (c *Comm) Barrier() error {
	const kind = comm.KindBarrier
	return c.run(kind, 0, func() error {
		o, err := c.begin(kind)
		if err != nil {
			return err
		}
		if err := o.exchange(0, tensor.Invalid, func(int) ([]int64, []byte) { return nil, nil }, nil); err != nil {
			return err
		}
		return o.err
	})
}

// uploadParts writes the ranks' parts, in rank order, into dst (nothing for an empty dst).
func (c *Comm) uploadParts(dst T, parts [][]byte) error {
	res := make([]byte, 0, dst.Bytes())
	for _, p := range parts {
		res = append(res, p...)
	}
	if len(res) == 0 {
		return nil
	}
	return c.b.Upload(dst, res)
}
