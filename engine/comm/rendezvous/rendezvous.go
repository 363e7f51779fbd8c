package rendezvous

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"
)

// Limits on what a node may claim.
const (
	MaxNodes          = 4096
	MaxDevicesPerNode = 1024
)

// verdictGrace is how much longer than Config.Timeout a node other than node 0 waits.
const verdictGrace = 2 * time.Second

// DefaultTimeout bounds the whole rendezvous when Config.Timeout is zero.
const DefaultTimeout = 5 * time.Minute

// Config says how this node joins the world.
type Config struct {
	// NNodes is the number of nodes (processes) in the world, 1 or more.
	NNodes int
	// NodeRank is this node's index, 0 <= NodeRank < NNodes. Node 0 runs the server.
	NodeRank int
	// Addr is node 0's rendezvous address, HOST:PORT; the other nodes connect to it.
	Addr string
	// Bind is the address node 0 listens on; empty means ":PORT" of Addr (every interface).
	Bind string
	// Token is the shared secret every node must know. Required when NNodes > 1.
	Token string
	// Timeout bounds the whole rendezvous (connecting, waiting for the other nodes, receiving
	// the world); zero means DefaultTimeout.
	Timeout time.Duration
}

func (c Config) timeout() time.Duration {
	if c.Timeout <= 0 {
		return DefaultTimeout
	}
	return c.Timeout
}

// Validate checks the config for this node.
func (c Config) Validate() error {
	switch {
	case c.NNodes < 1 || c.NNodes > MaxNodes:
		return fmt.Errorf("rendezvous: nnodes %d: want 1..%d", c.NNodes, MaxNodes)
	case c.NodeRank < 0 || c.NodeRank >= c.NNodes:
		return fmt.Errorf("rendezvous: node rank %d is outside 0..%d (nnodes %d); set --node-rank", c.NodeRank, c.NNodes-1, c.NNodes)
	case c.NNodes == 1:
		return nil
	case c.Token == "":
		return errors.New("rendezvous: no token: every node of a multi-node run needs the same secret (--rendezvous-token, --rendezvous-token-file or HALO_RENDEZVOUS_TOKEN)")
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("rendezvous: address %q: %v; want HOST:PORT of node 0 (--rendezvous)", c.Addr, err)
	}
	return nil
}

// Node is one member of the world.
type Node struct {
	Rank    int    `json:"rank"`
	Devices int    `json:"devices"`
	Host    string `json:"host"`
	// Addr is where the node accepts connections from the other nodes (HOST:PORT), as it
	// announced it through JoinAt; empty when it announced none (Join). A node that announces
	// ":PORT" (no host) is given the IP address node 0 saw its connection come from, and node
	// 0's own ":PORT" is given the host of Config.Addr on the other nodes, so that every node
	// can dial every other one without knowing its own routable address.
	Addr string `json:"addr,omitempty"`
}

// World is what every node agrees on once the rendezvous is complete.
type World struct {
	Nodes []Node `json:"nodes"`
	// Payload is what node 0 passed to Join (e.g. an NCCL unique id); the same on every node.
	Payload []byte `json:"payload"`
}

// NNodes is the number of nodes.
func (w World) NNodes() int { return len(w.Nodes) }

// Devices is the total number of devices over every node.
func (w World) Devices() int {
	n := 0
	for _, x := range w.Nodes {
		n += x.Devices
	}
	return n
}

// FirstRank is the global rank of node's first device: devices are numbered node by node.
func (w World) FirstRank(node int) int {
	n := 0
	for _, x := range w.Nodes[:node] {
		n += x.Devices
	}
	return n
}

// Join runs the rendezvous for this node: node 0 serves until every node has arrived, the others
// connect (retrying until node 0 listens). devices is this node's local device count; payload is
// used on node 0 only and reaches every node in World.Payload.
func Join(ctx context.Context, cfg Config, devices int, payload []byte) (World, error) {
	return JoinAt(ctx, cfg, devices, "", payload)
}

