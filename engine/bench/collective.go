package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/backend/cuda"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/comm/nccl"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// The collectives MeasureCollective times (the names are the comm kinds; all_to_all is an
// even exchange recorded as a dispatch).
const (
	OpAllReduce     = comm.KindAllReduce
	OpReduceScatter = comm.KindReduceScatter
	OpAllGather     = comm.KindAllGather
	OpAllToAll      = "all_to_all"
)

// CollectiveOps lists the collectives MeasureCollective knows.
func CollectiveOps() []string {
	return []string{OpAllReduce, OpAllGather, OpAllToAll, OpReduceScatter}
}

// IsCollective reports whether op is one of CollectiveOps.
func IsCollective(op string) bool { return slices.Contains(CollectiveOps(), op) }

// BusFactor is what a ring (or any bandwidth-optimal) implementation sends through each
// rank's link per byte of the buffer: 2(n-1)/n for all-reduce (a reduce-scatter then an
// all-gather), (n-1)/n for the others. Bus bandwidth is algorithm bandwidth times it, the
// figure nccl-tests reports, comparable across collectives and rank counts.
func BusFactor(op string, ranks int) float64 {
	if ranks <= 1 {
		return 0
	}
	f := float64(ranks-1) / float64(ranks)
	if op == OpAllReduce {
		return 2 * f
	}
	return f
}

// CollectiveRequest is one collective timing over Ranks devices.
type CollectiveRequest struct {
	Op string
	// Bytes is the buffer S, as nccl-tests counts it: the all-reduce operand, the
	// reduce-scatter input and all-gather output (each rank holds S/Ranks of the other
	// side), each rank's all-to-all send buffer (S/Ranks to every rank). Rounded down to
	// whole elements that split evenly over the ranks.
	Bytes int64
	Ranks int
	// Device is "cpu" (Ranks simulated devices in this process, the in-process
	// communicator) or "cuda" (GPUs 0 .. Ranks-1 through NCCL).
	Device string
	DType  tensor.DType // F32 (the default) or BF16
	// Repeats, MinSample and MaxTotal are as in OpRequest.
	Repeats   int
	MinSample time.Duration
	MaxTotal  time.Duration
}

// CollectiveResult is a collective's time, per call.
type CollectiveResult struct {
	Devices      string // e.g. "cpu:4 (simulated)", "cuda:0-1"
	Op           string
	Ranks        int
	DType        tensor.DType
	Bytes        int64           // S, after rounding
	Samples      []time.Duration // per call, the slowest rank's
	Median       time.Duration
	OpsPerSample int
	// WireBytes is what each rank sends through its link per call in a bandwidth-optimal
	// implementation: BusFactor · S.
	WireBytes float64
}

// AlgGBps is S per median time (GB/s); BusGBps WireBytes per median time.
func (r CollectiveResult) AlgGBps() float64 {
	if r.Median <= 0 {
		return 0
	}
	return float64(r.Bytes) / r.Median.Seconds() / 1e9
}

// BusGBps is the bus bandwidth: WireBytes per median time, GB/s.
func (r CollectiveResult) BusGBps() float64 {
	if r.Median <= 0 {
		return 0
	}
	return r.WireBytes / r.Median.Seconds() / 1e9
}

// maxCollectiveRanks bounds Ranks.
const maxCollectiveRanks = 64

