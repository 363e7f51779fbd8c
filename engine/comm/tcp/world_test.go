package tcp

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/comm/rendezvous"
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ws := make([]*World, len(ranks))
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for p, n := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := Config{
				Rendezvous: rendezvous.Config{NNodes: len(ranks), NodeRank: p, Addr: ln.Addr().String(), Token: "secret", Timeout: 20 * time.Second},
				Listen:     "127.0.0.1:0",
				Timeout:    timeout,
			}
			if p == 0 {
				cfg.RendezvousListener = ln
			}
			ws[p], errs[p] = Join(context.Background(), cfg, cpuBackends(n))
		}()
	}
	wg.Wait()
	for p, err := range errs {
		if err != nil {
			t.Fatalf("process %d: %v", p, err)
		}
	}
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, w := range ws {
			wg.Add(1)
			go func() { defer wg.Done(); w.Close() }()
		}
		wg.Wait()
	})
	return ws
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