// JoinAt is Join for a node that also accepts connections from the other nodes at addr
// (HOST:PORT, or ":PORT" to let the rendezvous fill in the host; see Node.Addr): every node's
// World then carries every node's address.
func JoinAt(ctx context.Context, cfg Config, devices int, addr string, payload []byte) (World, error) {
	if err := cfg.Validate(); err != nil {
		return World{}, err
	}
	if devices < 0 || devices > MaxDevicesPerNode {
		return World{}, fmt.Errorf("rendezvous: device count %d outside 0..%d", devices, MaxDevicesPerNode)
	}
	if len(payload) > maxPayload {
		return World{}, fmt.Errorf("rendezvous: payload of %d bytes exceeds %d", len(payload), maxPayload)
	}
	if err := checkAddr(addr); err != nil {
		return World{}, fmt.Errorf("rendezvous: this node's address: %v", err)
	}
	host, _ := os.Hostname()
	self := Node{Rank: cfg.NodeRank, Devices: devices, Host: host, Addr: addr}
	// The other nodes wait a little longer than node 0, so that when time runs out they receive
	// node 0's verdict (which names the missing ranks) rather than each giving up on its own.
	wait := cfg.timeout()
	if cfg.NodeRank > 0 {
		wait += verdictGrace
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if cfg.NNodes == 1 {
		return World{Nodes: []Node{self}, Payload: payload}, nil
	}
	if cfg.NodeRank == 0 {
		bind := cfg.Bind
		if bind == "" {
			_, port, _ := net.SplitHostPort(cfg.Addr)
			bind = ":" + port
		}
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", bind)
		if err != nil {
			return World{}, fmt.Errorf("rendezvous: node 0 cannot listen on %s: %v; choose another port or bind address", bind, err)
		}
		return Serve(ctx, ln, cfg, self, payload)
	}
	return connect(ctx, cfg, self)
}

// mac is the answer to a challenge: HMAC-SHA256 under the token of the nonce and the rank.
func mac(token string, nonce []byte, rank int) []byte {
	h := hmac.New(sha256.New, []byte(token))
	h.Write(nonce)
	var r [8]byte
	binary.BigEndian.PutUint64(r[:], uint64(rank))
	h.Write(r[:])
	return h.Sum(nil)
}

// pending is an accepted, authenticated node waiting for the world.
type pending struct {
	conn net.Conn
	node Node
}

// Serve runs node 0's side on ln (which it closes) until every node has arrived or ctx ends.
// self is node 0's own entry. Join calls it; tests call it with a listener of their own.
func Serve(ctx context.Context, ln net.Listener, cfg Config, self Node, payload []byte) (World, error) {
	defer ln.Close()
	addr := ln.Addr().String()
	type arrival struct {
		p   *pending
		err error
	}
	arrivals := make(chan arrival)
	// On return: stop accepting, close every connection still open (a handshake in progress, a
	// node that arrived after the world was complete) and wait for their goroutines.
	done := make(chan struct{})
	var cmu sync.Mutex
	conns := map[net.Conn]bool{}
	var wg sync.WaitGroup
	acceptDone := make(chan struct{})
	defer func() {
		close(done)
		ln.Close()
		cmu.Lock()
		for c := range conns {
			c.Close()
		}
		cmu.Unlock()
		<-acceptDone
		wg.Wait()
	}()
	go func() {
		defer close(acceptDone)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			cmu.Lock()
			select {
			case <-done:
				conn.Close()
				cmu.Unlock()
				return
			default:
			}
			conns[conn] = true
			cmu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				p, err := handshake(ctx, conn, cfg)
				if err != nil {
					conn.Close()
					p = nil
				}
				select {
				case arrivals <- arrival{p, err}:
				case <-done:
					conn.Close()
				case <-ctx.Done():
					conn.Close()
				}
			}()
		}
	}()

	nodes := make([]*pending, cfg.NNodes)
	nodes[0] = &pending{node: self}
	arrived := 1
	var refusals []string
	fail := func(msg string) error {
		for _, p := range nodes[1:] {
			if p != nil {
				writeFrame(p.conn, msgError, errorMsg{Message: msg})
				p.conn.Close()
			}
		}
		return fmt.Errorf("rendezvous: node 0 at %s: %s", addr, msg)
	}
	lost := make(chan int, cfg.NNodes)
	for arrived < cfg.NNodes {
		select {
		case <-ctx.Done():
			var missing []string
			for r, p := range nodes {
				if p == nil {
					missing = append(missing, fmt.Sprint(r))
				}
			}
			msg := fmt.Sprintf("timed out after %v waiting for %d of %d nodes: node rank(s) %s never arrived", cfg.timeout(), cfg.NNodes-arrived, cfg.NNodes, strings.Join(missing, ", "))
			if len(refusals) > 0 {
				msg += " (refused meanwhile: " + strings.Join(refusals, "; ") + ")"
			}
			return World{}, fail(msg)
		case r := <-lost:
			p := nodes[r]
			return World{}, fail(fmt.Sprintf("node rank %d (%s) disconnected before every node had arrived", p.node.Rank, p.node.Host))
		case a := <-arrivals:
			if a.err != nil {
				refusals = append(refusals, a.err.Error())
				continue
			}
			p := a.p
			if nodes[p.node.Rank] != nil {
				msg := fmt.Sprintf("node rank %d is already taken (by host %s); give every node its own --node-rank", p.node.Rank, nodes[p.node.Rank].node.Host)
				refusals = append(refusals, msg)
				writeFrame(p.conn, msgError, errorMsg{Message: msg})
				p.conn.Close()
				continue
			}
			nodes[p.node.Rank] = p
			p.watch(lost)
			arrived++
		}
	}
	w := World{Payload: payload}
	for _, p := range nodes {
		w.Nodes = append(w.Nodes, p.node)
	}
	var errs []error
	for _, p := range nodes[1:] {
		p.conn.SetWriteDeadline(deadline(ctx))
		if err := writeFrame(p.conn, msgWorld, worldMsg{Nodes: w.Nodes, Payload: payload}); err != nil {
			errs = append(errs, fmt.Errorf("rendezvous: node 0 at %s: sending the world to node rank %d: %v", addr, p.node.Rank, err))
		}
		p.conn.Close()
	}
	return w, errors.Join(errs...)
}