// MeasureCollective opens Ranks devices, joins them in one world, times the collective on
// every rank at once (one goroutine per rank, locked to its OS thread) and closes them. A
// sample is OpsPerSample calls between two barriers, each rank synchronising its device at
// the end; its time is the slowest rank's. The caller's goroutine only coordinates.
func MeasureCollective(ctx context.Context, r CollectiveRequest) (CollectiveResult, error) {
	if !IsCollective(r.Op) {
		return CollectiveResult{}, badOp("unknown collective %q (known: %s)", r.Op, strings.Join(CollectiveOps(), ", "))
	}
	if r.Ranks < 2 || r.Ranks > maxCollectiveRanks {
		return CollectiveResult{}, badOp("%s: ranks = %d: want 2 .. %d devices", r.Op, r.Ranks, maxCollectiveRanks)
	}
	if r.DType == tensor.Invalid {
		r.DType = tensor.F32
	}
	if r.DType != tensor.F32 && r.DType != tensor.BF16 {
		return CollectiveResult{}, badOp("%s: dtype %s: want f32 or bf16", r.Op, r.DType)
	}
	es := int64(r.DType.Size())
	numel := r.Bytes / es / int64(r.Ranks) * int64(r.Ranks)
	if numel <= 0 {
		return CollectiveResult{}, badOp("%s: %d bytes over %d ranks: want at least %d bytes (one %s element per rank)", r.Op, r.Bytes, r.Ranks, es*int64(r.Ranks), r.DType)
	}
	if numel*es > MaxOpBytes/4 {
		return CollectiveResult{}, badOp("%s: %d bytes: want at most %s per rank", r.Op, r.Bytes, humanBytes(MaxOpBytes/4))
	}
	if r.Repeats <= 0 {
		r.Repeats = 5
	}
	r.Repeats = min(r.Repeats, 1000)
	if r.MinSample <= 0 {
		r.MinSample = 10 * time.Millisecond
	}
	if r.MaxTotal <= 0 {
		r.MaxTotal = 2 * time.Second
	}
	devs, fabric, name, err := openWorld(r.Device, r.Ranks)
	if err != nil {
		return CollectiveResult{}, err
	}
	res := CollectiveResult{Devices: name, Op: r.Op, Ranks: r.Ranks, DType: r.DType, Bytes: numel * es,
		WireBytes: BusFactor(r.Op, r.Ranks) * float64(numel*es)}

	// One goroutine per rank runs batches of calls on order.
	type batch struct{ n int }
	type done struct {
		d   time.Duration
		err error
	}
	orders := make([]chan batch, r.Ranks)
	results := make(chan done, r.Ranks)
	ready := make(chan error, r.Ranks)
	for i := range orders {
		orders[i] = make(chan batch)
	}
	// Stop the ranks, wait for them to free their operands, then close the world and the
	// devices.
	var wg sync.WaitGroup
	defer func() {
		for _, o := range orders {
			close(o)
		}
		wg.Wait()
		_ = fabric.Close()
		for _, b := range devs {
			_ = b.Close()
		}
	}()
	for rank := range r.Ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			c := fabric.Comm(rank)
			call, free, err := collectiveCall(c, r.Op, r.DType, numel)
			ready <- err
			if err != nil {
				return
			}
			defer free()
			for o := range orders[rank] {
				d, err := func() (time.Duration, error) {
					if err := c.Barrier(); err != nil {
						return 0, err
					}
					start := time.Now()
					for range o.n {
						if err := call(); err != nil {
							return 0, err
						}
					}
					if err := c.Backend().Sync(); err != nil {
						return 0, err
					}
					if err := c.Barrier(); err != nil {
						return 0, err
					}
					return time.Since(start), nil
				}()
				if err != nil {
					fabric.Abort(err)
				}
				results <- done{d, err}
			}
		}()
	}
	var setup []error
	for range r.Ranks {
		if err := <-ready; err != nil {
			setup = append(setup, err)
		}
	}
	if len(setup) > 0 {
		fabric.Abort(errors.Join(setup...))
		return CollectiveResult{}, fmt.Errorf("bench: %s over %s: %w", r.Op, name, errors.Join(setup...))
	}
	run := func(n int) (time.Duration, error) {
		for _, o := range orders {
			o <- batch{n}
		}
		var slowest time.Duration
		var errs []error
		for range r.Ranks {
			d := <-results
			if d.err != nil {
				errs = append(errs, d.err)
			}
			slowest = max(slowest, d.d)
		}
		if len(errs) > 0 {
			return 0, fmt.Errorf("bench: %s over %s: %w", r.Op, name, errs[0])
		}
		return slowest / time.Duration(n), nil
	}
	// Warm up once, then calibrate the calls per sample as MeasureOp does.
	if _, err := run(1); err != nil {
		return CollectiveResult{}, err
	}
	n := 1
	one, err := run(n)
	if err != nil {
		return CollectiveResult{}, err
	}
	for round := 0; one*time.Duration(n) < r.MinSample && n < maxOpsPerSample && round < 4; round++ {
		n = min(maxOpsPerSample, max(2*n, int(r.MinSample/max(one, time.Nanosecond))+1))
		if one, err = run(n); err != nil {
			return CollectiveResult{}, err
		}
	}
	repeats := r.Repeats
	if per := one * time.Duration(n); per > 0 {
		repeats = max(1, min(repeats, int(r.MaxTotal/per)))
	}
	res.OpsPerSample = n
	for range repeats {
		if err := ctx.Err(); err != nil {
			return CollectiveResult{}, fmt.Errorf("bench: %s: %w", r.Op, err)
		}
		d, err := run(n)
		if err != nil {
			return CollectiveResult{}, err
		}
		res.Samples = append(res.Samples, d)
	}
	s := slices.Clone(res.Samples)
	slices.Sort(s)
	res.Median = s[len(s)/2]
	if len(s)%2 == 0 {
		res.Median = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return res, nil
}

