package parallel

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// LocalRanks is the share of a mesh that one process of a multi-process run drives: the
// global ranks [First, First+Count). Every process builds its plan from the same model and
// layout with its own share (engine/comm/tcp's World gives FirstRank and Local) and a World
// whose fabric drives exactly those ranks while its Split takes global ranks (tcp's
// World.Fabric).
//
// Such a plan supports dense models under data parallelism, FSDP and tensor parallelism whose
// tensor groups lie inside one process; New refuses context and expert parallelism and MoE
// models with an error that names what is supported. What a process
// would otherwise read from other processes' ranks is handled so:
//
//   - ForwardBackward's loss: every rank's loss sum is all-gathered over the world (as exact
//     float64 bits) and each process adds them in global rank order, so every process returns
//     the same loss as a single process driving every rank, bit for bit.
//   - Step's gradient norm was already an all-reduce over the world.
//   - Params and Gather read the process's own ranks: after a step every data replica holds
//     the same parameters (under FSDP they were all-gathered), and the process holds whole
//     tensor groups. Grads under FSDP all-gathers the gradient shards, so it is a collective:
//     every process must call it.
//   - LoadOptimizerState works (each rank takes its slice of the layout-free state).
//   - OptimizerState and Relayout need every rank's optimizer shards and are refused.
//   - CommStats, SetRankRecorder and Size count the process's ranks (index i is global rank
//     First+i).
type LocalRanks struct{ First, Count int }

// multiProc is the state of a plan that drives only some ranks of its mesh.
type multiProc struct {
	first int
	// sums are every global rank's loss and aux sums of the last ForwardBackward, in rank
	// order (loss, aux, loss, aux, ...), written by the process's first rank.
	sums []float64
}

// checkLocal refuses a share of ranks or a layout that a multi-process plan does not support.
func checkLocal(ms *mesh.Mesh, shape mesh.ModelShape, o Options) error {
	lr, l, n := *o.Local, ms.Layout, ms.Size()
	const supported = "a plan over several processes supports dense models with dp, fsdp and tp (tensor groups inside one process)"
	switch {
	case o.World == nil:
		return fmt.Errorf("parallel: local ranks [%d,%d) need Options.World, a communicator world spanning every process (engine/comm/tcp's World.Fabric)", lr.First, lr.First+lr.Count)
	case lr.Count < 1 || lr.First < 0 || lr.First+lr.Count > n:
		return fmt.Errorf("parallel: local ranks [%d,%d) are not inside the mesh's %d ranks", lr.First, lr.First+lr.Count, n)
	case shape.MoE():
		return fmt.Errorf("parallel: the model is a mixture of experts; %s (expert load, balancing and aux loss are not shared between processes yet)", supported)
	case l.EP > 1 || l.ETP > 1:
		return fmt.Errorf("parallel: layout %v uses expert parallelism; %s", l, supported)
	case l.CP > 1:
		return fmt.Errorf("parallel: layout %v uses context parallelism (cp=%d); %s", l, l.CP, supported)
	case lr.First%l.TP != 0 || lr.Count%l.TP != 0:
		return fmt.Errorf("parallel: local ranks [%d,%d) cut a tensor group of %d ranks; %s: give each process a multiple of tp ranks", lr.First, lr.First+lr.Count, l.TP, supported)
	}
	return nil
}

// refuseMulti is the error of a method that needs every rank of the mesh in this process.
func (p *Plan) refuseMulti(what string) error {
	if p.mp == nil {
		return nil
	}
	return fmt.Errorf("parallel: %s needs every rank's optimizer state, and this plan drives ranks [%d,%d) of %d (one process of several): not supported over several processes yet", what, p.mp.first, p.mp.first+len(p.ranks), p.Mesh.Size())
}

// shareSums all-gathers every rank's loss and aux sums over the world as the bits of their
// float64 values, so that each process can add them exactly as a single process does.
func (p *Plan) shareSums(rk *rank) error {
	dev := rk.dev
	bits := make([]int32, 0, 4)
	for _, v := range []float64{rk.lossSum, rk.auxSum} {
		u := math.Float64bits(v)
		bits = append(bits, int32(uint32(u)), int32(uint32(u>>32)))
	}
	src, err := backend.FromInt32(dev, bits, 4)
	if err != nil {
		return err
	}
	defer dev.Free(src)
	n := rk.world.Size()
	dst, err := dev.Alloc(tensor.I32, 4*n)
	if err != nil {
		return err
	}
	defer dev.Free(dst)
	if err := rk.world.AllGather(dst, src); err != nil {
		return fmt.Errorf("sharing the loss: %w", err)
	}
	all, err := backend.ToInt32(dev, dst)
	if err != nil {
		return err
	}
	if rk != p.ranks[0] {
		return nil
	}
	sums := make([]float64, 2*n)
	for i := range sums {
		sums[i] = math.Float64frombits(uint64(uint32(all[2*i])) | uint64(uint32(all[2*i+1]))<<32)
	}
	p.mp.sums = sums
	return nil
}

// worldSums returns the loss and aux sums over the ranks with tensor coordinate 0, in global
// rank order, from the values shareSums gathered.
func (p *Plan) worldSums() (sum, aux float64) {
	for r := 0; 2*r < len(p.mp.sums); r++ {
		if p.Mesh.Coord(r).TP == 0 {
			sum += p.mp.sums[2*r]
			aux += p.mp.sums[2*r+1]
		}
	}
	return sum, aux
}
