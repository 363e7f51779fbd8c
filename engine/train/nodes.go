package train

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/comm/rendezvous"
	"github.com/halo-shell/halo-shell/engine/comm/tcp"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/parallel"
	"github.com/halo-shell/halo-shell/engine/profile"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// A run across nodes (NewOnNodes) is one process per node, each driving the K devices of its
// config (cpu:K, or K GPUs such as cuda:0-3) as its share of a mesh of N·K ranks; node r's
// ranks are r·K..r·K+K-1, and every node must have the same K. Each node builds a parallel
// plan that drives only its own ranks (parallel.Options.Local) over one world spanning the
// nodes, found through the rendezvous node 0 serves:
//
//   - CPU devices: the nodes join an engine/comm/tcp world.
//   - GPUs: each node opens its GPUs and checks that NCCL loads, node 0 makes the NCCL unique
//     id, the rendezvous carries it (and each node's usable GPU count), and every node joins
//     one NCCL world of N·K ranks (nccl.NewNodeWorld), the same comm.Fabric the plan gets on
//     one node. A node whose GPUs or NCCL fail tells the others through the rendezvous, so
//     every node stops with an error naming the node. The GPU lists of the nodes may differ
//     (cuda:0-1 on one, cuda:2-3 on another); their lengths may not.
//
// Once joined, before the plan, the nodes all-gather digests of what they must share (layout,
// model, data, batch, optimizer, schedule, seed, resume step: checkAgreement), so nodes whose
// configs disagree stop with an error naming the parts that differ instead of waiting on each
// other in collectives that never match; paths and device numbers may differ.
//
// Every node reads the same data in the same order and hands the plan every micro-batch;
// the plan keeps its ranks' rows. Losses and gradient norms are the world's (the loss sums
// are all-gathered as float64 bits through device tensors over the world), so every node
// computes the same metrics: on CPU devices bit for bit those of one process over cpu:N·K
// with the same layout and seed, on GPUs those of one process over N·K GPUs up to the order
// of NCCL's reductions.
//
// What differs from a one-node run:
//
//   - Only node 0 writes files (metrics.jsonl, checkpoints, the final model, generation
//     eval); the other nodes train and report one summary line.
//   - Save and SaveStep are collectives: every node calls them between the same steps (Run
//     does), the optimizer shards are gathered from every node (parallel.Plan's
//     OptimizerState), and node 0 writes an ordinary checkpoint with the optimizer state.
//     Every node resumes from the same checkpoint (resume_from_checkpoint), in the same or
//     another supported layout and node count, or on one node; a checkpoint of one node
//     resumes across nodes too. Checkpoints marked weights_only by earlier builds are refused.
//   - An interrupted run across nodes (ctx cancelled) saves no checkpoint: the nodes are not
//     interrupted at the same step, so they cannot gather the optimizer state together;
//     resume from the last checkpoint-N.
//   - Layouts: dense and mixture-of-experts models with dp, fsdp, tp (tp dividing each node's
//     device count, so every tensor group lies inside one node), cp, and for MoE models ep and
//     etp (MoE models with cp are refused for every run, see engine/mesh). Context and expert
//     groups may span nodes: their collectives (the context group's key/value gathers, the
//     experts' dispatch and combine all-to-alls) cross the world. The aux loss, the expert load and
//     aux-loss-free balancing are the world's: every node balances the experts after each of
//     its steps (Step does), so every rank of every node keeps the same bias. Moving the run
//     to another layout (SetLayout) is refused.
//   - SyncGrads is a collective under FSDP (gradient shards are all-gathered between the
//     nodes) and when an expert group spans nodes (the experts other nodes hold are
//     all-gathered). The parameter gather of Eval, generation, SaveModel and HostModel reads
//     only this node's ranks when each node holds whole expert groups ((K/tp) divisible by
//     ep, or no ep) and needs no other node; when an expert group spans nodes it is a collective of
//     the nodes sharing it. Either way, every node must call them between the same steps.
//     Run does: every node evaluates at the same steps, and every node's Save gathers the
//     parameters before node 0 alone writes the final model and runs generation eval, which
//     then gather nothing.

