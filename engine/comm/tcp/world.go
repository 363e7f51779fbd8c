package tcp

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/comm/rendezvous"
)

// Defaults of Config.
const (
	// DefaultTimeout bounds a collective's wait for its peers when Config.Timeout is zero.
	DefaultTimeout = 10 * time.Minute
	// DefaultMaxMessage bounds one message's payload when Config.MaxMessage is zero.
	DefaultMaxMessage = int64(64) << 30
	// MaxInFlight is how many point-to-point messages one rank may have sent to another that
	// the other has not yet received; Send waits (up to the timeout) beyond that.
	MaxInFlight = 64
)

// closeGrace bounds how long Close waits for the other processes to close too, and how long
// an abort waits to tell them.
const closeGrace = 10 * time.Second

// Config says how this process joins a multi-process world.
type Config struct {
	// Rendezvous is how the processes find each other (node rank, node count, node 0's
	// address and the shared token); its Timeout also bounds building the connections.
	Rendezvous rendezvous.Config
	// Listen is the address this process accepts the other processes' connections on. Empty
	// means ":0": every interface, a port chosen by the system, and the host the other
	// processes use is the address the rendezvous saw this process connect from.
	Listen string
	// Timeout bounds how long a collective waits for a peer (zero: DefaultTimeout). When it
	// runs out the collective fails naming the peer and the world is aborted everywhere.
	Timeout time.Duration
	// MaxMessage bounds the payload of one message a peer may send (zero: DefaultMaxMessage).
	MaxMessage int64
	// RendezvousListener, when set on node 0, serves the rendezvous on it instead of listening
	// on Rendezvous.Bind (tests pass a listener on a port the system chose).
	RendezvousListener net.Listener
}

// World is this process's share of a world of ranks spread over several processes: one
// communicator per local rank over every rank of every process, plus the sub-groups Split
// makes. Ranks are numbered process by process (rendezvous.World.FirstRank).
type World struct {
	node       int
	firstOf    []int // firstOf[p] is the first global rank of process p; firstOf[len] is the size
	backends   []backend.Backend
	peers      []*peer // by process; nil for this one
	timeout    time.Duration
	maxMessage uint64

	mu        sync.Mutex
	boxes     map[boxKey]*mailbox
	credits   map[boxKey]chan struct{}
	nextGroup uint32
	world     []*Comm
	closing   bool

	abortMu  sync.Mutex
	abortErr error
	aborted  chan struct{}
}

// boxKey names a stream of frames: group, sender and receiver ranks in the group, and lane.
type boxKey struct {
	group    uint32
	from, to uint32
	lane     byte
}

// mailbox queues the frames of one stream until the receiving rank takes them.
type mailbox struct {
	mu    sync.Mutex
	q     []*frame
	ready chan struct{}
}

func (m *mailbox) put(f *frame) {
	m.mu.Lock()
	m.q = append(m.q, f)
	m.mu.Unlock()
	select {
	case m.ready <- struct{}{}:
	default:
	}
}

func (m *mailbox) pop() *frame {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.q) == 0 {
		return nil
	}
	f := m.q[0]
	m.q[0] = nil
	m.q = m.q[1:]
	return f
}

// peer is the connection to another process.
type peer struct {
	node    int
	conn    net.Conn
	wmu     sync.Mutex
	sent    atomic.Int64  // bytes written
	gone    chan struct{} // closed when the reader has stopped
	goneErr error         // why, set before gone is closed
	sawBye  bool
}

