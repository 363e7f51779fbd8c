package parallel

import (
	"fmt"
	"math"
	"slices"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/optim"
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
//   - OptimizerState is a collective: every process must call it, between the same steps.
//     Under FSDP the optimizer shards are all-gathered over each data group; every process
//     returns the whole state, bit for bit what a single process driving every rank returns.
//   - Relayout (a new plan over other ranks) is refused.
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
	return fmt.Errorf("parallel: %s builds a plan over every rank in this process, and this plan drives ranks [%d,%d) of %d (one process of several): not supported over several processes yet", what, p.mp.first, p.mp.first+len(p.ranks), p.Mesh.Size())
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

// rankSlab is one rank's optimizer state over its whole (tensor-sliced) parameter arena: per
// state kind (stateSuffixes), the values in arena order, or nil where the rank has no such
// kind.
type rankSlab struct {
	step int
	dts  []tensor.DType
	vals [][]float32
}

// multiState fills local and kinds (see OptimizerState) on a plan over several processes.
// Each rank lays its optimizer state out over its arena; under FSDP the shards are
// all-gathered over the data group first, so that every rank holds its tensor slice's whole
// state. Every process holds whole tensor groups, so it then has every tensor rank's slice.
func (p *Plan) multiState(local []map[string]*state, kinds map[string]bool) (int, error) {
	slabs := make([]*rankSlab, len(p.ranks))
	if err := p.spmd(func(rk *rank) error {
		s, err := p.rankState(rk)
		if err != nil {
			return err
		}
		slabs[rk.id-p.mp.first] = s
		return nil
	}); err != nil {
		return 0, err
	}
	step := 0
	for tp := range local {
		i := slices.IndexFunc(p.ranks, func(rk *rank) bool { return rk.c.TP == tp })
		if i < 0 {
			return 0, fmt.Errorf("parallel: no rank of this process has tensor coordinate %d", tp)
		}
		rk, s := p.ranks[i], slabs[i]
		step = s.step
		off := 0
		for _, sp := range rk.m.Specs {
			n := sp.Numel()
			for k, suf := range stateSuffixes {
				if s.vals[k] == nil {
					continue
				}
				kinds[suf] = true
				local[tp][sp.Name+suf] = &state{dt: s.dts[k], vals: s.vals[k][off : off+n]}
			}
			off += n
		}
	}
	return step, nil
}

// rankState is rank rk's rankSlab; under FSDP a collective over each sharded part's group.
func (p *Plan) rankState(rk *rank) (*rankSlab, error) {
	st, ts, err := rk.opt.Export()
	if err != nil {
		return nil, err
	}
	byName := make(map[string]optim.StateTensor, len(ts))
	for _, t := range ts {
		byName[t.Name] = t
	}
	offs := make(map[string]int, len(rk.m.Specs))
	total := 0
	for _, s := range rk.m.Specs {
		offs[s.Name] = total
		total += s.Numel()
	}
	nk := len(stateSuffixes)
	s := &rankSlab{step: st, dts: make([]tensor.DType, nk), vals: make([][]float32, nk)}
	kind := func(k int, dt tensor.DType) []float32 {
		if s.vals[k] == nil {
			s.vals[k], s.dts[k] = make([]float32, total), dt
		}
		return s.vals[k]
	}
	for i, op := range rk.optParams {
		for k, suf := range stateSuffixes {
			t, ok := byName[op.Name+suf]
			if !ok {
				continue
			}
			v, err := tensor.DecodeFloat32(t.DType, t.Data)
			if err != nil {
				return nil, fmt.Errorf("optimizer state %s: %w", t.Name, err)
			}
			copy(kind(k, t.DType)[offs[op.Name]+rk.optElem[i]:], v)
		}
	}
	if !rk.shard.on {
		return s, nil
	}
	for i := range rk.shard.parts {
		pt := &rk.shard.parts[i]
		if pt.local {
			continue
		}
		if err := p.gatherState(rk, pt, s, kind); err != nil {
			return nil, fmt.Errorf("gathering the optimizer state: %w", err)
		}
	}
	return s, nil
}

// gatherState all-gathers the optimizer state of FSDP part pt over its group into s: each
// rank sends one header element per kind (its dtype plus one, 0 when absent) and then S
// elements per kind (float32 bits) of its shard.
func (p *Plan) gatherState(rk *rank, pt *fsdpPart, s *rankSlab, kind func(int, tensor.DType) []float32) error {
	nk := len(stateSuffixes)
	per := nk + nk*pt.s
	send := make([]int32, per)
	for k := range nk {
		if s.vals[k] == nil {
			continue
		}
		send[k] = int32(s.dts[k]) + 1
		blk := send[nk+k*pt.s:]
		eachArena(pt, pt.lo, pt.hi, func(q, a, n int) {
			for j := range n {
				blk[q-pt.lo+j] = int32(math.Float32bits(s.vals[k][a+j]))
			}
		})
	}
	dev := rk.dev
	src, err := backend.FromInt32(dev, send, per)
	if err != nil {
		return err
	}
	defer dev.Free(src)
	g := pt.c.Size()
	dst, err := dev.Alloc(tensor.I32, per*g)
	if err != nil {
		return err
	}
	defer dev.Free(dst)
	if err := pt.c.AllGather(dst, src); err != nil {
		return err
	}
	all, err := backend.ToInt32(dev, dst)
	if err != nil {
		return err
	}
	for r := range g {
		blk := all[r*per : (r+1)*per]
		lo, hi := min(r*pt.s, pt.p), min((r+1)*pt.s, pt.p)
		for k := range nk {
			if blk[k] == 0 {
				continue
			}
			vals, vs := kind(k, tensor.DType(blk[k]-1)), blk[nk+k*pt.s:]
			eachArena(pt, lo, hi, func(q, a, n int) {
				for j := range n {
					vals[a+j] = math.Float32frombits(uint32(vs[q-lo+j]))
				}
			})
		}
	}
	return nil
}

// eachArena calls fn for the runs of packed positions [lo, hi) of part pt: fn(q, a, n) says
// that packed positions [q, q+n) are arena positions [a, a+n).
func eachArena(pt *fsdpPart, lo, hi int, fn func(q, a, n int)) {
	pos := 0
	for _, sg := range pt.segs {
		a, b := max(lo, pos), min(hi, pos+sg.n)
		if a < b {
			fn(a, sg.off+a-pos, b-a)
		}
		pos += sg.n
	}
}
