package train

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/comm/nccl"
	"github.com/halo-shell/halo-shell/engine/comm/rendezvous"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/parallel"
	"github.com/halo-shell/halo-shell/engine/profile"
)

// gpuNodeOps is how a node of a run across nodes on GPUs reaches its GPUs and NCCL.
// NewOnNodes uses realGPUNodeOps; the package's tests put CPU devices and an in-process
// world in their place to check the wiring on machines without GPUs.
type gpuNodeOps struct {
	// open opens GPU id as rank r of this node, wrapped for profiling with recs[r].
	open func(id int, recs []*profile.Recorder, r int) (backend.Backend, error)
	// ready reports whether NCCL loads and a GPU can be used; the error says what is missing.
	ready func() error
	// newID makes the NCCL unique id of the world (node 0 only).
	newID func() (nccl.UniqueID, error)
	// world joins this node's GPUs devs (global ranks first..first+len(devs)-1) to the NCCL
	// world of size ranks named by id; local names the node's devices for errors.
	world func(local mesh.Devices, devs []backend.Backend, id nccl.UniqueID, size, first int) (comm.Fabric, error)
}

// realGPUNodeOps opens CUDA devices and makes NCCL communicators.
func realGPUNodeOps() gpuNodeOps {
	return gpuNodeOps{
		open: func(id int, recs []*profile.Recorder, r int) (backend.Backend, error) {
			return openRank("cuda", id, recs, r)
		},
		ready: nccl.Available,
		newID: nccl.NewUniqueID,
		world: ncclNodeWorld,
	}
}

// ncclNodeWorld is gpuNodeOps.world over real GPUs: nccl.NewNodeWorld.
func ncclNodeWorld(local mesh.Devices, devs []backend.Backend, id nccl.UniqueID, size, first int) (comm.Fabric, error) {
	gpus, err := cudaBackends(local, devs)
	if err != nil {
		return nil, err
	}
	w, err := nccl.NewNodeWorld(gpus, id, size, first)
	if err != nil {
		return nil, fmt.Errorf("train: devices %s, ranks %d..%d of %d: %w", local, first, first+len(devs)-1, size, err)
	}
	return w.Fabric(), nil
}

// startGPUNodePlan is startNodePlan on GPUs: it opens this node's GPUs, checks NCCL, runs the
// rendezvous (node 0's payload is the NCCL unique id; each node reports the GPUs it can use,
// 0 when it cannot take part), checks that every node can and has as many GPUs as node 0,
// joins one NCCL world of every node's GPUs, checks that the nodes' configs agree
// (checkAgreement) and builds this node's share of the plan over that world.
func (t *Trainer) startGPUNodePlan(d mesh.Devices, l mesh.Layout) error {
	rc, ops := t.nodes.rc, t.nodes.gpu
	local, _, err := t.Cfg.Parallel.Resolve()
	if err != nil {
		return fmt.Errorf("train: devices: %w", err)
	}
	k := local.Len()
	recs := make([]*profile.Recorder, k)
	devs := make([]backend.Backend, 0, k)
	closeDevs := func() {
		for _, b := range devs {
			_ = b.Close()
		}
	}
	// What keeps this node out; the other nodes learn of it as a count of 0 GPUs.
	var cannot error
	for i, id := range local.IDs {
		b, err := ops.open(id, recs, i)
		if err == nil {
			if err = capMemory(b, t.Cfg.Run.MaxDeviceMemoryGiB); err != nil {
				_ = b.Close()
			}
		}
		if err != nil {
			cannot = fmt.Errorf("opening cuda:%d: %w", id, err)
			break
		}
		devs = append(devs, b)
	}
	if cannot == nil {
		if err := ops.ready(); err != nil {
			cannot = fmt.Errorf("NCCL: %w", err)
		}
	}
	var payload []byte
	if cannot == nil && rc.NodeRank == 0 {
		id, err := ops.newID()
		if err != nil {
			cannot = fmt.Errorf("making the NCCL unique id: %w", err)
		} else {
			payload = id.Internal[:]
		}
	}
	report := k
	if cannot != nil {
		report = 0
	}
	w, err := rendezvous.Join(t.nodes.ctx, rc, report, payload)
	if cannot != nil {
		closeDevs()
		if err != nil {
			return fmt.Errorf("train: node %d of %d cannot train on its GPUs (%s): %w (and the rendezvous failed too: %v)", rc.NodeRank, rc.NNodes, local, cannot, err)
		}
		return fmt.Errorf("train: node %d of %d cannot train on its GPUs (%s): %w; the other nodes were told and stop too", rc.NodeRank, rc.NNodes, local, cannot)
	}
	if err != nil {
		closeDevs()
		return fmt.Errorf("train: joining the other nodes: %w", err)
	}
	id, err := gpuWorldID(w, rc.NodeRank, k)
	if err != nil {
		closeDevs()
		return err
	}
	size, first := w.Devices(), w.FirstRank(rc.NodeRank)
	if size != d.Len() {
		closeDevs()
		return fmt.Errorf("train: the nodes have %d GPUs in all and this node's config makes a mesh of %d: give every node the same number of devices", size, d.Len())
	}
	fab, err := joinWorldWithin(t.nodes.ctx, worldWait(rc), ops, local, devs, id, size, first)
	if errors.Is(err, errWorldNotFormed) {
		// The GPUs may still be held by the NCCL setup that did not return: they are left
		// open (closing them would wait on it); the process is expected to exit.
		return fmt.Errorf("train: node %d of %d: %w", rc.NodeRank, rc.NNodes, err)
	}
	if err != nil {
		closeDevs()
		return err
	}
	if err := checkAgreement(fab, devs, t.agreement(d, l), k, rc.NNodes); err != nil {
		_ = fab.Close()
		closeDevs()
		return err
	}
	o := parallel.Options{Optimizer: optimConfig(t.Cfg), Local: &parallel.LocalRanks{First: first, Count: k}}
	o.Optimizer.WeightDecay = t.hyper.WeightDecay
	// The plan takes the devices and the world when it asks for them, and closes them on its
	// errors from then on.
	handedDevs, handedWorld := false, false
	o.NewBackend = func(r int) (backend.Backend, error) {
		handedDevs = true
		return devs[r-first], nil
	}
	o.World = func([]backend.Backend) (comm.Fabric, error) {
		handedWorld = true
		return fab, nil
	}
	p, err := parallel.New(t.model, d, l, o)
	if err != nil {
		if !handedWorld {
			_ = fab.Close()
		}
		if !handedDevs {
			closeDevs()
		}
		return fmt.Errorf("train: layout %s on %d GPUs across %d nodes: %w", l, d.Len(), rc.NNodes, err)
	}
	return t.adoptNodePlan(p, d, l, recs, devs)
}

