package main

import (
	"context"
	"fmt"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/comm/tcp"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// tcpCheck is what `run rendezvous --tcp` reports: the nodes joined a world of one CPU rank
// each over TCP, an all-reduce gave the right sum everywhere, and the bandwidth of all-reduces
// of a larger tensor.
type tcpCheck struct {
	Ranks         int     `json:"ranks"`
	SumOK         bool    `json:"all_reduce_sum_ok"`
	Bytes         int64   `json:"bandwidth_bytes"`
	Iterations    int     `json:"bandwidth_iterations"`
	AllReduceMBps float64 `json:"all_reduce_mb_per_s"`
}

// tcpCheckBytes and tcpCheckIters size the bandwidth measurement of --tcp.
const (
	tcpCheckBytes = 16 << 20
	tcpCheckIters = 5
)

// joinTCP joins a TCP world of one CPU rank on this node and runs the check. Every node runs
// the same collectives in the same order.
func joinTCP(ctx context.Context, cfg tcp.Config) (tcpCheck, error) {
	b := cpu.New(cpu.Options{})
	defer b.Close()
	w, err := tcp.Join(ctx, cfg, []backend.Backend{b})
	if err != nil {
		return tcpCheck{}, err
	}
	res, err := runTCPCheck(w.Comm(0))
	if err != nil {
		w.Abort(err)
	}
	if cerr := w.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("rendezvous --tcp: closing the world: %w", cerr)
	}
	return res, err
}

// runTCPCheck all-reduces rank+1 (every rank must get n(n+1)/2), then times all-reduces of
// tcpCheckBytes of f32.
func runTCPCheck(c comm.Communicator) (tcpCheck, error) {
	b := c.Backend()
	n := c.Size()
	res := tcpCheck{Ranks: n, Bytes: tcpCheckBytes, Iterations: tcpCheckIters}
	one, err := backend.FromFloat32(b, []float32{float32(c.Rank() + 1)}, tensor.F32, 1)
	if err != nil {
		return res, err
	}
	defer b.Free(one)
	if err := c.AllReduce(one, comm.Sum); err != nil {
		return res, fmt.Errorf("rendezvous --tcp: all-reduce check: %w", err)
	}
	got, err := backend.ToFloat32(b, one)
	if err != nil {
		return res, err
	}
	if want := float32(n * (n + 1) / 2); got[0] != want {
		return res, fmt.Errorf("rendezvous --tcp: the all-reduce of rank+1 over %d ranks gave %v, want %v", n, got[0], want)
	}
	res.SumOK = true
	big, err := b.Alloc(tensor.F32, tcpCheckBytes/4)
	if err != nil {
		return res, err
	}
	defer b.Free(big)
	if err := b.Fill(big, 1); err != nil {
		return res, err
	}
	start := time.Now()
	for i := 0; i < tcpCheckIters; i++ {
		if err := c.AllReduce(big, comm.Sum); err != nil {
			return res, fmt.Errorf("rendezvous --tcp: bandwidth all-reduce %d: %w", i+1, err)
		}
	}
	res.AllReduceMBps = float64(tcpCheckBytes) * tcpCheckIters / time.Since(start).Seconds() / 1e6
	return res, nil
}
