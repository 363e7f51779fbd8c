// Package tcp is a collective communicator (comm.Communicator, and comm.Fabric for splitting
// groups) whose ranks live in different processes, connected by TCP. Each process drives one
// or more ranks on CPU backends, one goroutine per rank as with the in-process communicator.
// It is for multi-process CPU runs and for testing plans that drive only their process's local
// ranks on a machine without GPUs.
//
// It is not for GPUs (engine/comm/nccl does that) and it is not fast: every collective moves
// whole tensors through host memory and the kernel's TCP stack, with no pipelining, no rings
// and no compression. Its aim is the same results as comm.World, bit for bit.
//
// # Use
//
// Every process calls Join with the same rendezvous settings (node count, node 0's address,
// token) and its own node rank and backends, then uses World.Comm, World.Split or
// World.Fabric as it would use comm.World, and calls Close at the end:
//
//	w, err := tcp.Join(ctx, tcp.Config{Rendezvous: rendezvous.Config{NNodes: 2, NodeRank: r,
//		Addr: "host0:29500", Token: secret}}, backends)
//	...
//	defer w.Close()
//
// Global ranks are numbered process by process: process p's local rank i is global rank
// w.FirstRank()+i. Close tells the other processes that this one is done and waits (at most
// ten seconds) for them to close too; a process that exits without Close looks like a crash
// to the others.
//
// # Semantics
//
// Every collective gives the bits the in-process communicator (engine/comm) gives on the same
// inputs: reductions add the contributions in rank order in float64 and round once to the
// tensor's dtype. All-reduce is a reduce-scatter (rank r reduces part r of every rank's tensor,
// parts split as comm.World splits them) followed by an all-gather of the reduced parts;
// reduce-scatter, all-gather, uneven all-to-all and the barrier are one exchange in which every
// rank sends to every other; a broadcast first exchanges every rank's root and size, then the
// root sends its tensor. Send returns once the message is on its way, with at most MaxInFlight
// messages from one rank to another not yet received (beyond that Send waits). Stats and
// SetRecorder record the same kinds, groups and byte counts as the in-process communicator.
//
// # Connections
//
// The processes form a full mesh of TCP connections, one per pair of processes rather than per
// pair of ranks: ranks of one process exchange frames through memory, a process with several
// ranks needs no more sockets than one with a single rank, and the frames of every group and
// rank share the connection, tagged with group, sender, receiver, collective kind, step and
// sequence number. Every process connects to every lower-numbered one and accepts the higher
// ones. Addresses come from engine/comm/rendezvous (rendezvous.JoinAt announces where a
// process listens); connections are authenticated with an HMAC of a random challenge under the
// rendezvous token and a world id node 0 chose, so a connection from another run or without the
// token is refused. Nothing is encrypted.
//
// # Failures
//
// Every wait is bounded by Config.Timeout. A peer process whose connection ends (it exited or
// crashed), a timeout, or frames that do not fit the collective being run (another sequence
// number, kind, step or group) abort the world on every process that can still be told: each
// pending and later collective fails with an error naming the peer rank, its process and the
// collective, and saying what to do. A rank whose arguments are wrong, or whose peers disagree
// on sizes, dtypes, counts or the broadcast root, still takes part with error frames, so every
// rank of the group returns an error promptly and the world stays usable (as with the
// in-process communicator). Unlike it, ranks that call different collectives abort the world.
//
// # Goroutines
//
// A Comm belongs to one rank and is called from that rank's goroutine. One reader goroutine
// per connection files incoming frames into per-stream queues; it never blocks on a rank, so a
// rank that is slow to arrive never stalls the others' traffic. Every process must call Split
// with the same groups in the same order, as with NCCL.
package tcp