// Join joins this process's ranks (one per backend; each backend is driven by its own
// goroutine) to the world: it listens for peer connections, runs the rendezvous (announcing
// its address and rank count), connects to every other process and returns once every
// connection is up and authenticated.
func Join(ctx context.Context, cfg Config, backends []backend.Backend) (*World, error) {
	rc := cfg.Rendezvous
	if err := rc.Validate(); err != nil {
		return nil, fmt.Errorf("tcp: %w", err)
	}
	if err := checkBackends(backends); err != nil {
		return nil, err
	}
	setup := rc.Timeout
	if setup <= 0 {
		setup = rendezvous.DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, setup+5*time.Second)
	defer cancel()

	var ln net.Listener
	announce := ""
	if rc.NNodes > 1 {
		listen := cfg.Listen
		if listen == "" {
			listen = ":0"
		}
		var lc net.ListenConfig
		var err error
		if ln, err = lc.Listen(ctx, "tcp", listen); err != nil {
			return nil, fmt.Errorf("tcp: node %d cannot listen for peer connections on %s: %v; choose another Listen address", rc.NodeRank, listen, err)
		}
		defer ln.Close()
		host, _, _ := net.SplitHostPort(listen)
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			host = ""
		}
		announce = net.JoinHostPort(host, port)
	}
	var worldID []byte
	if rc.NodeRank == 0 {
		worldID = make([]byte, 16)
		if _, err := rand.Read(worldID); err != nil {
			return nil, fmt.Errorf("tcp: making the world id: %v", err)
		}
	}
	var rw rendezvous.World
	var err error
	if rc.NodeRank == 0 && cfg.RendezvousListener != nil && rc.NNodes > 1 {
		host, _ := os.Hostname()
		rctx, rcancel := context.WithTimeout(ctx, setup)
		rw, err = rendezvous.Serve(rctx, cfg.RendezvousListener, rc, rendezvous.Node{Rank: 0, Devices: len(backends), Host: host, Addr: announce}, worldID)
		rcancel()
	} else {
		rw, err = rendezvous.JoinAt(ctx, rc, len(backends), announce, worldID)
	}
	if err != nil {
		return nil, fmt.Errorf("tcp: %w", err)
	}
	if rw.Nodes[rc.NodeRank].Devices != len(backends) {
		return nil, fmt.Errorf("tcp: the rendezvous says node %d has %d ranks, this process has %d backends", rc.NodeRank, rw.Nodes[rc.NodeRank].Devices, len(backends))
	}
	w := newWorld(cfg, rw, rc.NodeRank, backends)
	if rc.NNodes > 1 {
		if err := w.connect(ctx, ln, rw, rc.Token); err != nil {
			w.closeConns()
			return nil, err
		}
	}
	return w, nil
}

func checkBackends(backends []backend.Backend) error {
	if len(backends) == 0 {
		return errors.New("tcp: a process needs at least one backend (one per local rank)")
	}
	for i, b := range backends {
		if b == nil {
			return fmt.Errorf("tcp: backend of local rank %d is nil", i)
		}
	}
	return nil
}

func newWorld(cfg Config, rw rendezvous.World, node int, backends []backend.Backend) *World {
	w := &World{
		node:       node,
		backends:   backends,
		peers:      make([]*peer, rw.NNodes()),
		timeout:    cfg.Timeout,
		maxMessage: uint64(cfg.MaxMessage),
		boxes:      map[boxKey]*mailbox{},
		credits:    map[boxKey]chan struct{}{},
		aborted:    make(chan struct{}),
	}
	if w.timeout <= 0 {
		w.timeout = DefaultTimeout
	}
	if cfg.MaxMessage <= 0 {
		w.maxMessage = uint64(DefaultMaxMessage)
	}
	for p := range rw.NNodes() + 1 {
		w.firstOf = append(w.firstOf, rw.FirstRank(p))
	}
	all := make([]int, w.Size())
	for i := range all {
		all[i] = i
	}
	w.world = w.newGroup("world", all)[w.FirstRank() : w.FirstRank()+w.Local()]
	return w
}

// Size is the number of ranks over every process.
func (w *World) Size() int { return w.firstOf[len(w.firstOf)-1] }

// Local is the number of this process's ranks.
func (w *World) Local() int { return len(w.backends) }

// FirstRank is the global rank of local rank 0.
func (w *World) FirstRank() int { return w.firstOf[w.node] }

// Node is this process's index in the world.
func (w *World) Node() int { return w.node }

// Comm returns local rank i's communicator over the whole world (global rank FirstRank()+i).
func (w *World) Comm(i int) *Comm { return w.world[i] }

// nodeOf returns the process of global rank r.
func (w *World) nodeOf(r int) int {
	return sort.Search(len(w.firstOf)-1, func(p int) bool { return w.firstOf[p+1] > r })
}

func (w *World) nodeName(p int) string {
	if w.firstOf[p+1]-w.firstOf[p] == 1 {
		return fmt.Sprintf("node %d (global rank %d)", p, w.firstOf[p])
	}
	return fmt.Sprintf("node %d (global ranks %d..%d)", p, w.firstOf[p], w.firstOf[p+1]-1)
}

