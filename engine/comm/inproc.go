package comm

import (
	"errors"
	"fmt"
	"reflect"
	"sync"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// maxInFlight bounds the point-to-point messages queued from one rank to another.
const maxInFlight = 64

// World is a set of in-process ranks, one backend each. Its communicators (the world group
// and any sub-groups made by Split) meet through shared host buffers.
type World struct {
	backends []backend.Backend
	world    []*Comm
	abort    *abortState
}

// abortState is shared by every group of a world: once set, every collective in flight or
// started later returns the abort error instead of waiting for ranks that will never come.
type abortState struct {
	mu     sync.Mutex
	err    error
	done   chan struct{}
	groups []*group
}

// Abort makes every pending and future collective of every group of the world fail with err
// (wrapped). Call it when a rank fails between collectives, so that the others do not wait for
// it forever. The world cannot be used for collectives afterwards.
func (w *World) Abort(err error) {
	if err == nil {
		err = errors.New("aborted")
	}
	a := w.abort
	a.mu.Lock()
	if a.err != nil {
		a.mu.Unlock()
		return
	}
	a.err = err
	close(a.done)
	groups := a.groups
	a.mu.Unlock()
	for _, g := range groups {
		g.mu.Lock()
		g.cond.Broadcast()
		g.mu.Unlock()
	}
}

func (a *abortState) get() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}

// NewWorld makes a world of len(backends) ranks; rank i drives backends[i]. Each rank's
// goroutine calls its own backend, so the backends must be distinct values (one CPU backend per
// simulated device).
func NewWorld(backends []backend.Backend) (*World, error) {
	if len(backends) == 0 {
		return nil, errors.New("comm: NewWorld needs at least one backend")
	}
	seen := map[backend.Backend]int{}
	for i, b := range backends {
		if b == nil {
			return nil, fmt.Errorf("comm: NewWorld: backend of rank %d is nil", i)
		}
		if !reflect.TypeOf(b).Comparable() {
			continue
		}
		if j, dup := seen[b]; dup {
			return nil, fmt.Errorf("comm: NewWorld: ranks %d and %d share one backend; give each rank its own device", j, i)
		}
		seen[b] = i
	}
	w := &World{backends: backends, abort: &abortState{done: make(chan struct{})}}
	all := make([]int, len(backends))
	for i := range all {
		all[i] = i
	}
	w.world = w.newGroup("world", all)
	return w, nil
}

// Size is the number of ranks.
func (w *World) Size() int { return len(w.backends) }

// Comm returns world rank r's communicator over every rank.
func (w *World) Comm(r int) *Comm { return w.world[r] }

// Split makes sub-groups: groups is a partition of the world ranks (every rank in exactly one
// group); the result is indexed by world rank and holds that rank's communicator in its group,
// whose rank order is the order of the group's list. Group i is named name+i.
func (w *World) Split(name string, groups [][]int) ([]*Comm, error) {
	seen := make([]bool, len(w.backends))
	for gi, g := range groups {
		if len(g) == 0 {
			return nil, fmt.Errorf("comm: Split %q: group %d is empty", name, gi)
		}
		for _, r := range g {
			if r < 0 || r >= len(seen) {
				return nil, fmt.Errorf("comm: Split %q: group %d names rank %d; the world has ranks 0..%d", name, gi, r, len(seen)-1)
			}
			if seen[r] {
				return nil, fmt.Errorf("comm: Split %q: rank %d is in more than one group", name, r)
			}
			seen[r] = true
		}
	}
	for r, ok := range seen {
		if !ok {
			return nil, fmt.Errorf("comm: Split %q: rank %d is in no group; every rank must be in exactly one", name, r)
		}
	}
	out := make([]*Comm, len(w.backends))
	for gi, g := range groups {
		cs := w.newGroup(fmt.Sprintf("%s%d", name, gi), g)
		for i, r := range g {
			out[r] = cs[i]
		}
	}
	return out, nil
}

