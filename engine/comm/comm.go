// Package comm is the collective-communication layer of the engine: the Communicator interface
// (all-reduce, all-gather, reduce-scatter, uneven all-to-all, broadcast, send/recv, barrier) over
// backend tensors, and an in-process implementation for N logical devices driven by N goroutines
// of one process (the CPU simulation of a multi-device run).
//
// The in-process communicator moves real data: each rank downloads its operand from its own
// backend into a host buffer shared with its group, the ranks meet at a rendezvous, and each
// uploads its result. Reductions add the contributions in rank order in float64 and round once
// to the tensor's dtype, so every rank gets bit-identical results and a run is bit-reproducible.
// Every collective is recorded (kind, bytes, group, duration) in the communicator's Stats and,
// when a Recorder is set (engine/profile's *Recorder is one), as a collective span.
//
// It is not the NCCL communicator (that one drives GPUs and lives beside this one) and it does
// not decide which ranks talk to which: engine/mesh builds the groups and engine/parallel issues
// the collectives.
//
// # Goroutines
//
// A Communicator value belongs to one rank and is called from the goroutine that owns that
// rank's backend. Every rank of a group must call the same collectives in the same order with
// compatible operands; a mismatch that can be seen (different kinds or sizes) is reported as an
// error on every rank, while a rank that never arrives blocks the others (as NCCL does).
package comm

import (
	"fmt"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// T is a tensor on the rank's backend.
type T = tensor.Tensor

// ReduceOp is the reduction of AllReduce and ReduceScatter.
type ReduceOp uint8

const (
	// Sum adds the contributions of every rank.
	Sum ReduceOp = iota
	// Avg adds them and divides by the group size.
	Avg
)

func (o ReduceOp) String() string {
	switch o {
	case Sum:
		return "sum"
	case Avg:
		return "avg"
	}
	return fmt.Sprintf("ReduceOp(%d)", uint8(o))
}

// Collective kinds, as recorded in Stats and in profile spans (the same strings as
// engine/profile's Comm* constants).
const (
	KindAllReduce        = "all_reduce"
	KindAllGather        = "all_gather"
	KindReduceScatter    = "reduce_scatter"
	KindAllToAllDispatch = "all_to_all_dispatch"
	KindAllToAllCombine  = "all_to_all_combine"
	KindBroadcast        = "broadcast"
	KindP2P              = "p2p"
	KindBarrier          = "barrier"
)

// Phase labels an all-to-all for the profile: token dispatch to experts or the combine back.
type Phase uint8

const (
	Dispatch Phase = iota
	Combine
)

func (p Phase) kind() string {
	if p == Combine {
		return KindAllToAllCombine
	}
	return KindAllToAllDispatch
}

// Communicator is one rank's handle on a group of ranks. Tensors live on the rank's backend.
type Communicator interface {
	// Rank is this rank's index in the group, 0 <= Rank < Size.
	Rank() int
	// Size is the number of ranks in the group.
	Size() int
	// Group names the group (e.g. "world", "tp0", "dp1"); it labels recorded collectives.
	Group() string
	// Backend is the device this rank's tensors live on.
	Backend() backend.Backend

	// AllReduce replaces t on every rank by the reduction over ranks of t (float dtypes).
	AllReduce(t T, op ReduceOp) error
	// AllGather sets dst (Size*numel(src) elements) to the concatenation of every rank's src
	// in rank order. src and dst have the same dtype; any dtype.
	AllGather(dst, src T) error
	// ReduceScatter sets dst (numel(src)/Size elements) on rank r to the reduction over ranks of
	// the r-th of Size equal parts of src (float dtypes).
	ReduceScatter(dst, src T, op ReduceOp) error
	// AllToAll exchanges rows (the outermost dimension): src holds send[j] rows for rank j, in
	// rank order; dst receives recv[i] rows from rank i, in rank order. Row widths and dtypes
	// must agree across ranks and recv[i] must equal rank i's send[Rank()]. phase labels the
	// exchange for the profile.
	AllToAll(dst, src T, send, recv []int, phase Phase) error
	// Broadcast copies root's t into t on every other rank.
	Broadcast(t T, root int) error
	// Send gives t's contents to rank peer, which must call Recv with a tensor of the same byte
	// size. Send does not wait for the receiver (up to a bounded number of messages in flight).
	Send(t T, peer int) error
	// Recv fills t with the next message rank peer sent to this rank.
	Recv(t T, peer int) error
	// Barrier returns once every rank of the group has called it.
	Barrier() error

	// Stats returns the totals of every collective this rank has run, by kind.
	Stats() Stats
	// SetRecorder makes every later collective also a span of r (nil turns it off).
	SetRecorder(r Recorder)
}

// Recorder receives collective spans; engine/profile's *Recorder implements it.
type Recorder interface {
	Collective(kind, group string, bytes int64, fn func() error) error
}

// KindStats are the totals of one collective kind.
type KindStats struct {
	Calls int
	Bytes int64         // bytes of this rank's operand (what it contributes), summed
	Time  time.Duration // wall time inside the collective, waiting included
}

// Stats maps a collective kind to its totals on one rank.
type Stats map[string]KindStats

// Total sums every kind.
func (s Stats) Total() KindStats {
	var t KindStats
	for _, k := range s {
		t.Calls += k.Calls
		t.Bytes += k.Bytes
		t.Time += k.Time
	}
	return t
}