// watch reports p's rank on lost when the peer closes its connection (a node sends nothing
// after its hello, so a read returns only then). lost has room for every node, so the watcher
// never blocks; it ends when Serve closes the connection.
func (p *pending) watch(lost chan<- int) {
	go func() {
		var b [1]byte
		_, _ = p.conn.Read(b[:])
		lost <- p.node.Rank
	}()
}

func deadline(ctx context.Context) time.Time {
	d, ok := ctx.Deadline()
	if !ok {
		return time.Now().Add(DefaultTimeout)
	}
	return d
}

// handshake challenges a new connection and reads its hello; a refusal is sent to the node and
// returned as the error.
func handshake(ctx context.Context, conn net.Conn, cfg Config) (*pending, error) {
	conn.SetDeadline(deadline(ctx))
	from := conn.RemoteAddr().String()
	nonce := make([]byte, challengeSize)
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	if err := writeFrame(conn, msgChallenge, challengeMsg{Nonce: nonce}); err != nil {
		return nil, fmt.Errorf("connection from %s: %v", from, err)
	}
	var h helloMsg
	if err := decode(conn, msgHello, &h); err != nil {
		return nil, fmt.Errorf("connection from %s: %v", from, err)
	}
	refuse := func(format string, args ...any) (*pending, error) {
		msg := fmt.Sprintf(format, args...)
		writeFrame(conn, msgError, errorMsg{Message: msg})
		return nil, fmt.Errorf("connection from %s: %s", from, msg)
	}
	if !hmac.Equal(h.MAC, mac(cfg.Token, nonce, h.NodeRank)) {
		return refuse("wrong token: node rank %d does not know the secret node 0 was given; pass the same --rendezvous-token (or HALO_RENDEZVOUS_TOKEN) to every node", h.NodeRank)
	}
	if h.NNodes != cfg.NNodes {
		return refuse("node rank %d says the world has %d nodes, node 0 says %d; pass the same --nnodes to every node", h.NodeRank, h.NNodes, cfg.NNodes)
	}
	if h.NodeRank < 1 || h.NodeRank >= cfg.NNodes {
		return refuse("node rank %d is outside 1..%d (node 0 is the server); give each other node a rank in that range", h.NodeRank, cfg.NNodes-1)
	}
	conn.SetDeadline(time.Time{})
	host := h.Host
	if host == "" {
		host = from
	}
	addr := h.Addr
	if addr != "" {
		if ah, port, _ := net.SplitHostPort(addr); ah == "" {
			if ip, _, err := net.SplitHostPort(from); err == nil {
				addr = net.JoinHostPort(ip, port)
			}
		}
	}
	return &pending{conn: conn, node: Node{Rank: h.NodeRank, Devices: h.Devices, Host: host, Addr: addr}}, nil
}

