package tcp

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/comm/rendezvous"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// A test binary started with HALO_TCP_CHILD=SCENARIO is one process of a multi-process world:
// it joins with the layout in the environment (node 0 serves the rendezvous on the listener it
// inherits as file descriptor 3), runs the scenario and prints "ok" or the error, exiting 3 on
// failure.
func TestMain(m *testing.M) {
	if sc := os.Getenv("HALO_TCP_CHILD"); sc != "" {
		if err := childMain(sc); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		fmt.Println("ok")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func childJoin() (*World, error) {
	atoi := func(k string) int { n, _ := strconv.Atoi(os.Getenv(k)); return n }
	timeout, _ := time.ParseDuration(os.Getenv("TCP_TIMEOUT"))
	cfg := Config{
		Rendezvous: rendezvous.Config{NNodes: atoi("TCP_NNODES"), NodeRank: atoi("TCP_NODE"), Addr: os.Getenv("TCP_ADDR"), Token: "multi-process-secret", Timeout: 20 * time.Second},
		Listen:     "127.0.0.1:0",
		Timeout:    timeout,
	}
	if cfg.Rendezvous.NodeRank == 0 {
		ln, err := net.FileListener(os.NewFile(3, "rendezvous"))
		if err != nil {
			return nil, fmt.Errorf("inherited listener: %v", err)
		}
		cfg.RendezvousListener = ln
	}
	return Join(context.Background(), cfg, cpuBackends(atoi("TCP_RANKS")))
}

func childMain(scenario string) error {
	w, err := childJoin()
	if err != nil {
		return err
	}
	switch scenario {
	case "compare":
		if err := compareWithInproc(w); err != nil {
			return err
		}
		return w.Close()
	case "crash", "hang":
		// The last process runs three all-reduces, then exits without closing (crash) or stops
		// calling collectives for longer than the timeout (hang); the others keep running
		// all-reduces until one fails, and report how long the failing one took.
		x, err := w.Comm(0).Backend().Alloc(tensor.F32, 1000)
		if err != nil {
			return err
		}
		last := w.Node() == w.Size()-1
		for i := 0; ; i++ {
			if last && i == 3 {
				if scenario == "crash" {
					time.Sleep(300 * time.Millisecond)
					os.Exit(0)
				}
				time.Sleep(4 * time.Second)
			}
			start := time.Now()
			err := w.Comm(0).AllReduce(x, comm.Sum)
			if err != nil {
				fmt.Printf("elapsed %v after %d all-reduces\nerror: %v\n", time.Since(start), i, err)
				return nil
			}
			if i > 1000 {
				return fmt.Errorf("1000 all-reduces succeeded")
			}
		}
	case "bench":
		return benchPeer(w)
	}
	return fmt.Errorf("unknown scenario %q", scenario)
}

type procResult struct {
	out string
	err error
}

// runProcs starts one process per entry of ranks (the process's rank count) running scenario,
// and waits for all of them.
func runProcs(t *testing.T, scenario string, ranks []int, timeout time.Duration) []procResult {
	t.Helper()
	cmds, outs := startProcs(t, scenario, ranks, timeout)
	res := make([]procResult, len(ranks))
	var wg sync.WaitGroup
	for p, cmd := range cmds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[p].err = cmd.Wait()
			res[p].out = outs[p].String()
		}()
	}
	wg.Wait()
	return res
}

func startProcs(t testing.TB, scenario string, ranks []int, timeout time.Duration) ([]*exec.Cmd, []*bytes.Buffer) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for p, n := range ranks {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "HALO_TCP_CHILD="+scenario, "TCP_NNODES="+strconv.Itoa(len(ranks)),
			"TCP_NODE="+strconv.Itoa(p), "TCP_ADDR="+ln.Addr().String(), "TCP_RANKS="+strconv.Itoa(n), "TCP_TIMEOUT="+timeout.String())
		if p == 0 {
			cmd.ExtraFiles = []*os.File{f}
		}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
		outs = append(outs, &out)
	}
	return cmds, outs
}

func TestProcessesMatchInprocBitForBit(t *testing.T) {
	for _, ranks := range [][]int{{2, 2}, {1, 1, 1}} {
		t.Run(fmt.Sprint(ranks), func(t *testing.T) {
			for p, r := range runProcs(t, "compare", ranks, 60*time.Second) {
				if r.err != nil || !strings.Contains(r.out, "ok") {
					t.Errorf("process %d: %v\n%s", p, r.err, r.out)
				}
			}
		})
	}
}

// elapsedOf parses the "elapsed D" line a failure scenario prints.
func elapsedOf(out string) (time.Duration, bool) {
	for _, l := range strings.Split(out, "\n") {
		if s, ok := strings.CutPrefix(l, "elapsed "); ok {
			d, err := time.ParseDuration(strings.Fields(s)[0])
			return d, err == nil
		}
	}
	return 0, false
}

func TestProcessThatExitsFailsTheOthersPromptly(t *testing.T) {
	const timeout = 30 * time.Second
	res := runProcs(t, "crash", []int{1, 1, 1}, timeout)
	for p, r := range res[:2] {
		if r.err != nil {
			t.Fatalf("process %d: %v\n%s", p, r.err, r.out)
		}
		d, ok := elapsedOf(r.out)
		if !ok || d > timeout/2 {
			t.Errorf("process %d: took %v to fail (ok %v); want well within the %v timeout\n%s", p, d, ok, timeout, r.out)
		}
		for _, want := range []string{"all_reduce", "node 2", "lost"} {
			if !strings.Contains(r.out, want) {
				t.Errorf("process %d: error does not name %q:\n%s", p, want, r.out)
			}
		}
	}
}

