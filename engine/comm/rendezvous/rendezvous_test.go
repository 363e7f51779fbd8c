package rendezvous

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/internal/testnet"
)

// A test binary started with HALO_RDZV_CHILD=1 is one node of a multi-process rendezvous: it
// joins with the config in the environment and prints the world as JSON on stdout, or the error
// on stderr with exit status 3.
func TestMain(m *testing.M) {
	if os.Getenv("HALO_RDZV_CHILD") == "1" {
		os.Exit(childNode())
	}
	os.Exit(m.Run())
}

func childNode() int {
	atoi := func(k string) int { n, _ := strconv.Atoi(os.Getenv(k)); return n }
	cfg := Config{
		NNodes:   atoi("RDZV_NNODES"),
		NodeRank: atoi("RDZV_RANK"),
		Addr:     os.Getenv("RDZV_ADDR"),
		Bind:     os.Getenv("RDZV_ADDR"),
		Token:    os.Getenv("RDZV_TOKEN"),
		Timeout:  time.Duration(atoi("RDZV_TIMEOUT_MS")) * time.Millisecond,
	}
	var payload []byte
	if cfg.NodeRank == 0 {
		payload = []byte("nccl-unique-id-of-node-0")
	}
	w, err := Join(context.Background(), cfg, atoi("RDZV_DEVICES"), payload)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	json.NewEncoder(os.Stdout).Encode(w)
	return 0
}

// freeAddr returns a localhost address whose port was free a moment ago, below the
// ephemeral range (testnet).
func freeAddr(t testing.TB) string {
	t.Helper()
	return testnet.FreeAddr(t)
}

type nodeResult struct {
	world  World
	stderr string
	err    error
}

// runNodes starts one process per entry of ranks (node rank each) and waits for all of them.
func runNodes(t *testing.T, nnodes int, ranks []int, tokens []string, timeout time.Duration) []nodeResult {
	t.Helper()
	addr := freeAddr(t)
	res := make([]nodeResult, len(ranks))
	var wg sync.WaitGroup
	for i, r := range ranks {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "HALO_RDZV_CHILD=1",
			"RDZV_NNODES="+strconv.Itoa(nnodes), "RDZV_RANK="+strconv.Itoa(r), "RDZV_ADDR="+addr,
			"RDZV_TOKEN="+tokens[i], "RDZV_TIMEOUT_MS="+strconv.Itoa(int(timeout/time.Millisecond)),
			"RDZV_DEVICES="+strconv.Itoa(r+1))
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := cmd.Wait()
			res[i] = nodeResult{stderr: errb.String(), err: err}
			if err == nil {
				if jerr := json.Unmarshal(out.Bytes(), &res[i].world); jerr != nil {
					res[i].err = fmt.Errorf("node %d printed %q: %v", r, out.String(), jerr)
				}
			}
		}()
	}
	wg.Wait()
	return res
}

func TestProcessesAgreeOnWorldAndPayload(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("nodes=%d", n), func(t *testing.T) {
			ranks := make([]int, n)
			tokens := make([]string, n)
			for i := range ranks {
				// Start the highest ranks first: they must wait for node 0 to listen.
				ranks[i] = n - 1 - i
				tokens[i] = "s3cret"
			}
			res := runNodes(t, n, ranks, tokens, 20*time.Second)
			var first []byte
			for i, r := range res {
				if r.err != nil {
					t.Fatalf("node %d: %v: %s", ranks[i], r.err, r.stderr)
				}
				w := r.world
				if w.NNodes() != n || string(w.Payload) != "nccl-unique-id-of-node-0" {
					t.Fatalf("node %d: world %+v", ranks[i], w)
				}
				for j, nd := range w.Nodes {
					if nd.Rank != j || nd.Devices != j+1 {
						t.Fatalf("node %d: entry %d is %+v, want rank %d with %d devices", ranks[i], j, nd, j, j+1)
					}
				}
				if w.Devices() != n*(n+1)/2 || w.FirstRank(n-1) != (n-1)*n/2 {
					t.Fatalf("node %d: devices %d first rank of last node %d", ranks[i], w.Devices(), w.FirstRank(n-1))
				}
				b, _ := json.Marshal(w)
				if first == nil {
					first = b
				} else if !bytes.Equal(first, b) {
					t.Fatalf("nodes disagree:\n%s\n%s", first, b)
				}
			}
		})
	}
}

