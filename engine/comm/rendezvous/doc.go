// Package rendezvous lets the processes of a multi-node run find each other and agree on one
// world before any collective runs: node 0 runs a small TCP server, every other node connects to
// it, each node reports its node rank, its local device count and its host name, and once all
// nodes have arrived node 0 sends every node the same world description together with a payload
// of its choosing (the NCCL unique id that lets the GPUs of every node build one NCCL
// communicator).
//
// Authentication is by a shared secret (flag, environment or file). The secret never crosses
// the wire: node 0 sends each connection a fresh random challenge and the node answers with an
// HMAC-SHA256 of it under the secret, which node 0 checks in constant time. The connection is
// not encrypted; the payload (an NCCL unique id) is not secret, only who may join is.
//
// Every wait is bounded (Config.Timeout). Node 0 refuses a wrong secret, a node rank outside the
// world, a rank that is already taken and a node that disagrees on the world size, each with a
// message naming the problem that the refused node prints; when the time is up it names the
// ranks that never arrived, and a node that disconnects before the world is complete fails the
// rendezvous for everyone with a message naming it.
//
// JoinAt also lets each node announce where it accepts connections from the other nodes
// (Node.Addr), for communicators that connect every node to every other (engine/comm/tcp).
//
// ResolveConfig turns command-line flags and the usual SLURM variables (SLURM_NNODES,
// SLURM_NODEID, SLURM_PROCID, SLURM_JOB_NODELIST) into one Config, flags winning over the
// environment.
//
// What it is not: it moves no tensors and builds no communicator (engine/comm/nccl does, from
// the payload), and it does not start processes on other nodes (a scheduler such as SLURM, or the
// user, does).
package rendezvous