// gpuWorldID checks the world a rendezvous of GPU nodes agreed on from node self's side
// (which has k GPUs): every node can train on its GPUs (a node that cannot reports 0), every
// node has as many as node 0, and node 0's payload is an NCCL unique id. It returns the id.
func gpuWorldID(w rendezvous.World, self, k int) (nccl.UniqueID, error) {
	var id nccl.UniqueID
	if len(w.Nodes) == 0 {
		return id, errors.New("train: the rendezvous returned no nodes")
	}
	name := func(n rendezvous.Node) string {
		if n.Host == "" {
			return fmt.Sprintf("node %d", n.Rank)
		}
		return fmt.Sprintf("node %d (%s)", n.Rank, n.Host)
	}
	var out []error
	for _, n := range w.Nodes {
		if n.Devices == 0 {
			out = append(out, fmt.Errorf("%s cannot train on its GPUs (it could not open them or load NCCL; its own error says which)", name(n)))
		}
	}
	if len(out) > 0 {
		return id, fmt.Errorf("train: %w", errors.Join(out...))
	}
	n0 := w.Nodes[0]
	for _, n := range w.Nodes[1:] {
		if n.Devices != n0.Devices {
			out = append(out, fmt.Errorf("%s has %d GPUs and %s has %d", name(n), n.Devices, name(n0), n0.Devices))
		}
	}
	if len(out) > 0 {
		return id, fmt.Errorf("train: the nodes have different GPU counts: %w; give every node the same number of devices (this node has %d)", errors.Join(out...), k)
	}
	if self < 0 || self >= len(w.Nodes) || w.Nodes[self].Devices != k {
		return id, fmt.Errorf("train: the rendezvous's world does not list this node (%d) with its %d GPUs", self, k)
	}
	return ncclIDFrom(w.Payload)
}

// ncclIDFrom reads the NCCL unique id node 0 sent through the rendezvous.
func ncclIDFrom(payload []byte) (nccl.UniqueID, error) {
	var id nccl.UniqueID
	if len(payload) != nccl.UniqueIDBytes {
		return id, fmt.Errorf("train: node 0 sent %d bytes as the NCCL unique id, want %d: every node must run the same build of halo-shell with GPUs (devices: cuda:...)", len(payload), nccl.UniqueIDBytes)
	}
	copy(id.Internal[:], payload)
	return id, nil
}

// errWorldNotFormed is joinWorldWithin's error when the NCCL world did not form in time.
var errWorldNotFormed = errors.New("the NCCL world did not form")

// worldWait is how long a node waits for the NCCL world after the rendezvous: the
// rendezvous' own bound.
func worldWait(rc rendezvous.Config) time.Duration {
	if rc.Timeout > 0 {
		return rc.Timeout
	}
	return rendezvous.DefaultTimeout
}

// joinWorldWithin runs ops.world and returns its result, or errWorldNotFormed (wrapped with
// what to check) when it has not returned within wait or ctx ends first. NCCL's setup blocks
// until every rank has joined, so a node that stopped after the rendezvous would otherwise
// keep the others waiting for ever; the setup left running is abandoned.
func joinWorldWithin(ctx context.Context, wait time.Duration, ops gpuNodeOps, local mesh.Devices, devs []backend.Backend, id nccl.UniqueID, size, first int) (comm.Fabric, error) {
	type result struct {
		f   comm.Fabric
		err error
	}
	done := make(chan result, 1)
	go func() {
		f, err := ops.world(local, devs, id, size, first)
		done <- result{f, err}
	}()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case r := <-done:
		return r.f, r.err
	case <-timer.C:
		return nil, fmt.Errorf("%w within %v of the rendezvous (ranks %d..%d of %d on %s): a node stopped after the rendezvous or its GPUs cannot reach this node's (check that every node still runs and that NCCL's network, e.g. NCCL_SOCKET_IFNAME, connects them); stop every node and start again",
			errWorldNotFormed, wait, first, first+len(devs)-1, size, local)
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %v", errWorldNotFormed, ctx.Err())
	}
}
