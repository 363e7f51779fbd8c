package nccl

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cuda"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/profile"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// T is a tensor on the rank's GPU.
type T = tensor.Tensor

// streamOnThread is the stream every collective is enqueued on: the device's compute stream,
// so a collective runs after the kernels that produced its input and before those that read
// its output, in the order the rank's goroutine issued them, with no host synchronisation in
// between. It must be called on the device goroutine (inside Device().Do), as every NCCL call
// of this package is.
func (c *Comm) streamOnThread() uintptr { return c.b.Device().StreamOnThread() }

// Available reports whether NCCL and a GPU can be used; the error says what is missing.
func Available() error {
	if _, err := load(); err != nil {
		return err
	}
	if err := cuda.Available(); err != nil {
		return fmt.Errorf("nccl: the library loads but no GPU can be used: %w", err)
	}
	return nil
}

// prepare loads NCCL and sets the environment NCCL reads at its first communicator.
func prepare() (*api, error) {
	a, err := load()
	if err != nil {
		return nil, err
	}
	if _, err := nvlsDefault(os.LookupEnv, os.Setenv); err != nil {
		return nil, err
	}
	return a, nil
}

// NewUniqueID makes the id of a new communicator (ncclGetUniqueId). Make it on one process
// (node 0) and give it to every rank.
func NewUniqueID() (UniqueID, error) {
	var id UniqueID
	a, err := prepare()
	if err != nil {
		return id, err
	}
	return id, a.check("ncclGetUniqueId", a.ncclGetUniqueId(&id), 0)
}

// Comm is one rank's NCCL communicator. It implements comm.Communicator; its methods are called
// from the goroutine that owns the rank (every NCCL call itself runs on the device goroutine).
type Comm struct {
	api   *api
	h     uintptr // ncclComm_t
	b     *cuda.Backend
	rank  int
	size  int
	group string

	// Timing events and a scratch buffer for Barrier, made on first use.
	ev0, ev1 *cuda.Event
	scratch  T

	mu     sync.Mutex
	stats  comm.Stats
	rec    comm.Recorder
	closed bool
}

var _ comm.Communicator = (*Comm)(nil)

func (c *Comm) Rank() int                { return c.rank }
func (c *Comm) Size() int                { return c.size }
func (c *Comm) Group() string            { return c.group }
func (c *Comm) Backend() backend.Backend { return c.b }

// SetRecorder implements comm.Communicator.
func (c *Comm) SetRecorder(r comm.Recorder) {
	c.mu.Lock()
	c.rec = r
	c.mu.Unlock()
}

// Stats implements comm.Communicator: calls, bytes and GPU time per kind.
func (c *Comm) Stats() comm.Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := make(comm.Stats, len(c.stats))
	for k, v := range c.stats {
		s[k] = v
	}
	return s
}

func (c *Comm) errf(kind, format string, args ...any) error {
	return fmt.Errorf("nccl: group %s rank %d: %s: %s", c.group, c.rank, kind, fmt.Sprintf(format, args...))
}