func TestMissingNodeTimesOutNamingIt(t *testing.T) {
	res := runNodes(t, 4, []int{0, 1, 3}, []string{"k", "k", "k"}, 1500*time.Millisecond)
	if res[0].err == nil || !strings.Contains(res[0].stderr, "node rank(s) 2 never arrived") {
		t.Fatalf("node 0: err %v, stderr %q; want a timeout naming rank 2", res[0].err, res[0].stderr)
	}
	for _, i := range []int{1, 2} {
		if res[i].err == nil || !strings.Contains(res[i].stderr, "2 never arrived") {
			t.Fatalf("node %d: err %v stderr %q; want node 0's timeout message", i, res[i].err, res[i].stderr)
		}
	}
}

// joinAll runs the nodes as goroutines of this process (cheaper than processes for refusals).
func joinAll(cfgs []Config) ([]World, []error) {
	ws := make([]World, len(cfgs))
	errs := make([]error, len(cfgs))
	var wg sync.WaitGroup
	for i, c := range cfgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ws[i], errs[i] = Join(context.Background(), c, 1, []byte{byte(c.NodeRank)})
		}()
	}
	wg.Wait()
	return ws, errs
}

func TestRefusals(t *testing.T) {
	base := func(addr string, rank int) Config {
		return Config{NNodes: 2, NodeRank: rank, Addr: addr, Bind: addr, Token: "right", Timeout: 1500 * time.Millisecond}
	}
	cases := []struct {
		name    string
		mutate  func(c []Config) []Config
		refused int    // index of the node that must be refused
		want    string // in the refused node's error
		node0   string // in node 0's error
	}{
		{"wrong token", func(c []Config) []Config { c[1].Token = "wrong"; return c }, 1, "refused by node 0: wrong token", "never arrived (refused meanwhile: connection from"},
		{"wrong world size", func(c []Config) []Config { c[1].NNodes = 3; return c }, 1, "says the world has 3 nodes, node 0 says 2", "node rank(s) 1 never arrived"},
		{"duplicate rank", func(c []Config) []Config {
			d := c[1]
			c = append(c, d)
			c[0].NNodes, c[1].NNodes, c[2].NNodes = 3, 3, 3
			return c
		}, -1, "node rank 1 is already taken", "node rank(s) 2 never arrived"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr := freeAddr(t)
			cfgs := tc.mutate([]Config{base(addr, 0), base(addr, 1)})
			_, errs := joinAll(cfgs)
			if errs[0] == nil || !strings.Contains(errs[0].Error(), tc.node0) {
				t.Fatalf("node 0: %v; want %q", errs[0], tc.node0)
			}
			found := false
			for i, err := range errs[1:] {
				if tc.refused >= 0 && i+1 != tc.refused {
					continue
				}
				if err != nil && strings.Contains(err.Error(), tc.want) {
					found = true
				}
			}
			if !found {
				t.Fatalf("no node refused with %q: %v", tc.want, errs)
			}
		})
	}
}