// Split makes sub-groups as comm.World.Split does: groups partitions the global ranks (every
// rank in exactly one group), group i is named name+i with the rank order of its list, and the
// result is indexed by local rank. Every process must call Split with the same arguments in the
// same order (groups are numbered by the order of the calls, and a hash of their names and
// members is checked on every message).
func (w *World) Split(name string, groups [][]int) ([]*Comm, error) {
	size := w.Size()
	seen := make([]bool, size)
	for gi, g := range groups {
		if len(g) == 0 {
			return nil, fmt.Errorf("tcp: Split %q: group %d is empty", name, gi)
		}
		for _, r := range g {
			if r < 0 || r >= size {
				return nil, fmt.Errorf("tcp: Split %q: group %d names rank %d; the world has ranks 0..%d", name, gi, r, size-1)
			}
			if seen[r] {
				return nil, fmt.Errorf("tcp: Split %q: rank %d is in more than one group", name, r)
			}
			seen[r] = true
		}
	}
	for r, ok := range seen {
		if !ok {
			return nil, fmt.Errorf("tcp: Split %q: rank %d is in no group; every rank must be in exactly one", name, r)
		}
	}
	out := make([]*Comm, w.Local())
	first := w.FirstRank()
	for gi, g := range groups {
		cs := w.newGroup(fmt.Sprintf("%s%d", name, gi), g)
		for i, r := range g {
			if l := r - first; l >= 0 && l < len(out) {
				out[l] = cs[i]
			}
		}
	}
	return out, nil
}

// group is what the ranks of one group agree on.
type group struct {
	name    string
	id      uint32
	check   uint64
	members []int // global ranks, in group rank order
}

// newGroup numbers a new group and returns the communicators of its ranks, indexed by group
// rank; ranks of other processes get nil.
func (w *World) newGroup(name string, members []int) []*Comm {
	w.mu.Lock()
	id := w.nextGroup
	w.nextGroup++
	w.mu.Unlock()
	h := fnv.New64a()
	h.Write([]byte(name))
	for _, r := range members {
		h.Write(binary.LittleEndian.AppendUint64(nil, uint64(r)))
	}
	g := &group{name: name, id: id, check: h.Sum64(), members: append([]int(nil), members...)}
	cs := make([]*Comm, len(members))
	first := w.FirstRank()
	for i, r := range members {
		if l := r - first; l >= 0 && l < w.Local() {
			cs[i] = &Comm{w: w, g: g, rank: i, b: w.backends[l],
				sendSeq: make([]uint64, len(members)), recvSeq: make([]uint64, len(members))}
		}
	}
	return cs
}

func (w *World) box(k boxKey) *mailbox {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.boxes[k]
	if m == nil {
		m = &mailbox{ready: make(chan struct{}, 1)}
		w.boxes[k] = m
	}
	return m
}

// creditsOf is the in-flight semaphore of point-to-point messages from rank from to rank to.
func (w *World) creditsOf(group, from, to uint32) chan struct{} {
	k := boxKey{group: group, from: from, to: to, lane: laneP2P}
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.credits[k]
	if c == nil {
		c = make(chan struct{}, MaxInFlight)
		w.credits[k] = c
	}
	return c
}

// deliver hands a frame that reached this process to its receiver.
func (w *World) deliver(f *frame) {
	switch f.typ {
	case frameData, frameError:
		w.box(boxKey{group: f.group, from: f.from, to: f.to, lane: f.lane()}).put(f)
	case frameCredit:
		// The receiver f.from took a message of sender f.to.
		select {
		case <-w.creditsOf(f.group, f.to, f.from):
		default:
		}
	}
}

// abortCause returns the abort error, or nil.
func (w *World) abortCause() error {
	w.abortMu.Lock()
	defer w.abortMu.Unlock()
	return w.abortErr
}

// abortLocal fails every pending and later collective of this process; it reports whether
// this call was the first.
func (w *World) abortLocal(err error) bool {
	w.abortMu.Lock()
	defer w.abortMu.Unlock()
	if w.abortErr != nil {
		return false
	}
	w.abortErr = err
	close(w.aborted)
	return true
}

// Abort makes every pending and later collective of every group fail with err (wrapped), on
// this process and, as far as they can still be told, on the others. Call it when a local rank
// fails between collectives, so that no rank waits for it until the timeout.
func (w *World) Abort(err error) {
	if err == nil {
		err = errors.New("aborted")
	}
	if !w.abortLocal(err) {
		return
	}
	w.tellAbort(err)
}

// tellAbort sends an abort frame to every other process, waiting at most closeGrace.
func (w *World) tellAbort(err error) {
	msg := []byte(err.Error())
	if len(msg) > maxErrorMsg {
		msg = msg[:maxErrorMsg]
	}
	var wg sync.WaitGroup
	for _, p := range w.peers {
		if p == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = p.write(&frame{typ: frameAbort, data: msg}, time.Now().Add(closeGrace))
		}()
	}
	wg.Wait()
}

// fatal aborts the world because of err (a broken connection, a timeout, frames out of
// order) and returns err.
func (w *World) fatal(err error) error {
	if w.abortLocal(err) {
		go w.tellAbort(err)
	}
	return err
}