// initRank makes rank's communicator of a world of n ranks on b's device goroutine. It blocks
// until every rank has called it.
func initRank(a *api, b *cuda.Backend, id UniqueID, n, rank int, group string) (*Comm, error) {
	c := &Comm{api: a, b: b, rank: rank, size: n, group: group, stats: comm.Stats{}}
	err := b.Device().Do(func() error {
		if a.ncclCommInitRankScalable != nil {
			ids := id
			return a.check("ncclCommInitRankScalable", a.ncclCommInitRankScalable(&c.h, int32(n), int32(rank), 1, &ids, nil), 0)
		}
		return a.check("ncclCommInitRank", a.ncclCommInitRank(&c.h, int32(n), id, int32(rank)), 0)
	})
	if err == nil {
		if err = c.checkShape(n, rank); err != nil {
			c.Abort()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("nccl: %s rank %d of %d on %s: %w", group, rank, n, b.Name(), err)
	}
	return c, nil
}

// checkShape asks NCCL for the communicator's size and this rank and checks they are what was
// asked for (a mismatch means the ranks were given different ids or sizes).
func (c *Comm) checkShape(n, rank int) error {
	var gotN, gotR int32
	return c.b.Device().Do(func() error {
		if err := c.api.check("ncclCommCount", c.api.ncclCommCount(c.h, &gotN), c.h); err != nil {
			return err
		}
		if err := c.api.check("ncclCommUserRank", c.api.ncclCommUserRank(c.h, &gotR), c.h); err != nil {
			return err
		}
		if int(gotN) != n || int(gotR) != rank {
			return fmt.Errorf("NCCL made rank %d of %d, asked for rank %d of %d", gotR, gotN, rank, n)
		}
		return nil
	})
}

// ptr is the device address of t after checking it lives on the rank's GPU.
func (c *Comm) ptr(kind, arg string, t T) (uintptr, error) {
	if t.IsNil() {
		return 0, c.errf(kind, "%s is a nil tensor", arg)
	}
	buf, ok := t.Buffer().(*cuda.Buffer)
	if !ok || buf.Device() != c.b.Name() {
		return 0, c.errf(kind, "%s %v is not on %s; NCCL moves tensors of the rank's own GPU", arg, t, c.b.Name())
	}
	if buf.Ptr() == 0 {
		return 0, c.errf(kind, "%s %v was freed", arg, t)
	}
	return buf.Ptr() + uintptr(t.Offset()), nil
}

// out is ptr for a tensor the collective writes: the backend forgets what it knew about the
// tensor's contents (host copies of uploaded index tensors), since NCCL writes it behind the
// backend's back.
func (c *Comm) out(kind, arg string, t T) (uintptr, error) {
	p, err := c.ptr(kind, arg, t)
	if err == nil {
		c.b.NoteDeviceWrite(t)
	}
	return p, err
}

// run enqueues fn (NCCL calls, on the device goroutine) between two events, waits for the second
// and records the GPU time under kind. An engine/profile recorder gets a span of that GPU time;
// another recorder times the whole call itself.
func (c *Comm) run(kind string, bytes int64, fn func() error) error {
	c.mu.Lock()
	rec, closed := c.rec, c.closed
	c.mu.Unlock()
	if closed {
		return c.errf(kind, "the communicator was destroyed")
	}
	start := time.Now()
	var dur time.Duration
	timed := func() error {
		var err error
		dur, err = c.timed(kind, fn)
		return err
	}
	var err error
	switch r := rec.(type) {
	case nil:
		err = timed()
	case *profile.Recorder:
		if err = timed(); err == nil && r.Enabled() {
			r.Record(profile.Span{Name: kind, Class: kind, Comm: true, Dur: dur, Bytes: bytes, Group: c.group}, start)
		}
	default:
		err = r.Collective(kind, c.group, bytes, timed)
	}
	if err != nil {
		return err
	}
	c.mu.Lock()
	s := c.stats[kind]
	s.Calls++
	s.Bytes += bytes
	s.Time += dur
	c.stats[kind] = s
	c.mu.Unlock()
	return nil
}

// timed runs fn on the device goroutine between the two timing events and returns the GPU time
// between them once the second has completed.
func (c *Comm) timed(kind string, fn func() error) (time.Duration, error) {
	d := c.b.Device()
	if c.ev0 == nil {
		var err error
		if c.ev0, err = d.NewEvent(); err != nil {
			return 0, c.errf(kind, "%v", err)
		}
		if c.ev1, err = d.NewEvent(); err != nil {
			return 0, c.errf(kind, "%v", err)
		}
	}
	if err := c.ev0.Record(); err != nil {
		return 0, c.errf(kind, "%v", err)
	}
	if err := d.Do(fn); err != nil {
		return 0, c.errf(kind, "%v", err)
	}
	if err := c.ev1.Record(); err != nil {
		return 0, c.errf(kind, "%v", err)
	}
	ms, err := c.ev0.ElapsedMs(c.ev1)
	if err != nil {
		return 0, c.errf(kind, "%v (waiting for the collective; see AsyncError)", err)
	}
	if err := c.AsyncError(); err != nil {
		return 0, c.errf(kind, "%v", err)
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// AsyncError reports an error NCCL raised asynchronously (ncclCommGetAsyncError), e.g. a peer
// that failed; nil when there is none.
func (c *Comm) AsyncError() error {
	var r int32
	err := c.b.Device().Do(func() error {
		return c.api.check("ncclCommGetAsyncError", c.api.ncclCommGetAsyncError(c.h, &r), c.h)
	})
	if err != nil {
		return err
	}
	if r != ncclSuccess && r != ncclInProgress {
		return c.api.check("asynchronous error", r, c.h)
	}
	return nil
}

// AllReduce implements comm.Communicator (in place).
func (c *Comm) AllReduce(t T, op comm.ReduceOp) error {
	const kind = comm.KindAllReduce
	dt, err := reduceType(t.DType())
	if err != nil {
		return c.errf(kind, "%v: %v", t, err)
	}
	p, err := c.out(kind, "t", t)
	if err != nil {
		return err
	}
	nop, err := redOp(op)
	if err != nil {
		return c.errf(kind, "%v", err)
	}
	return c.run(kind, t.Bytes(), func() error {
		return c.api.check("ncclAllReduce", c.api.ncclAllReduce(p, p, uint64(t.Numel()), dt, nop, c.h, c.streamOnThread()), c.h)
	})
}

func redOp(op comm.ReduceOp) (int32, error) {
	switch op {
	case comm.Sum:
		return ncclSum, nil
	case comm.Avg:
		return ncclAvg, nil
	}
	return 0, fmt.Errorf("reduction %v is not supported", op)
}

// AllGather implements comm.Communicator; any dtype (moved as bytes).
func (c *Comm) AllGather(dst, src T) error {
	const kind = comm.KindAllGather
	ps, err := c.ptr(kind, "src", src)
	if err != nil {
		return err
	}
	pd, err := c.out(kind, "dst", dst)
	if err != nil {
		return err
	}
	if dst.DType() != src.DType() {
		return c.errf(kind, "dst %v and src %v differ in dtype", dst, src)
	}
	if dst.Bytes() != src.Bytes()*int64(c.size) {
		return c.errf(kind, "dst %v must hold %d x %d elements (group size x src)", dst, c.size, src.Numel())
	}
	return c.run(kind, src.Bytes(), func() error {
		return c.api.check("ncclAllGather", c.api.ncclAllGather(ps, pd, uint64(src.Bytes()), ncclUint8, c.h, c.streamOnThread()), c.h)
	})
}

// ReduceScatter implements comm.Communicator.
func (c *Comm) ReduceScatter(dst, src T, op comm.ReduceOp) error {
	const kind = comm.KindReduceScatter
	dt, err := reduceType(src.DType())
	if err != nil {
		return c.errf(kind, "%v: %v", src, err)
	}
	ps, err := c.ptr(kind, "src", src)
	if err != nil {
		return err
	}
	pd, err := c.out(kind, "dst", dst)
	if err != nil {
		return err
	}
	if dst.DType() != src.DType() {
		return c.errf(kind, "dst %v and src %v differ in dtype", dst, src)
	}
	if src.Numel()%c.size != 0 || dst.Numel() != src.Numel()/c.size {
		return c.errf(kind, "src %v must split into %d parts of dst's %d elements", src, c.size, dst.Numel())
	}
	nop, err := redOp(op)
	if err != nil {
		return c.errf(kind, "%v", err)
	}
	return c.run(kind, src.Bytes(), func() error {
		return c.api.check("ncclReduceScatter", c.api.ncclReduceScatter(ps, pd, uint64(dst.Numel()), dt, nop, c.h, c.streamOnThread()), c.h)
	})
}

// AllToAll implements comm.Communicator: one ncclSend and one ncclRecv per peer with a non-empty
// part, inside one group call, so uneven splits and empty parts cost nothing extra.
func (c *Comm) AllToAll(dst, src T, send, recv []int, phase comm.Phase) error {
	kind := comm.KindAllToAllDispatch
	if phase == comm.Combine {
		kind = comm.KindAllToAllCombine
	}
	ps, err := c.ptr(kind, "src", src)
	if err != nil {
		return err
	}
	pd, err := c.out(kind, "dst", dst)
	if err != nil {
		return err
	}
	srcRow, err := rowBytes(src)
	if err != nil {
		return c.errf(kind, "src: %v", err)
	}
	dstRow, err := rowBytes(dst)
	if err != nil {
		return c.errf(kind, "dst: %v", err)
	}
	if dst.DType() != src.DType() || srcRow != dstRow {
		return c.errf(kind, "src %v and dst %v differ in dtype or row width", src, dst)
	}
	if len(send) != c.size || len(recv) != c.size {
		return c.errf(kind, "send has %d counts and recv %d; want one per rank (%d)", len(send), len(recv), c.size)
	}
	sum := func(v []int, what string) (int, error) {
		s := 0
		for i, x := range v {
			if x < 0 {
				return 0, fmt.Errorf("%s[%d] = %d is negative", what, i, x)
			}
			s += x
		}
		return s, nil
	}
	ns, err := sum(send, "send")
	if err != nil {
		return c.errf(kind, "%v", err)
	}
	nr, err := sum(recv, "recv")
	if err != nil {
		return c.errf(kind, "%v", err)
	}
	if ns != rows(src) || nr != rows(dst) {
		return c.errf(kind, "send counts add up to %d rows and recv to %d; src has %d rows and dst %d", ns, nr, rows(src), rows(dst))
	}
	plan := allToAllPlan(send, recv, srcRow, dstRow)
	return c.run(kind, int64(ns)*srcRow, func() error {
		if err := c.api.check("ncclGroupStart", c.api.ncclGroupStart(), c.h); err != nil {
			return err
		}
		var errs []error
		for _, op := range plan {
			if op.send {
				errs = append(errs, c.api.check("ncclSend", c.api.ncclSend(ps+uintptr(op.offset), uint64(op.bytes), ncclUint8, int32(op.peer), c.h, c.streamOnThread()), c.h))
			} else {
				errs = append(errs, c.api.check("ncclRecv", c.api.ncclRecv(pd+uintptr(op.offset), uint64(op.bytes), ncclUint8, int32(op.peer), c.h, c.streamOnThread()), c.h))
			}
		}
		errs = append(errs, c.api.check("ncclGroupEnd", c.api.ncclGroupEnd(), c.h))
		return errors.Join(errs...)
	})
}

// p2pOp is one ncclSend or ncclRecv of an all-to-all: bytes at offset of the source (send) or
// destination (receive) buffer, to or from peer.
type p2pOp struct {
	send   bool
	peer   int
	offset int64
	bytes  int64
}

// allToAllPlan lists the sends and receives of an all-to-all in peer order: the part for peer j
// starts after the rows of the peers before it; empty parts are left out.
func allToAllPlan(send, recv []int, srcRow, dstRow int64) []p2pOp {
	var plan []p2pOp
	so, ro := int64(0), int64(0)
	for j := range send {
		if n := int64(send[j]) * srcRow; n > 0 {
			plan = append(plan, p2pOp{send: true, peer: j, offset: so, bytes: n})
			so += n
		}
		if n := int64(recv[j]) * dstRow; n > 0 {
			plan = append(plan, p2pOp{send: false, peer: j, offset: ro, bytes: n})
			ro += n
		}
	}
	return plan
}

func rows(t T) int {
	if len(t.Shape()) == 0 {
		return 1
	}
	return t.Shape()[0]
}

// rowBytes is the size of one row (the outermost dimension) of t, also when t has no rows.
func rowBytes(t T) (int64, error) {
	sh := t.Shape()
	n := int64(t.DType().Size())
	if len(sh) > 1 {
		for _, d := range sh[1:] {
			n *= int64(d)
		}
	}
	if n == 0 {
		return 0, fmt.Errorf("%v has rows of zero bytes", t)
	}
	return n, nil
}

// Broadcast implements comm.Communicator.
func (c *Comm) Broadcast(t T, root int) error {
	const kind = comm.KindBroadcast
	if root < 0 || root >= c.size {
		return c.errf(kind, "root %d is outside 0..%d", root, c.size-1)
	}
	p, err := c.out(kind, "t", t)
	if err != nil {
		return err
	}
	return c.run(kind, t.Bytes(), func() error {
		return c.api.check("ncclBroadcast", c.api.ncclBroadcast(p, p, uint64(t.Bytes()), ncclUint8, int32(root), c.h, c.streamOnThread()), c.h)
	})
}

// Send implements comm.Communicator. Unlike the in-process communicator it completes only once
// peer has posted the matching Recv (see the package doc).
func (c *Comm) Send(t T, peer int) error {
	return c.p2p("ncclSend", t, peer, false, func(p uintptr) int32 {
		return c.api.ncclSend(p, uint64(t.Bytes()), ncclUint8, int32(peer), c.h, c.streamOnThread())
	})
}

// Recv implements comm.Communicator.
func (c *Comm) Recv(t T, peer int) error {
	return c.p2p("ncclRecv", t, peer, true, func(p uintptr) int32 {
		return c.api.ncclRecv(p, uint64(t.Bytes()), ncclUint8, int32(peer), c.h, c.streamOnThread())
	})
}

func (c *Comm) p2p(call string, t T, peer int, writes bool, fn func(uintptr) int32) error {
	const kind = comm.KindP2P
	if peer < 0 || peer >= c.size || peer == c.rank {
		return c.errf(kind, "peer %d: want another rank of 0..%d", peer, c.size-1)
	}
	ptr := c.ptr
	if writes {
		ptr = c.out
	}
	p, err := ptr(kind, "t", t)
	if err != nil {
		return err
	}
	return c.run(kind, t.Bytes(), func() error {
		if err := c.api.check("ncclGroupStart", c.api.ncclGroupStart(), c.h); err != nil {
			return err
		}
		err := c.api.check(call, fn(p), c.h)
		return errors.Join(err, c.api.check("ncclGroupEnd", c.api.ncclGroupEnd(), c.h))
	})
}

// Barrier implements comm.Communicator: an all-reduce of one float that every rank waits for.
func (c *Comm) Barrier() error {
	const kind = comm.KindBarrier
	if c.scratch.IsNil() {
		s, err := c.b.Alloc(tensor.F32, 1)
		if err != nil {
			return c.errf(kind, "%v", err)
		}
		c.scratch = s
	}
	p, err := c.ptr(kind, "scratch", c.scratch)
	if err != nil {
		return err
	}
	return c.run(kind, 0, func() error {
		return c.api.check("ncclAllReduce", c.api.ncclAllReduce(p, p, 1, ncclFloat32, ncclSum, c.h, c.streamOnThread()), c.h)
	})
}

// Destroy waits for the communicator's work and frees it (ncclCommDestroy). Every rank of the
// group should destroy its communicator.
func (c *Comm) Destroy() error { return c.release("ncclCommDestroy", c.api.ncclCommDestroy) }

// Abort frees the communicator without waiting (ncclCommAbort): use it when a rank failed and
// the others must not wait for it.
func (c *Comm) Abort() error { return c.release("ncclCommAbort", c.api.ncclCommAbort) }

func (c *Comm) release(call string, fn func(uintptr) int32) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	var errs []error
	errs = append(errs, c.b.Device().Do(func() error { return c.api.check(call, fn(c.h), 0) }))
	for _, e := range []*cuda.Event{c.ev0, c.ev1} {
		if e != nil {
			errs = append(errs, e.Destroy())
		}
	}
	if !c.scratch.IsNil() {
		errs = append(errs, c.b.Free(c.scratch))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("nccl: group %s rank %d: %w", c.group, c.rank, err)
	}
	return nil
}