// connect is a non-zero node's side: dial node 0 (retrying while nothing listens yet), answer
// the challenge, wait for the world.
func connect(ctx context.Context, cfg Config, self Node) (World, error) {
	var d net.Dialer
	var conn net.Conn
	var lastErr error
	// Retry quickly at first (node 0 usually starts at the same moment), then every half second.
	retry := 10 * time.Millisecond
	for {
		c, err := d.DialContext(ctx, "tcp", cfg.Addr)
		if err == nil {
			conn = c
			break
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return World{}, fmt.Errorf("rendezvous: node rank %d: cannot reach node 0 at %s within %v (last error: %v); is node 0 running and is the address right?", self.Rank, cfg.Addr, cfg.timeout()+verdictGrace, lastErr)
		case <-time.After(retry):
		}
		retry = min(2*retry, 500*time.Millisecond)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	conn.SetDeadline(deadline(ctx))
	wrap := func(stage string, err error) error {
		var re *RefusedError
		if errors.As(err, &re) {
			return fmt.Errorf("rendezvous: node rank %d: %w", self.Rank, err)
		}
		if ctx.Err() != nil || isTimeout(err) {
			return fmt.Errorf("rendezvous: node rank %d: timed out after %v %s from node 0 at %s", self.Rank, cfg.timeout()+verdictGrace, stage, cfg.Addr)
		}
		return fmt.Errorf("rendezvous: node rank %d: %s from node 0 at %s: %v", self.Rank, stage, cfg.Addr, err)
	}
	var ch challengeMsg
	if err := decode(conn, msgChallenge, &ch); err != nil {
		return World{}, wrap("reading the challenge", err)
	}
	h := helloMsg{NodeRank: self.Rank, NNodes: cfg.NNodes, Devices: self.Devices, Host: self.Host, Addr: self.Addr, MAC: mac(cfg.Token, ch.Nonce, self.Rank)}
	if err := writeFrame(conn, msgHello, h); err != nil {
		return World{}, wrap("sending hello", err)
	}
	var w worldMsg
	if err := decode(conn, msgWorld, &w); err != nil {
		return World{}, wrap("waiting for the world", err)
	}
	if len(w.Nodes) != cfg.NNodes {
		return World{}, fmt.Errorf("rendezvous: node rank %d: node 0 sent a world of %d nodes, want %d", self.Rank, len(w.Nodes), cfg.NNodes)
	}
	if a := w.Nodes[0].Addr; a != "" {
		if ah, port, err := net.SplitHostPort(a); err == nil && ah == "" {
			if h0, _, err := net.SplitHostPort(cfg.Addr); err == nil {
				w.Nodes[0].Addr = net.JoinHostPort(h0, port)
			}
		}
	}
	return World(w), nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