// write sends one frame; the whole frame is written under the peer's lock.
func (p *peer) write(f *frame, deadline time.Time) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	select {
	case <-p.gone:
		return p.goneErr
	default:
	}
	p.conn.SetWriteDeadline(deadline)
	bufs := net.Buffers{f.header()}
	if len(f.data) > 0 {
		bufs = append(bufs, f.data)
	}
	n, err := bufs.WriteTo(p.conn)
	p.sent.Add(n)
	if err != nil && !os.IsTimeout(err) {
		// A write that fails on a dead connection races the reader, which closes the
		// connection once it has seen the peer go and then says why (a peer that closed its
		// world, a lost connection): wait briefly for that reason rather than report the
		// socket's own "use of closed network connection" or "broken pipe".
		select {
		case <-p.gone:
			return p.goneErr
		case <-time.After(goneWait):
		}
	}
	return err
}

// goneWait bounds how long a failed write waits for the reader to say why the peer went.
const goneWait = time.Second

// read runs until the connection ends, delivering every frame.
func (w *World) read(p *peer) {
	br := bufio.NewReaderSize(p.conn, 256<<10)
	var err error
	for {
		var f *frame
		if f, err = readFrame(br, w.maxMessage); err != nil {
			break
		}
		switch f.typ {
		case frameBye:
			p.sawBye = true
		case frameAbort:
			w.abortLocal(fmt.Errorf("%s aborted the world: %s", w.nodeName(p.node), f.data))
		default:
			w.deliver(f)
		}
	}
	w.mu.Lock()
	closing := w.closing
	w.mu.Unlock()
	switch {
	case p.sawBye && errors.Is(err, io.EOF):
		p.goneErr = fmt.Errorf("%s closed its world", w.nodeName(p.node))
	case closing:
		p.goneErr = fmt.Errorf("this process closed its world")
	default:
		p.goneErr = fmt.Errorf("the connection to %s was lost (%v): that process exited, crashed or was cut off; check its log, then restart the run", w.nodeName(p.node), err)
		w.abortLocal(p.goneErr)
	}
	p.conn.Close()
	close(p.gone)
}