func (w *World) newGroup(name string, ranks []int) []*Comm {
	g := &group{name: name, n: len(ranks), slots: make([]contrib, len(ranks)), abort: w.abort}
	g.cond = sync.NewCond(&g.mu)
	w.abort.mu.Lock()
	w.abort.groups = append(w.abort.groups, g)
	w.abort.mu.Unlock()
	g.p2p = make([][]chan []byte, len(ranks))
	for i := range g.p2p {
		g.p2p[i] = make([]chan []byte, len(ranks))
		for j := range g.p2p[i] {
			g.p2p[i][j] = make(chan []byte, maxInFlight)
		}
	}
	cs := make([]*Comm, len(ranks))
	for i, r := range ranks {
		cs[i] = &Comm{g: g, rank: i, b: w.backends[r]}
	}
	return cs
}

// group is the state shared by the ranks of one in-process group.
type group struct {
	name    string
	n       int
	mu      sync.Mutex
	cond    *sync.Cond
	gen     uint64
	arrived int
	slots   []contrib
	p2p     [][]chan []byte // p2p[from][to]
	abort   *abortState
}

// contrib is what one rank brings to a rendezvous.
type contrib struct {
	kind  string
	dtype tensor.DType
	data  []byte
	meta  []int // collective-specific: all-to-all send counts and row bytes, broadcast root
}

// barrier blocks until all n ranks have arrived (a reusable generation barrier), or fails once
// the world is aborted.
func (g *group) barrier() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.abort.get(); err != nil {
		return fmt.Errorf("comm: group %s: aborted: %w", g.name, err)
	}
	gen := g.gen
	g.arrived++
	if g.arrived == g.n {
		g.arrived = 0
		g.gen++
		g.cond.Broadcast()
		return nil
	}
	for gen == g.gen {
		if err := g.abort.get(); err != nil {
			return fmt.Errorf("comm: group %s: aborted: %w", g.name, err)
		}
		g.cond.Wait()
	}
	return nil
}

// exchange deposits c, waits for every rank and calls read with every contribution; after read
// returns on every rank the slots are free again. An error from read is returned to the caller
// only (each rank decides for itself); a mismatch of kinds or dtypes is an error on every rank.
func (g *group) exchange(rank int, c contrib, read func([]contrib) error) error {
	g.mu.Lock()
	g.slots[rank] = c
	g.mu.Unlock()
	if err := g.barrier(); err != nil {
		return err
	}
	var err error
	for i, o := range g.slots {
		if o.kind != c.kind {
			err = fmt.Errorf("comm: group %s: rank %d called %s while rank %d called %s; every rank must run the same collectives in the same order", g.name, rank, c.kind, i, o.kind)
			break
		}
		if o.dtype != c.dtype {
			err = fmt.Errorf("comm: group %s: %s: rank %d has dtype %s, rank %d %s", g.name, c.kind, rank, c.dtype, i, o.dtype)
			break
		}
	}
	if err == nil {
		err = read(g.slots)
	}
	if berr := g.barrier(); berr != nil {
		return berr
	}
	return err
}

// Comm is one rank's in-process communicator.
type Comm struct {
	Accounting
	g    *group
	rank int
	b    backend.Backend
}

var _ Communicator = (*Comm)(nil)

func (c *Comm) Rank() int                { return c.rank }
func (c *Comm) Size() int                { return c.g.n }
func (c *Comm) Group() string            { return c.g.name }
func (c *Comm) Backend() backend.Backend { return c.b }

func (c *Comm) run(kind string, bytes int64, fn func() error) error {
	return c.Run(kind, c.g.name, bytes, fn)
}

func (c *Comm) download(t T) ([]byte, error) {
	buf := make([]byte, t.Bytes())
	if err := c.b.Download(buf, t); err != nil {
		return nil, err
	}
	return buf, nil
}

