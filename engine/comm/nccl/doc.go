// Package nccl is the GPU implementation of engine/comm's Communicator: NCCL (libnccl.so.2)
// loaded at run time through purego, so the binary is built with CGO_ENABLED=0 and still runs,
// and says why it cannot use NCCL, on machines without a GPU or without the library.
//
// One process drives all GPUs of its node, one goroutine per GPU (engine/backend/cuda's Device,
// locked to its OS thread); every NCCL call for a rank runs on that rank's device goroutine.
// NewLocalWorld builds one communicator per local GPU; NewNodeWorld does the same for the GPUs of
// one node of a multi-node world, from an NCCL unique id that node 0 made (NewUniqueID) and that
// engine/comm/rendezvous carried to every node. World.Split makes the communicators of mesh groups
// (ncclCommSplit), with the same partition rules as the in-process comm.World.Split.
//
// Collectives are enqueued on the device's own compute stream (cuda.Device.StreamOnThread, from
// the device goroutine), the stream every kernel and copy of the rank is queued on, so a
// collective sees every op enqueued before it and every op enqueued after it sees its result,
// ordered by the stream alone. Each collective is bracketed by two CUDA events on the
// device's stream and waits for the second: its Stats time and its profile span are the GPU time
// the events measured, and the host returns only once the data has arrived. (Overlapping
// communication with compute needs a stream of its own; that is not done yet.) All-to-all with
// uneven splits, Send and Recv are ncclSend/ncclRecv pairs inside ncclGroupStart/End.
//
// Send and Recv differ from the in-process communicator in one way that matters: an NCCL send
// does not complete until the peer posts the matching receive, and each rank's calls run in
// order on one stream. A ring of Send-then-Recv on every rank therefore deadlocks; exchange data
// between pairs with AllToAll (one grouped call) instead.
//
// Before the first communicator is made, the package sets NCCL_NVLS_ENABLE=0 in the process
// environment unless the user set it (NVLink multicast stays off on shared machines).
//
// Library discovery: HALO_LIBNCCL naming the file, else the directories of LD_LIBRARY_PATH, else
// the standard places (/lib/x86_64-linux-gnu, /usr/lib/x86_64-linux-gnu, /usr/local/cuda/lib64,
// ...), else a Python site-packages holding PyTorch (site-packages/nvidia/nccl/lib), else the
// dynamic loader's own search by soname. NCCL 2.18 or newer is required (ncclCommSplit, ncclAvg,
// bfloat16).
//
// What it is not: it does not decide which ranks form which group (engine/mesh and
// engine/parallel do) and it does not find the other nodes (engine/comm/rendezvous does).
package nccl