func TestStuckProcessTimesOutNamingIt(t *testing.T) {
	const timeout = 1500 * time.Millisecond
	res := runProcs(t, "hang", []int{1, 1, 1}, timeout)
	// Processes 0 and 1 both wait for rank 2 with the same timeout: the first to give up says it
	// timed out; the other may instead learn of that first (the world was aborted, or the first
	// process's connection closed as it exited), which must still name the collective and rank 2.
	timedOut := 0
	for p, r := range res[:2] {
		if r.err != nil {
			t.Fatalf("process %d: %v\n%s", p, r.err, r.out)
		}
		d, ok := elapsedOf(r.out)
		if !ok || d > timeout+3*time.Second {
			t.Errorf("process %d: took %v to fail; want about the %v timeout\n%s", p, d, timeout, r.out)
		}
		for _, want := range []string{"all_reduce", "rank 2"} {
			if !strings.Contains(r.out, want) {
				t.Errorf("process %d: error does not say %q:\n%s", p, want, r.out)
			}
		}
		switch {
		case strings.Contains(r.out, "timed out"):
			timedOut++
		case !strings.Contains(r.out, "aborted"):
			t.Errorf("process %d: error says neither that it timed out nor that the world was aborted:\n%s", p, r.out)
		}
	}
	if timedOut == 0 {
		t.Errorf("no process reported the timeout:\n%s\n%s", res[0].out, res[1].out)
	}
	// The stuck process, once it calls the collective, learns that the world was aborted.
	if r := res[2]; r.err != nil || !strings.Contains(r.out, "aborted") {
		t.Errorf("stuck process: %v\n%s", r.err, r.out)
	}
}

// benchPeer is the second process of the benchmark: it follows the commands node 0 broadcasts
// (operation, elements, iterations) until told to stop.
func benchPeer(w *World) error {
	c := w.Comm(0)
	b := c.Backend()
	ctl, _ := b.Alloc(tensor.I64, 3)
	for {
		if err := c.Broadcast(ctl, 0); err != nil {
			return err
		}
		raw, _ := read(b, ctl)
		v := make([]int64, 3)
		for i := range v {
			v[i] = int64(le64(raw[8*i:]))
		}
		if v[0] == 0 {
			return w.Close()
		}
		if err := benchOp(c, int(v[0]), int(v[1]), int(v[2])); err != nil {
			return err
		}
	}
}

func le64(b []byte) uint64 {
	var x uint64
	for i := 7; i >= 0; i-- {
		x = x<<8 | uint64(b[i])
	}
	return x
}

const (
	benchAllReduce = 1
	benchAllToAll  = 2
)

func benchOp(c comm.Communicator, op, numel, iters int) error {
	b := c.Backend()
	x, err := b.Alloc(tensor.F32, numel)
	if err != nil {
		return err
	}
	defer b.Free(x)
	y, err := b.Alloc(tensor.F32, numel)
	if err != nil {
		return err
	}
	defer b.Free(y)
	n := c.Size()
	counts := make([]int, n)
	for i := range counts {
		counts[i] = numel / n
	}
	for range iters {
		switch op {
		case benchAllReduce:
			err = c.AllReduce(x, comm.Sum)
		case benchAllToAll:
			err = c.AllToAll(y, x, counts, counts, comm.Dispatch)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkTwoProcesses reports the all-reduce and all-to-all bandwidth between this process
// (node 0, one rank) and a second process (one rank) over localhost; bytes/s is the tensor
// size of one rank per call.
func BenchmarkTwoProcesses(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
	cmd.Env = append(os.Environ(), "HALO_TCP_CHILD=bench", "TCP_NNODES=2", "TCP_NODE=1",
		"TCP_ADDR="+ln.Addr().String(), "TCP_RANKS=1", "TCP_TIMEOUT=60s")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	be := cpu.New(cpu.Options{Workers: 1})
	w, err := Join(context.Background(), Config{
		Rendezvous:         rendezvous.Config{NNodes: 2, NodeRank: 0, Addr: ln.Addr().String(), Token: "multi-process-secret", Timeout: 20 * time.Second},
		Listen:             "127.0.0.1:0",
		Timeout:            60 * time.Second,
		RendezvousListener: ln,
	}, cpuBackendsOf(be))
	if err != nil {
		cmd.Wait()
		b.Fatalf("%v\npeer: %s", err, out.String())
	}
	c := w.Comm(0)
	ctl, _ := be.Alloc(tensor.I64, 3)
	command := func(op, numel, iters int) error {
		raw := make([]byte, 0, 24)
		for _, v := range []int{op, numel, iters} {
			for i := range 8 {
				raw = append(raw, byte(uint64(v)>>(8*i)))
			}
		}
		if err := be.Upload(ctl, raw); err != nil {
			return err
		}
		return c.Broadcast(ctl, 0)
	}
	for _, tc := range []struct {
		name string
		op   int
	}{{"all_reduce", benchAllReduce}, {"all_to_all", benchAllToAll}} {
		for _, mib := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("%s/%dMiB", tc.name, mib), func(b *testing.B) {
				numel := mib << 20 / 4
				b.SetBytes(int64(numel) * 4)
				if err := command(tc.op, numel, b.N); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				if err := benchOp(c, tc.op, numel, b.N); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
	if err := command(0, 0, 0); err != nil {
		b.Fatal(err)
	}
	w.Close()
	if err := cmd.Wait(); err != nil {
		b.Fatalf("peer: %v\n%s", err, out.String())
	}
}