// openWorld opens ranks devices of kind device and their world.
func openWorld(device string, ranks int) ([]backend.Backend, comm.Fabric, string, error) {
	switch device {
	case "", "cpu":
		devs := make([]backend.Backend, ranks)
		for i := range devs {
			// One worker each, as a simulated device of a parallel plan has.
			devs[i] = cpu.New(cpu.Options{Workers: 1})
		}
		w, err := comm.NewWorld(devs)
		if err != nil {
			return nil, nil, "", fmt.Errorf("bench: %w", err)
		}
		return devs, w.Fabric(), fmt.Sprintf("cpu:%d (simulated)", ranks), nil
	case "cuda":
		if have := cuda.DeviceCount(); have < ranks {
			return nil, nil, "", badOp("%d GPUs asked, %d present: measure on simulated devices (device cpu) or fewer ranks", ranks, have)
		}
		var devs []backend.Backend
		var gpus []*cuda.Backend
		closeAll := func() {
			for _, b := range devs {
				_ = b.Close()
			}
		}
		for i := range ranks {
			b, err := backend.Open(fmt.Sprintf("cuda:%d", i))
			if err != nil {
				closeAll()
				return nil, nil, "", fmt.Errorf("bench: %w", err)
			}
			devs = append(devs, b)
			g, ok := b.(*cuda.Backend)
			if !ok {
				closeAll()
				return nil, nil, "", fmt.Errorf("bench: cuda:%d opened as %T, not a CUDA backend", i, b)
			}
			gpus = append(gpus, g)
		}
		w, err := nccl.NewLocalWorld(gpus)
		if err != nil {
			closeAll()
			return nil, nil, "", fmt.Errorf("bench: %w", err)
		}
		return devs, w.Fabric(), fmt.Sprintf("cuda:0-%d", ranks-1), nil
	}
	return nil, nil, "", badOp("collective device %q: want cpu (simulated devices) or cuda", device)
}

// collectiveCall allocates one rank's operands and returns the call and what frees them.
func collectiveCall(c comm.Communicator, op string, dt tensor.DType, numel int64) (func() error, func(), error) {
	b := c.Backend()
	var ts []tensor.Tensor
	free := func() {
		for _, t := range ts {
			_ = b.Free(t)
		}
	}
	alloc := func(n int64) (tensor.Tensor, error) {
		t, err := b.Alloc(dt, int(n))
		if err != nil {
			return t, err
		}
		ts = append(ts, t)
		return t, b.Fill(t, 0.5)
	}
	n := int64(c.Size())
	var call func() error
	var err error
	switch op {
	case OpAllReduce:
		var x tensor.Tensor
		if x, err = alloc(numel); err == nil {
			call = func() error { return c.AllReduce(x, comm.Sum) }
		}
	case OpReduceScatter, OpAllGather:
		var big, part tensor.Tensor
		if big, err = alloc(numel); err == nil {
			if part, err = alloc(numel / n); err == nil {
				if op == OpReduceScatter {
					call = func() error { return c.ReduceScatter(part, big, comm.Sum) }
				} else {
					call = func() error { return c.AllGather(big, part) }
				}
			}
		}
	case OpAllToAll:
		var src, dst tensor.Tensor
		if src, err = alloc(numel); err == nil {
			if dst, err = alloc(numel); err == nil {
				src, _ = src.Reshape(int(numel), 1)
				dst, _ = dst.Reshape(int(numel), 1)
				counts := make([]int, n)
				for i := range counts {
					counts[i] = int(numel / n)
				}
				call = func() error { return c.AllToAll(dst, src, counts, counts, comm.Dispatch) }
			}
		}
	default:
		err = badOp("unknown collective %q", op)
	}
	if err != nil {
		free()
		return nil, nil, fmt.Errorf("rank %d: %w", c.Rank(), err)
	}
	return call, free, nil
}