// nodesSupported names what a run across nodes supports, for refusals.
const nodesSupported = "a run across nodes supports dense and mixture-of-experts models on cpu or cuda devices with dp, fsdp, tp (tp dividing each node's device count), cp, ep and etp, in a fixed layout"

// maxNodeRanks bounds the ranks of a run across nodes on GPUs.
const maxNodeRanks = 1 << 16

// nodeSpec is how a trainer joins a run across nodes.
type nodeSpec struct {
	ctx context.Context
	rc  rendezvous.Config
	gpu gpuNodeOps // how a node on GPUs reaches them and NCCL
}

// NodeDevices returns the mesh of a run of nnodes nodes with the config's devices on each
// and the layout over it, or an error naming what a run across nodes does not support. cpu:K
// becomes cpu:nnodes·K; K GPUs (cuda:0-3, cuda:4,6) become cuda:0-(nnodes·K-1), whose ids
// are the world's ranks (node r's i-th GPU is rank r·K+i), not device numbers. It reads no
// model or data (New checks the model's shape too).
func NodeDevices(cfg *Config, nnodes int) (mesh.Devices, mesh.Layout, error) {
	d, l, err := cfg.Parallel.Resolve()
	if err != nil {
		return mesh.Devices{}, mesh.Layout{}, fmt.Errorf("train: devices: %w", err)
	}
	k := d.Len()
	var all mesh.Devices
	switch d.Kind {
	case "cpu":
		if all, err = mesh.ParseDevices(fmt.Sprintf("cpu:%d", nnodes*k)); err != nil {
			return mesh.Devices{}, mesh.Layout{}, fmt.Errorf("train: %d nodes of devices %s: %w", nnodes, d, err)
		}
	case "cuda":
		if nnodes < 1 || nnodes > maxNodeRanks/k {
			return mesh.Devices{}, mesh.Layout{}, fmt.Errorf("train: %d nodes of devices %s: a run across nodes on GPUs has 1 to %d ranks in all", nnodes, d, maxNodeRanks)
		}
		all = mesh.Devices{Kind: "cuda", IDs: make([]int, nnodes*k)}
		for r := range all.IDs {
			all.IDs[r] = r
		}
	default:
		return mesh.Devices{}, mesh.Layout{}, fmt.Errorf("train: %d nodes with devices %s: %s", nnodes, d, nodesSupported)
	}
	l.DP = 0
	l = l.Norm(all.Len())
	switch {
	case k%l.TP != 0:
		return mesh.Devices{}, mesh.Layout{}, fmt.Errorf("train: %d nodes: tensor_parallel_size %d does not divide the %d devices of a node (%s); %s", nnodes, l.TP, k, d, nodesSupported)
	case cfg.Batch.GradientAccumulationSteps%l.DP != 0:
		return mesh.Devices{}, mesh.Layout{}, fmt.Errorf("train: %d nodes: layout %s on %s: gradient_accumulation_steps %d micro-batches cannot be dealt over %d data-parallel ranks; use a multiple of %d",
			nnodes, l, all, cfg.Batch.GradientAccumulationSteps, l.DP, l.DP)
	}
	return all, l, nil
}

// NewOnNodes builds the trainer of one node of a run across rc.NNodes nodes (see the comment
// above NodeDevices): it does what New does, then joins the other nodes through the
// rendezvous rc names (node 0 serves it) and lays the model out over every node's devices.
// ctx bounds the rendezvous. The layout and model are checked before the rendezvous.
func NewOnNodes(ctx context.Context, cfg *Config, rc rendezvous.Config) (*Trainer, error) {
	return newOnNodes(ctx, cfg, rc, realGPUNodeOps())
}

// newOnNodes is NewOnNodes reaching GPUs and NCCL through gpu.
func newOnNodes(ctx context.Context, cfg *Config, rc rendezvous.Config, gpu gpuNodeOps) (*Trainer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := rc.Validate(); err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	if _, _, err := NodeDevices(cfg, rc.NNodes); err != nil {
		return nil, err
	}
	// The single model, the host view of the run, stays in host memory (on GPUs as on one
	// node: the devices hold the plan).
	b, note, err := backend.Resolve("cpu")
	if err != nil {
		return nil, fmt.Errorf("train: device cpu: %w", err)
	}
	return newOn(cfg, b, note, &nodeSpec{ctx: ctx, rc: rc, gpu: gpu})
}

