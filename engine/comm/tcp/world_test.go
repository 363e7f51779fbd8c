package tcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/comm/rendezvous"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// cpuBackends makes n single-worker CPU backends.
func cpuBackends(n int) []backend.Backend {
	bs := make([]backend.Backend, n)
	for i := range bs {
		bs[i] = cpu.New(cpu.Options{Workers: 1})
	}
	return bs
}

// joinInProcess builds a world of len(ranks) processes simulated by goroutines of this test
// (ranks[p] ranks on process p), connected by real TCP connections on localhost.
func joinInProcess(t *testing.T, ranks []int, timeout time.Duration) []*World {
	t.Helper()
	bs := make([][]backend.Backend, len(ranks))
	for p, n := range ranks {
		bs[p] = cpuBackends(n)
	}
	ws, err := joinBackends(bs, timeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAll(ws) })
	return ws
}

// joinBackends joins one simulated process per entry of bs (its ranks' backends).
func joinBackends(bs [][]backend.Backend, timeout time.Duration) ([]*World, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ws := make([]*World, len(bs))
	errs := make([]error, len(bs))
	var wg sync.WaitGroup
	for p := range bs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := Config{
				Rendezvous: rendezvous.Config{NNodes: len(bs), NodeRank: p, Addr: ln.Addr().String(), Token: "secret", Timeout: 20 * time.Second},
				Listen:     "127.0.0.1:0",
				Timeout:    timeout,
			}
			if p == 0 {
				cfg.RendezvousListener = ln
			}
			ws[p], errs[p] = Join(context.Background(), cfg, bs[p])
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return ws, nil
}

func closeAll(ws []*World) error {
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = w.Close() }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// eachWorld runs fn on every world concurrently and returns the errors by process.
func eachWorld(ws []*World, fn func(p int, w *World) error) []error {
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for p, w := range ws {
		wg.Add(1)
		go func() { defer wg.Done(); errs[p] = fn(p, w) }()
	}
	wg.Wait()
	return errs
}

func TestInProcessWorldsMatchInprocBitForBit(t *testing.T) {
	for _, ranks := range [][]int{{1}, {2, 2}, {1, 1, 1}, {1, 3}} {
		t.Run(fmt.Sprint(ranks), func(t *testing.T) {
			ws := joinInProcess(t, ranks, 30*time.Second)
			for p, err := range eachWorld(ws, func(_ int, w *World) error { return compareWithInproc(w) }) {
				if err != nil {
					t.Errorf("process %d:\n%v", p, err)
				}
			}
		})
	}
}

func TestWorldLayout(t *testing.T) {
	ws := joinInProcess(t, []int{2, 1, 3}, 30*time.Second)
	for p, w := range ws {
		first := []int{0, 2, 3}[p]
		if w.Size() != 6 || w.FirstRank() != first || w.Node() != p || w.Local() != []int{2, 1, 3}[p] {
			t.Errorf("process %d: size %d first %d node %d local %d", p, w.Size(), w.FirstRank(), w.Node(), w.Local())
		}
		for i := range w.Local() {
			if c := w.Comm(i); c.Rank() != first+i || c.Size() != 6 || c.Group() != "world" {
				t.Errorf("process %d local %d: rank %d size %d group %s", p, i, c.Rank(), c.Size(), c.Group())
			}
		}
		f := w.Fabric()
		if f.Size() != w.Local() {
			t.Errorf("fabric size %d, want %d", f.Size(), w.Local())
		}
	}
	// Split refuses what comm.World.Split refuses, naming the problem.
	for _, tc := range []struct {
		groups [][]int
		want   string
	}{
		{[][]int{{0, 1, 2}, {3, 4}}, "rank 5 is in no group"},
		{[][]int{{0, 1, 2}, {3, 4, 5, 0}}, "rank 0 is in more than one group"},
		{[][]int{{0, 1, 2, 3, 4, 5}, {}}, "group 1 is empty"},
		{[][]int{{0, 1, 2, 3, 4, 6}}, "names rank 6"},
	} {
		if _, err := ws[0].Split("g", tc.groups); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Split %v: got %v, want %q", tc.groups, err, tc.want)
		}
	}
}

func cpuBackendsOf(bs ...backend.Backend) []backend.Backend { return bs }