func (c *Comm) errf(kind, format string, args ...any) error {
	return fmt.Errorf("comm: group %s rank %d: %s: %s", c.g.name, c.rank, kind, fmt.Sprintf(format, args...))
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

// reduce adds part [lo, hi) (elements) of every contribution in rank order, in float64, and
// returns it rounded to dt as raw bytes.
func reduce(cs []contrib, dt tensor.DType, lo, hi int, op ReduceOp) ([]byte, error) {
	es := dt.Size()
	acc := make([]float64, hi-lo)
	for _, o := range cs {
		v, err := tensor.DecodeFloat32(dt, o.data[lo*es:hi*es])
		if err != nil {
			return nil, err
		}
		for i, x := range v {
			acc[i] += float64(x)
		}
	}
	out := make([]float32, len(acc))
	for i, a := range acc {
		if op == Avg {
			a /= float64(len(cs))
		}
		out[i] = float32(a)
	}
	return tensor.EncodeFloat32(dt, out)
}

// AllReduce implements Communicator. It runs as a reduce-scatter followed by an all-gather
// over the shared buffers: rank r adds up part r of every contribution (in rank order, in
// float64), then every rank copies every reduced part, so each element is reduced once and the
// result is the same on every rank.
func (c *Comm) AllReduce(t T, op ReduceOp) error {
	const kind = KindAllReduce
	if err := checkFloat(c, kind, t); err != nil {
		return err
	}
	return c.run(kind, t.Bytes(), func() error {
		data, err := c.download(t)
		if err != nil {
			return c.errf(kind, "%v", err)
		}
		n, numel, es := c.g.n, t.Numel(), t.DType().Size()
		lo, hi := c.rank*numel/n, (c.rank+1)*numel/n
		var part []byte
		err = c.g.exchange(c.rank, contrib{kind: kind, dtype: t.DType(), data: data}, func(cs []contrib) error {
			for i, o := range cs {
				if len(o.data) != len(data) {
					return c.errf(kind, "rank %d has %d bytes, this rank %d; every rank must pass the same shape", i, len(o.data), len(data))
				}
			}
			part, err = reduce(cs, t.DType(), lo, hi, op)
			return err
		})
		if err != nil {
			return err
		}
		err = c.g.exchange(c.rank, contrib{kind: kind, dtype: t.DType(), data: part}, func(cs []contrib) error {
			for i, o := range cs {
				copy(data[i*numel/n*es:], o.data)
			}
			return nil
		})
		if err != nil {
			return err
		}
		return c.b.Upload(t, data)
	})
}

// AllGather implements Communicator.
func (c *Comm) AllGather(dst, src T) error {
	const kind = KindAllGather
	if src.IsNil() || dst.IsNil() {
		return c.errf(kind, "nil tensor")
	}
	if dst.DType() != src.DType() {
		return c.errf(kind, "dst %v and src %v differ in dtype", dst, src)
	}
	if int64(dst.Numel()) != int64(src.Numel())*int64(c.g.n) {
		return c.errf(kind, "dst %v must hold %d x %d elements (group size x src)", dst, c.g.n, src.Numel())
	}
	return c.run(kind, src.Bytes(), func() error {
		data, err := c.download(src)
		if err != nil {
			return c.errf(kind, "%v", err)
		}
		res := make([]byte, 0, dst.Bytes())
		err = c.g.exchange(c.rank, contrib{kind: kind, dtype: src.DType(), data: data}, func(cs []contrib) error {
			for i, o := range cs {
				if len(o.data) != len(data) {
					return c.errf(kind, "rank %d sends %d bytes, this rank %d; every rank must pass the same shape", i, len(o.data), len(data))
				}
				res = append(res, o.data...)
			}
			return nil
		})
		if err != nil {
			return err
		}
		return c.b.Upload(dst, res)
	})
}

// ReduceScatter implements Communicator.
func (c *Comm) ReduceScatter(dst, src T, op ReduceOp) error {
	const kind = KindReduceScatter
	if err := checkFloat(c, kind, src); err != nil {
		return err
	}
	if dst.IsNil() || dst.DType() != src.DType() {
		return c.errf(kind, "dst %v must be a tensor of src's dtype %s", dst, src.DType())
	}
	if int64(src.Numel()) != int64(dst.Numel())*int64(c.g.n) {
		return c.errf(kind, "src %v must hold %d x %d elements (group size x dst)", src, c.g.n, dst.Numel())
	}
	return c.run(kind, src.Bytes(), func() error {
		data, err := c.download(src)
		if err != nil {
			return c.errf(kind, "%v", err)
		}
		var res []byte
		err = c.g.exchange(c.rank, contrib{kind: kind, dtype: src.DType(), data: data}, func(cs []contrib) error {
			for i, o := range cs {
				if len(o.data) != len(data) {
					return c.errf(kind, "rank %d has %d bytes, this rank %d; every rank must pass the same shape", i, len(o.data), len(data))
				}
			}
			k := dst.Numel()
			res, err = reduce(cs, src.DType(), c.rank*k, (c.rank+1)*k, op)
			return err
		})
		if err != nil {
			return err
		}
		return c.b.Upload(dst, res)
	})
}

// AllToAll implements Communicator.
func (c *Comm) AllToAll(dst, src T, send, recv []int, phase Phase) error {
	kind := phase.kind()
	n := c.g.n
	if src.IsNil() || dst.IsNil() {
		return c.errf(kind, "nil tensor")
	}
	if dst.DType() != src.DType() {
		return c.errf(kind, "dst %v and src %v differ in dtype", dst, src)
	}
	if len(send) != n || len(recv) != n {
		return c.errf(kind, "%d send and %d recv counts for a group of %d", len(send), len(recv), n)
	}
	srw, drw, err := AllToAllRows(dst, src, send, recv)
	if err != nil {
		return c.errf(kind, "%v", err)
	}
	return c.run(kind, src.Bytes(), func() error {
		data, err := c.download(src)
		if err != nil {
			return c.errf(kind, "%v", err)
		}
		meta := append([]int{int(srw)}, send...)
		res := make([]byte, 0, dst.Bytes())
		err = c.g.exchange(c.rank, contrib{kind: kind, dtype: src.DType(), data: data, meta: meta}, func(cs []contrib) error {
			for i, o := range cs {
				rw, counts := int64(o.meta[0]), o.meta[1:]
				if counts[c.rank] != recv[i] {
					return c.errf(kind, "rank %d sends %d rows to this rank, which expects %d", i, counts[c.rank], recv[i])
				}
				if recv[i] > 0 && rw != drw {
					return c.errf(kind, "rank %d sends rows of %d bytes, this rank receives rows of %d", i, rw, drw)
				}
				off := 0
				for j := 0; j < c.rank; j++ {
					off += counts[j]
				}
				res = append(res, o.data[int64(off)*rw:int64(off+recv[i])*rw]...)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if len(res) == 0 {
			return nil
		}
		return c.b.Upload(dst, res)
	})
}

// Broadcast implements Communicator.
func (c *Comm) Broadcast(t T, root int) error {
	const kind = KindBroadcast
	if t.IsNil() {
		return c.errf(kind, "nil tensor")
	}
	if root < 0 || root >= c.g.n {
		return c.errf(kind, "root %d is outside the group of %d", root, c.g.n)
	}
	return c.run(kind, t.Bytes(), func() error {
		var data []byte
		if c.rank == root {
			var err error
			if data, err = c.download(t); err != nil {
				return c.errf(kind, "%v", err)
			}
		}
		var res []byte
		err := c.g.exchange(c.rank, contrib{kind: kind, dtype: t.DType(), data: data, meta: []int{root, int(t.Bytes())}}, func(cs []contrib) error {
			for i, o := range cs {
				if o.meta[0] != root {
					return c.errf(kind, "rank %d broadcasts from root %d, this rank from %d", i, o.meta[0], root)
				}
				if int64(o.meta[1]) != t.Bytes() {
					return c.errf(kind, "rank %d has %d bytes, this rank %d", i, o.meta[1], t.Bytes())
				}
			}
			if c.rank != root {
				res = append([]byte(nil), cs[root].data...)
			}
			return nil
		})
		if err != nil || c.rank == root {
			return err
		}
		return c.b.Upload(t, res)
	})
}

// Send implements Communicator.
func (c *Comm) Send(t T, peer int) error {
	if t.IsNil() {
		return c.errf(KindP2P, "send: nil tensor")
	}
	if peer < 0 || peer >= c.g.n || peer == c.rank {
		return c.errf(KindP2P, "send to rank %d: the peer must be another rank of the group of %d", peer, c.g.n)
	}
	return c.run(KindP2P, t.Bytes(), func() error {
		data, err := c.download(t)
		if err != nil {
			return c.errf(KindP2P, "send: %v", err)
		}
		select {
		case c.g.p2p[c.rank][peer] <- data:
			return nil
		case <-c.g.abort.done:
			return c.errf(KindP2P, "send to rank %d: aborted: %v", peer, c.g.abort.get())
		}
	})
}

// Recv implements Communicator.
func (c *Comm) Recv(t T, peer int) error {
	if t.IsNil() {
		return c.errf(KindP2P, "recv: nil tensor")
	}
	if peer < 0 || peer >= c.g.n || peer == c.rank {
		return c.errf(KindP2P, "recv from rank %d: the peer must be another rank of the group of %d", peer, c.g.n)
	}
	return c.run(KindP2P, 0, func() error {
		var data []byte
		select {
		case data = <-c.g.p2p[peer][c.rank]:
		case <-c.g.abort.done:
			return c.errf(KindP2P, "recv from rank %d: aborted: %v", peer, c.g.abort.get())
		}
		if int64(len(data)) != t.Bytes() {
			return c.errf(KindP2P, "recv from rank %d: message has %d bytes, tensor %v has %d", peer, len(data), t, t.Bytes())
		}
		return c.b.Upload(t, data)
	})
}

// Barrier implements Communicator.
func (c *Comm) Barrier() error {
	return c.run(KindBarrier, 0, func() error {
		return c.g.exchange(c.rank, contrib{kind: KindBarrier}, func([]contrib) error { return nil })
	})
}

// rowBytes is the bytes per row of t (its first dimension) and its number of rows; a scalar is
// one row.
func rowBytes(t T) (int64, int) {
	if t.Rank() == 0 {
		return int64(t.DType().Size()), 1
	}
	rows := t.Dim(0)
	if rows == 0 {
		return 0, 0
	}
	return t.Bytes() / int64(rows), rows
}

// AllToAllRows checks an all-to-all's split counts against its tensors, as every communicator
// does before it moves anything: send counts add up to src's rows, recv counts to dst's, none is
// negative, and rows have one width. It returns the bytes per row of src and dst; the error is
// the bare reason, for the communicator to prefix.
func AllToAllRows(dst, src T, send, recv []int) (srcRow, dstRow int64, err error) {
	srw, srows := rowBytes(src)
	drw, drows := rowBytes(dst)
	sum := func(v []int, what string, rows int) error {
		t := 0
		for i, x := range v {
			if x < 0 {
				return fmt.Errorf("%s count for rank %d is negative (%d)", what, i, x)
			}
			t += x
		}
		if t != rows {
			return fmt.Errorf("%s counts %v add up to %d rows, the tensor has %d", what, v, t, rows)
		}
		return nil
	}
	if err := sum(send, "send", srows); err != nil {
		return 0, 0, err
	}
	if err := sum(recv, "recv", drows); err != nil {
		return 0, 0, err
	}
	if srows > 0 && drows > 0 && srw != drw {
		return 0, 0, fmt.Errorf("src rows are %d bytes and dst rows %d", srw, drw)
	}
	return srw, drw, nil
}