func TestDisconnectedNodeFailsRendezvous(t *testing.T) {
	addr := freeAddr(t)
	cfg := Config{NNodes: 3, NodeRank: 0, Addr: addr, Bind: addr, Token: "t", Timeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { _, err := Join(context.Background(), cfg, 1, nil); done <- err }()
	// Node 1 says hello properly, then hangs up.
	var conn net.Conn
	var err error
	for i := 0; i < 50; i++ {
		if conn, err = net.Dial("tcp", addr); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	var ch challengeMsg
	if err := decode(conn, msgChallenge, &ch); err != nil {
		t.Fatal(err)
	}
	if err := writeFrame(conn, msgHello, helloMsg{NodeRank: 1, NNodes: 3, Devices: 2, Host: "h1", MAC: mac("t", ch.Nonce, 1)}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	conn.Close()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "node rank 1 (h1) disconnected") {
			t.Fatalf("got %v; want node 1's disconnect named", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("node 0 did not notice the disconnect")
	}
}

func TestUnreachableNode0TimesOut(t *testing.T) {
	addr := freeAddr(t) // nothing listens there
	start := time.Now()
	_, err := Join(context.Background(), Config{NNodes: 2, NodeRank: 1, Addr: addr, Token: "t", Timeout: 700 * time.Millisecond}, 1, nil)
	if err == nil || !strings.Contains(err.Error(), "cannot reach node 0 at "+addr) {
		t.Fatalf("got %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("timeout of 700ms took %v", d)
	}
}

func TestSingleNodeNeedsNoServer(t *testing.T) {
	w, err := Join(context.Background(), Config{NNodes: 1}, 8, []byte("id"))
	if err != nil || w.NNodes() != 1 || w.Devices() != 8 || string(w.Payload) != "id" {
		t.Fatalf("%+v %v", w, err)
	}
}

func TestNotARendezvousServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
			c.Close()
		}
	}()
	_, err = Join(context.Background(), Config{NNodes: 2, NodeRank: 1, Addr: ln.Addr().String(), Token: "t", Timeout: 2 * time.Second}, 1, nil)
	if err == nil || !strings.Contains(err.Error(), "not a halo-shell rendezvous message") {
		t.Fatalf("got %v", err)
	}
}

func FuzzDecodeMessages(f *testing.F) {
	frame := func(typ byte, v any) []byte {
		var b bytes.Buffer
		writeFrame(&b, typ, v)
		return b.Bytes()
	}
	f.Add(frame(msgHello, helloMsg{NodeRank: 1, NNodes: 2, Devices: 8, Host: "n1", MAC: make([]byte, 32)}))
	f.Add(frame(msgWorld, worldMsg{Nodes: []Node{{Rank: 0, Devices: 8, Host: "a"}, {Rank: 1, Devices: 8, Host: "b", Addr: "10.0.0.2:4000"}}, Payload: make([]byte, 128)}))
	f.Add(frame(msgHello, helloMsg{NodeRank: 1, NNodes: 2, Devices: 8, Host: "n1", Addr: ":4000", MAC: make([]byte, 32)}))
	f.Add(frame(msgChallenge, challengeMsg{Nonce: make([]byte, 32)}))
	f.Add(frame(msgError, errorMsg{Message: "no"}))
	f.Add([]byte("HRZ1W\xff\xff\xff\xff"))
	f.Add([]byte("HRZ1H\x00\x00\x00\x02{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h helloMsg
		var w worldMsg
		var c challengeMsg
		if decode(bytes.NewReader(b), msgHello, &h) == nil && (len(h.MAC) != macSize || h.NNodes < 1) {
			t.Fatalf("accepted bad hello %+v", h)
		}
		if decode(bytes.NewReader(b), msgWorld, &w) == nil {
			for i, n := range w.Nodes {
				if n.Rank != i {
					t.Fatalf("accepted world with node %d ranked %d", i, n.Rank)
				}
			}
		}
		if decode(bytes.NewReader(b), msgChallenge, &c) == nil && len(c.Nonce) != challengeSize {
			t.Fatal("accepted short challenge")
		}
	})
}

// A connection that never says hello (a port scanner, a stuck node) must not keep node 0 from
// finishing once every real node has arrived.
func TestServeReturnsDespiteIdleConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	cfg := Config{NNodes: 2, NodeRank: 0, Addr: addr, Token: "t"}
	served := make(chan error, 1)
	go func() {
		_, err := Serve(context.Background(), ln, cfg, Node{Rank: 0, Devices: 1, Host: "n0"}, []byte("id"))
		served <- err
	}()
	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	w, err := Join(context.Background(), Config{NNodes: 2, NodeRank: 1, Addr: addr, Token: "t", Timeout: 10 * time.Second}, 2, nil)
	if err != nil || string(w.Payload) != "id" {
		t.Fatalf("node 1: %+v, %v", w, err)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("node 0 is still waiting on a connection that never said hello")
	}
}

func TestJoinAtCarriesEveryNodesAddress(t *testing.T) {
	addr := freeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	// Node 0 and node 2 announce ":PORT": node 0's host comes from the rendezvous address on
	// the other nodes, node 2's from the address node 0 saw it connect from. Node 1 announces a
	// full address, which is kept as it is.
	announce := []string{":7000", "10.1.2.3:7001", ":7002"}
	ws := make([]World, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for r := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := Config{NNodes: 3, NodeRank: r, Addr: addr, Bind: addr, Token: "k", Timeout: 20 * time.Second}
			ws[r], errs[r] = JoinAt(context.Background(), cfg, 2, announce[r], nil)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("node %d: %v", r, err)
		}
	}
	for r, w := range ws {
		want := []string{"127.0.0.1:7000", "10.1.2.3:7001", "127.0.0.1:7002"}
		if r == 0 {
			want[0] = ":7000" // node 0 never dials itself; its own entry is as announced
		}
		for i, n := range w.Nodes {
			if n.Addr != want[i] {
				t.Errorf("node %d sees node %d at %q, want %q (rendezvous port %s)", r, i, n.Addr, want[i], port)
			}
		}
	}
}

func TestJoinAtRefusesBadAddress(t *testing.T) {
	cfg := Config{NNodes: 2, NodeRank: 1, Addr: "127.0.0.1:1", Token: "k", Timeout: time.Second}
	for _, a := range []string{"no-port", "host:", strings.Repeat("h", 300) + ":1"} {
		_, err := JoinAt(context.Background(), cfg, 1, a, nil)
		if err == nil || !strings.Contains(err.Error(), "this node's address") {
			t.Errorf("address %q: got %v, want a refusal naming this node's address", a, err)
		}
	}
}