func TestAbortReachesEveryProcess(t *testing.T) {
	ws := joinInProcess(t, []int{1, 2}, 20*time.Second)
	errs := make(chan error, 2)
	for i := range 2 {
		go func() {
			x, _ := ws[1].Comm(i).Backend().Alloc(tensor.F32, 8)
			errs <- ws[1].Comm(i).AllReduce(x, comm.Sum)
		}()
	}
	time.Sleep(50 * time.Millisecond)
	ws[0].Fabric().Abort(errors.New("rank 0 ran out of memory"))
	for range 2 {
		select {
		case err := <-errs:
			if err == nil || !strings.Contains(err.Error(), "node 0 (global rank 0) aborted the world: rank 0 ran out of memory") {
				t.Errorf("got %v, want the abort of node 0 with its reason", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a rank of process 1 still waits 10 s after process 0 aborted")
		}
	}
	if err := ws[0].Comm(0).Barrier(); err == nil || !strings.Contains(err.Error(), "aborted") {
		t.Errorf("process 0 after its abort: %v", err)
	}
}

func TestSendIsBoundedInFlight(t *testing.T) {
	for _, layout := range [][]int{{1, 1}, {2}} {
		t.Run(fmt.Sprint(layout), func(t *testing.T) {
			ws := joinInProcess(t, layout, time.Second)
			sender := ws[0].Comm(0)
			receiver := ws[len(ws)-1].Comm(ws[len(ws)-1].Local() - 1)
			x, _ := sender.Backend().Alloc(tensor.F32, 4)
			for i := range MaxInFlight {
				if err := sender.Send(x, 1); err != nil {
					t.Fatalf("send %d of %d in flight: %v", i, MaxInFlight, err)
				}
			}
			// One more waits for the receiver: it goes through once one message is received.
			got := make(chan error, 1)
			go func() {
				time.Sleep(100 * time.Millisecond)
				y, _ := receiver.Backend().Alloc(tensor.F32, 4)
				got <- receiver.Recv(y, 0)
			}()
			if err := sender.Send(x, 1); err != nil {
				t.Fatalf("send after a receive: %v", err)
			}
			if err := <-got; err != nil {
				t.Fatal(err)
			}
			// And with nobody receiving, the next one times out naming the receiver.
			start := time.Now()
			err := sender.Send(x, 1)
			if err == nil || !strings.Contains(err.Error(), "timed out") || !strings.Contains(err.Error(), "send to rank 1") {
				t.Fatalf("got %v, want a timeout naming rank 1", err)
			}
			if d := time.Since(start); d < 900*time.Millisecond {
				t.Errorf("the send gave up after %v, before the 1 s timeout", d)
			}
		})
	}
}

func TestRecvChecksSize(t *testing.T) {
	ws := joinInProcess(t, []int{1, 1}, 20*time.Second)
	a, b := ws[0].Comm(0), ws[1].Comm(0)
	x, _ := a.Backend().Alloc(tensor.F32, 4)
	y, _ := b.Backend().Alloc(tensor.F32, 5)
	if err := a.Send(x, 1); err != nil {
		t.Fatal(err)
	}
	if err := b.Recv(y, 0); err == nil || !strings.Contains(err.Error(), "message has 16 bytes") {
		t.Fatalf("got %v, want a size error", err)
	}
}

func TestLocalRankThatNeverArrivesTimesOut(t *testing.T) {
	ws := joinInProcess(t, []int{2}, 500*time.Millisecond)
	err := ws[0].Comm(0).Barrier()
	if err == nil || !strings.Contains(err.Error(), "timed out after 500ms waiting for rank 1") || !strings.Contains(err.Error(), "barrier") {
		t.Fatalf("got %v, want a timeout naming rank 1 and the barrier", err)
	}
}

func TestClosedPeerIsNamed(t *testing.T) {
	ws := joinInProcess(t, []int{1, 1}, 20*time.Second)
	done := make(chan error, 1)
	go func() { done <- ws[1].Close() }()
	x, _ := ws[0].Comm(0).Backend().Alloc(tensor.F32, 3)
	err := ws[0].Comm(0).AllReduce(x, comm.Sum)
	if err == nil || !strings.Contains(err.Error(), "node 1 (global rank 1) closed its world") {
		t.Fatalf("got %v, want an error naming the closed node", err)
	}
	ws[0].Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestSilentStrangerDoesNotHoldUpTheMesh(t *testing.T) {
	ln0, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln1, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rw := rendezvous.World{Nodes: []rendezvous.Node{
		{Rank: 0, Devices: 1, Addr: ln0.Addr().String()},
		{Rank: 1, Devices: 1, Addr: ln1.Addr().String()},
	}, Payload: []byte("world-id")}
	// The stranger connects first and never speaks; its handshake only ends at the deadline.
	stranger, err := net.Dial("tcp", ln0.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ws := []*World{newWorld(Config{}, rw, 0, cpuBackends(1)), newWorld(Config{}, rw, 1, cpuBackends(1))}
	lns := []net.Listener{ln0, ln1}
	start := time.Now()
	for p, err := range eachWorld(ws, func(p int, w *World) error { return w.connect(ctx, lns[p], rw, "tok") }) {
		if err != nil {
			t.Fatalf("process %d: %v", p, err)
		}
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the mesh took %v: the silent stranger held it up", d)
	}
	for p, err := range eachWorld(ws, func(_ int, w *World) error { return w.Comm(0).Barrier() }) {
		if err != nil {
			t.Errorf("process %d: barrier: %v", p, err)
		}
	}
	if err := closeAll(ws); err != nil {
		t.Fatal(err)
	}
}