// Close tells every other process that this one is done, waits (a bounded time) for them to
// close too, and releases the connections; collectives still waiting fail. It does not close
// the backends.
func (w *World) Close() error {
	w.mu.Lock()
	if w.closing {
		w.mu.Unlock()
		return nil
	}
	w.closing = true
	w.mu.Unlock()
	deadline := time.Now().Add(closeGrace)
	for _, p := range w.peers {
		if p == nil {
			continue
		}
		if p.write(&frame{typ: frameBye}, deadline) == nil {
			if tc, ok := p.conn.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
		}
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for _, p := range w.peers {
		if p == nil {
			continue
		}
		select {
		case <-p.gone:
		case <-timer.C:
		}
	}
	w.closeConns()
	w.abortLocal(errors.New("the world was closed"))
	return nil
}

func (w *World) closeConns() {
	for _, p := range w.peers {
		if p != nil {
			p.conn.Close()
		}
	}
}

// Fabric returns w as a comm.Fabric (the world a parallel plan builds its groups from). Its
// ranks are this process's local ranks; Split takes global ranks.
func (w *World) Fabric() comm.Fabric { return fabric{w} }

type fabric struct{ w *World }

func (f fabric) Size() int                    { return f.w.Local() }
func (f fabric) Comm(i int) comm.Communicator { return f.w.Comm(i) }
func (f fabric) Abort(err error)              { f.w.Abort(err) }
func (f fabric) Close() error                 { return f.w.Close() }

func (f fabric) Split(name string, groups [][]int) ([]comm.Communicator, error) {
	cs, err := f.w.Split(name, groups)
	if err != nil {
		return nil, err
	}
	out := make([]comm.Communicator, len(cs))
	for i, c := range cs {
		out[i] = c
	}
	return out, nil
}

// Connections between processes: process p dials every process q < p and accepts every
// q > p. The acceptor sends a random challenge; the dialer answers with its process index and
// an HMAC-SHA256 under the rendezvous token of the world id, the challenge and its index; the
// acceptor checks it in constant time and acknowledges with one byte.
const (
	helloMagic = "HTH1"
	helloSize  = 4 + 4 + sha256.Size
	ackByte    = 'A'
)

func meshMAC(token string, worldID, nonce []byte, node int) []byte {
	h := hmac.New(sha256.New, []byte(token))
	h.Write([]byte("halo-shell tcp mesh"))
	h.Write(worldID)
	h.Write(nonce)
	h.Write(binary.BigEndian.AppendUint32(nil, uint32(node)))
	return h.Sum(nil)
}

// connect builds the connections to every other process and starts their readers.
func (w *World) connect(ctx context.Context, ln net.Listener, rw rendezvous.World, token string) error {
	deadline, _ := ctx.Deadline()
	nn := rw.NNodes()
	type result struct {
		node int
		conn net.Conn
		err  error
	}
	// Room for every result that can come: one per other process, and a failed accept.
	results := make(chan result, nn+1)
	expectAccept := nn - 1 - w.node
	// Accept every higher process. Each handshake runs on its own goroutine, so a stranger that
	// connects and says nothing cannot hold up the others.
	acceptDone := make(chan struct{})
	go func() {
		defer close(acceptDone)
		var mu sync.Mutex
		got := map[int]bool{}
		for {
			if tl, ok := ln.(*net.TCPListener); ok {
				tl.SetDeadline(deadline)
			}
			conn, err := ln.Accept()
			if err != nil {
				mu.Lock()
				missing := expectAccept - len(got)
				mu.Unlock()
				if missing > 0 {
					results <- result{node: -1, err: fmt.Errorf("tcp: node %d: waiting for connections from the higher nodes (%d missing): %v", w.node, missing, err)}
				}
				return
			}
			go func() {
				node, err := w.acceptHello(conn, rw.Payload, token, deadline)
				mu.Lock()
				ok := err == nil && !got[node]
				if ok {
					got[node] = true
				}
				mu.Unlock()
				if !ok {
					// A stranger, a wrong token or a duplicate: refuse it and keep waiting.
					conn.Close()
					return
				}
				results <- result{node: node, conn: conn}
			}()
		}
	}()
	// Dial every lower process.
	for q := 0; q < w.node; q++ {
		go func() {
			conn, err := w.dial(ctx, q, rw, token)
			results <- result{node: q, conn: conn, err: err}
		}()
	}
	var errs []error
	for range nn - 1 {
		r := <-results
		if r.err != nil {
			errs = append(errs, r.err)
			if r.node < 0 {
				break
			}
			continue
		}
		r.conn.SetDeadline(time.Time{})
		w.peers[r.node] = &peer{node: r.node, conn: r.conn, gone: make(chan struct{})}
	}
	ln.Close()
	<-acceptDone
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	for _, p := range w.peers {
		if p != nil {
			go w.read(p)
		}
	}
	return nil
}

func (w *World) acceptHello(conn net.Conn, worldID []byte, token string, deadline time.Time) (int, error) {
	conn.SetDeadline(deadline)
	nonce := make([]byte, 32)
	if _, err := rand.Read(nonce); err != nil {
		return 0, err
	}
	if _, err := conn.Write(nonce); err != nil {
		return 0, err
	}
	var h [helloSize]byte
	if _, err := io.ReadFull(conn, h[:]); err != nil {
		return 0, err
	}
	if string(h[:4]) != helloMagic {
		return 0, errors.New("not a halo-shell tcp peer")
	}
	node := int(binary.BigEndian.Uint32(h[4:8]))
	if node <= w.node || node >= len(w.peers) {
		return 0, fmt.Errorf("node %d may not connect to node %d", node, w.node)
	}
	if !hmac.Equal(h[8:], meshMAC(token, worldID, nonce, node)) {
		return 0, errors.New("wrong token or world")
	}
	if _, err := conn.Write([]byte{ackByte}); err != nil {
		return 0, err
	}
	return node, nil
}

func (w *World) dial(ctx context.Context, q int, rw rendezvous.World, token string) (net.Conn, error) {
	addr := rw.Nodes[q].Addr
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcp: node %d cannot connect to node %d at %s: %v; is that address reachable from this host (set Listen to a routable address)?", w.node, q, addr, err)
	}
	deadline, _ := ctx.Deadline()
	conn.SetDeadline(deadline)
	fail := func(err error) (net.Conn, error) {
		conn.Close()
		return nil, fmt.Errorf("tcp: node %d: handshake with node %d at %s: %v", w.node, q, addr, err)
	}
	nonce := make([]byte, 32)
	if _, err := io.ReadFull(conn, nonce); err != nil {
		return fail(err)
	}
	h := append([]byte(helloMagic), binary.BigEndian.AppendUint32(nil, uint32(w.node))...)
	h = append(h, meshMAC(token, rw.Payload, nonce, w.node)...)
	if _, err := conn.Write(h); err != nil {
		return fail(err)
	}
	var ack [1]byte
	if _, err := io.ReadFull(conn, ack[:]); err != nil || ack[0] != ackByte {
		return fail(fmt.Errorf("node %d refused this node (wrong token?): %v", q, err))
	}
	return conn, nil
}