// Node returns this process's node rank and the number of nodes of the run (0 and 1 for a
// run on one node).
func (t *Trainer) Node() (rank, nodes int) {
	if t.nodes == nil {
		return 0, 1
	}
	return t.nodes.rc.NodeRank, t.nodes.rc.NNodes
}

// lead reports whether this process writes the run's files (node 0, or a one-node run).
func (t *Trainer) lead() bool {
	r, _ := t.Node()
	return r == 0
}

// refuseNodes is the error of an operation a run across nodes does not support.
func (t *Trainer) refuseNodes(what string) error {
	if t.nodes == nil {
		return nil
	}
	return fmt.Errorf("train: %s is not supported in a run across %d nodes; %s", what, t.nodes.rc.NNodes, nodesSupported)
}

// startNodePlan joins the other nodes and builds this node's share of the plan over devices
// d (every node's) with layout l.
func (t *Trainer) startNodePlan(d mesh.Devices, l mesh.Layout) error {
	if d.Kind == "cuda" {
		return t.startGPUNodePlan(d, l)
	}
	k := d.Len() / t.nodes.rc.NNodes
	recs := make([]*profile.Recorder, k)
	devs := make([]backend.Backend, k)
	for i := range devs {
		b, err := openRank("cpu", i, recs, i)
		if err == nil {
			if err = capMemory(b, t.Cfg.Run.MaxDeviceMemoryGiB); err != nil {
				_ = b.Close()
			}
		}
		if err != nil {
			return err
		}
		devs[i] = b
	}
	closeDevs := func() {
		for _, b := range devs {
			_ = b.Close()
		}
	}
	w, err := tcp.Join(t.nodes.ctx, tcp.Config{Rendezvous: t.nodes.rc}, devs)
	if err != nil {
		closeDevs()
		return fmt.Errorf("train: joining the other nodes: %w", err)
	}
	first := w.FirstRank()
	if w.Size() != d.Len() || w.Local() != k {
		err := fmt.Errorf("train: the nodes disagree on devices: this node has %d of %d ranks, the world has %d ranks: give every node the same devices", k, d.Len(), w.Size())
		w.Abort(err)
		_ = w.Close()
		closeDevs()
		return err
	}
	if err := checkAgreement(w.Fabric(), devs, t.agreement(d, l), k, t.nodes.rc.NNodes); err != nil {
		_ = w.Close()
		closeDevs()
		return err
	}
	o := parallel.Options{Optimizer: optimConfig(t.Cfg), Local: &parallel.LocalRanks{First: first, Count: k}}
	o.Optimizer.WeightDecay = t.hyper.WeightDecay
	o.NewBackend = func(r int) (backend.Backend, error) { return devs[r-first], nil }
	o.World = func([]backend.Backend) (comm.Fabric, error) { return w.Fabric(), nil }
	p, err := parallel.New(t.model, d, l, o)
	if err != nil {
		_ = w.Close()
		return fmt.Errorf("train: layout %s on %s across %d nodes: %w", l, d, t.nodes.rc.NNodes, err)
	}
	return t.adoptNodePlan(p, d, l, recs, devs)
}

// adoptNodePlan gives a new plan of a run across nodes the trainer's optimizer state and
// makes it drive the steps (adopt); on error it closes the plan.
func (t *Trainer) adoptNodePlan(p *parallel.Plan, d mesh.Devices, l mesh.Layout, recs []*profile.Recorder, devs []backend.Backend) error {
	steps, st, err := t.opt.Export()
	if err == nil {
		err = p.LoadOptimizerState(steps, st)
	}
	if err != nil {
		p.Close()
		return fmt.Errorf("train: layout %s on %s across %d nodes: optimizer state: %w", l, d, t.nodes.rc.NNodes, err)
	}
	t.adopt(p, d, recs, devs)
	return nil
}

// errWeightsOnly is the reason a weights-only checkpoint (written by earlier builds for a run
// across nodes) cannot be resumed.
var errWeightsOnly = errors.New("it holds the weights of a run across nodes but no optimizer state (written by an earlier build): start a new run from its weights with model_name_or_path set to it")

// agreementParts names what every node of a run across nodes must share; agreement digests
// each in this order.
var agreementParts = []string{"devices per node and layout", "model config and dtype", "training data", "batch", "optimizer", "schedule", "seed", "resume step"}

// agreement returns a 32-bit digest of each of agreementParts for this node's run on mesh d
// with layout l. Paths (output_dir, dataset and model paths) and the device numbers may differ
// between nodes; what they lead to may not.
func (t *Trainer) agreement(d mesh.Devices, l mesh.Layout) []int32 {
	cfg := t.Cfg
	mc, _ := json.Marshal(t.model.Config())
	st, _ := json.Marshal(t.Stats)
	batch, _ := json.Marshal(cfg.Batch)
	opt, _ := json.Marshal(cfg.Optim)
	sched, _ := json.Marshal(cfg.Sched)
	var seed int64
	if cfg.Run.Seed != nil {
		seed = *cfg.Run.Seed
	}
	parts := []string{
		fmt.Sprintf("%d %s", d.Len()/t.nodes.rc.NNodes, l.Norm(d.Len())),
		fmt.Sprintf("%s %s %d", mc, t.model.DType(), t.model.NumParams()),
		fmt.Sprintf("%s %s %d", cfg.Method, st, t.loader.BatchesPerEpoch()),
		string(batch),
		string(opt),
		fmt.Sprintf("%s %d %d", sched, t.totalSteps, t.warmup),
		fmt.Sprint(seed),
		fmt.Sprint(t.step),
	}
	out := make([]int32, len(parts))
	for i, p := range parts {
		h := sha256.Sum256([]byte(p))
		out[i] = int32(binary.LittleEndian.Uint32(h[:4]))
	}
	return out
}

// checkAgreement all-gathers every rank's agreement digests over the world fab (this node's
// k ranks are devs, global ranks first..first+k-1) and returns an error naming, for each node
// that differs from node 0, the parts that differ. Every node sees every node's digests, so
// every node stops, with the same message, rather than waiting in a collective the others
// never call. Every local rank takes part.
func checkAgreement(fab comm.Fabric, devs []backend.Backend, mine []int32, k, nnodes int) error {
	n := len(mine)
	all := make([][]int32, len(devs))
	errs := make([]error, len(devs))
	var wg sync.WaitGroup
	for i, dev := range devs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			all[i], errs[i] = gatherInt32(fab.Comm(i), dev, mine, n*k*nnodes)
			if errs[i] != nil {
				fab.Abort(errs[i])
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("train: comparing the nodes' configs: %w", err)
	}
	got := all[0]
	var bad []string
	for node := 1; node < nnodes; node++ {
		var diff []string
		for j, name := range agreementParts {
			if got[node*k*n+j] != got[j] {
				diff = append(diff, name)
			}
		}
		if len(diff) > 0 {
			bad = append(bad, fmt.Sprintf("node %d differs from node 0 in %s", node, strings.Join(diff, ", ")))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("train: the nodes' configs disagree: %s; run every node with the same config (only the device numbers and paths may differ)", strings.Join(bad, "; "))
	}
	return nil
}

// gatherInt32 all-gathers v (the same length on every rank) over c through dev and returns the
// total elements of every rank, in rank order.
func gatherInt32(c comm.Communicator, dev backend.Backend, v []int32, total int) ([]int32, error) {
	src, err := backend.FromInt32(dev, v, len(v))
	if err != nil {
		return nil, err
	}
	defer dev.Free(src)
	dst, err := dev.Alloc(tensor.I32, total)
	if err != nil {
		return nil, err
	}
	defer dev.Free(dst)
	if err := c.AllGather(dst, src); err != nil {
		return nil, err
	}
	return backend.ToInt32(dev, dst)
}
