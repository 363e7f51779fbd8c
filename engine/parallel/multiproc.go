package parallel

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/optim"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// LocalRanks is the share of a mesh that one process of a multi-process run drives: the
// global ranks [First, First+Count). Every process builds its plan from the same model and
// layout with its own share (engine/comm/tcp's World gives FirstRank and Local) and a World
// whose fabric drives exactly those ranks while its Split takes global ranks (tcp's
// World.Fabric).
//
// Such a plan supports dense and mixture-of-experts models under data parallelism, FSDP,
// context parallelism, expert parallelism and tensor (and expert-tensor) parallelism whose
// tensor groups lie inside one process; New refuses a share of ranks that cuts a tensor group,
// with an error that names what is supported. Every collective of a step (the tensor, context
// and data groups' reductions, the expert dispatch and combine all-to-alls, the expert
// gradients' reductions over their replicas, FSDP's reduce-scatters and all-gathers) runs
// through the world's communicators, so it crosses processes where a group does. What a
// process would otherwise read from other processes' ranks is handled so:
//
//   - ForwardBackward's loss, aux loss and expert load: every rank's loss and aux sums (as
//     exact float64 bits) and its per-expert load of each MoE layer are all-gathered over the
//     world, and each process adds them in global rank order, so every process returns the
//     same loss, AuxLoss and ExpertLoad as a single process driving every rank, bit for bit;
//     BalanceExperts then applies the same bias update on every rank of every process.
//   - Step's gradient norm was already an all-reduce over the world.
//   - Params and Gather read the process's own ranks: after a step every data replica holds
//     the same parameters (under FSDP they were all-gathered), and the process holds whole
//     tensor groups. When an expert group of the process's ranks has ranks in other processes,
//     the experts are all-gathered over the expert groups: Params and Gather are then
//     collectives of the processes sharing an expert group (every one of them must call
//     them). Grads under FSDP all-gathers the gradient shards, so it is a collective: every
//     process must call it.
//   - LoadOptimizerState works (each rank takes its slice of the layout-free state).
//   - OptimizerState is a collective: every process must call it, between the same steps.
//     Under FSDP the optimizer shards are all-gathered over each data group (and expert-data
//     group), and experts held in other processes over the expert groups; every process
//     returns the whole state, bit for bit what a single process driving every rank returns.
//   - Relayout (a new plan over other ranks) is refused.
//   - After a failed step, the reads that are collectives (Params, Gather and Grads where
//     they are, OptimizerState) fail too: the communicators were aborted.
//   - CommStats, SetRankRecorder and Size count the process's ranks (index i is global rank
//     First+i).
type LocalRanks struct{ First, Count int }

// multiProc is the state of a plan that drives only some ranks of its mesh.
type multiProc struct {
	first int
	// sums are every global rank's loss and aux sums of the last ForwardBackward, in rank
	// order (loss, aux, loss, aux, ...), written by the process's first rank.
	sums []float64
	// crossEP: an expert group of this process's ranks has ranks in other processes.
	crossEP bool
	// loads are every global rank's expert load of the last ForwardBackward (per rank, MoE
	// layer-major, one count per expert; nil for dense models), written with sums.
	loads [][]int
}

// checkLocal refuses a share of ranks or a layout that a multi-process plan does not support.
func checkLocal(ms *mesh.Mesh, o Options) error {
	lr, l, n := *o.Local, ms.Layout, ms.Size()
	const supported = "a plan over several processes supports dp, fsdp, cp, ep and tp/etp with each tensor group inside one process"
	switch {
	case o.World == nil:
		return fmt.Errorf("parallel: local ranks [%d,%d) need Options.World, a communicator world spanning every process (engine/comm/tcp's World.Fabric)", lr.First, lr.First+lr.Count)
	case lr.Count < 1 || lr.First < 0 || lr.First+lr.Count > n:
		return fmt.Errorf("parallel: local ranks [%d,%d) are not inside the mesh's %d ranks", lr.First, lr.First+lr.Count, n)
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

// shareSums all-gathers, over the world, every rank's loss and aux sums (as the bits of their
// float64 values, so that each process adds them exactly as a single process does) and its
// per-expert load of each MoE layer (which it takes from the rank's model), so that every
// process sums the same values in the same order. Every rank sends the same number of
// values: 4 for the sums, then one per expert of each MoE layer.
func (p *Plan) shareSums(rk *rank) error {
	dev := rk.dev
	nl := p.shape.MoELayers * p.shape.Experts
	bits := make([]int32, 0, 4+nl)
	for _, v := range []float64{rk.lossSum, rk.auxSum} {
		u := math.Float64bits(v)
		bits = append(bits, int32(uint32(u)), int32(uint32(u>>32)))
	}
	if load := rk.m.TakeExpertLoad(); nl > 0 {
		if len(load) != p.shape.MoELayers {
			return fmt.Errorf("parallel: rank %d counted the load of %d MoE layers; the model has %d", rk.id, len(load), p.shape.MoELayers)
		}
		for j, l := range load {
			if len(l) != p.shape.Experts {
				return fmt.Errorf("parallel: rank %d: MoE layer %d counted %d experts; the model has %d", rk.id, j, len(l), p.shape.Experts)
			}
			for _, v := range l {
				if v < 0 || v > math.MaxInt32 {
					return fmt.Errorf("parallel: rank %d: MoE layer %d: expert load %d does not fit the exchange (int32)", rk.id, j, v)
				}
				bits = append(bits, int32(v))
			}
		}
	}
	per := len(bits)
	src, err := backend.FromInt32(dev, bits, per)
	if err != nil {
		return err
	}
	defer dev.Free(src)
	n := rk.world.Size()
	dst, err := dev.Alloc(tensor.I32, per*n)
	if err != nil {
		return err
	}
	defer dev.Free(dst)
	if err := rk.world.AllGather(dst, src); err != nil {
		return fmt.Errorf("sharing the loss and expert load: %w", err)
	}
	all, err := backend.ToInt32(dev, dst)
	if err != nil {
		return err
	}
	if rk != p.ranks[0] {
		return nil
	}
	sums := make([]float64, 2*n)
	var loads [][]int
	if nl > 0 {
		loads = make([][]int, n)
	}
	for r := range n {
		blk := all[r*per : (r+1)*per]
		for i := range 2 {
			sums[2*r+i] = math.Float64frombits(uint64(uint32(blk[2*i])) | uint64(uint32(blk[2*i+1]))<<32)
		}
		if nl > 0 {
			loads[r] = make([]int, nl)
			for i, v := range blk[4:] {
				loads[r][i] = int(v)
			}
		}
	}
	p.mp.sums, p.mp.loads = sums, loads
	return nil
}

// worldSums returns the loss and aux sums and the expert loads (per MoE layer, per expert; nil
// for dense models) over the ranks with tensor coordinate 0 (the ranks that route distinct
// tokens), in global rank order, from the values shareSums gathered.
func (p *Plan) worldSums() (sum, aux float64, load [][]int) {
	if p.mp.loads != nil {
		load = make([][]int, p.shape.MoELayers)
		for j := range load {
			load[j] = make([]int, p.shape.Experts)
		}
	}
	for r := 0; 2*r < len(p.mp.sums); r++ {
		if p.Mesh.Coord(r).TP != 0 {
			continue
		}
		sum += p.mp.sums[2*r]
		aux += p.mp.sums[2*r+1]
		if load != nil {
			for i, v := range p.mp.loads[r] {
				load[i/p.shape.Experts][i%p.shape.Experts] += v
			}
		}
	}
	return sum, aux, load
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
// all-gathered over the data group (the experts' over the expert-data group) first, so that
// every rank holds its tensor slice's whole state. Every process holds whole tensor groups, so
// it then has every tensor rank's slice of the dense parameters; experts held by other
// processes are all-gathered over the expert groups (spansExperts).
func (p *Plan) multiState(local []map[string]*state, kinds map[string]bool) (int, error) {
	slabs := make([]*rankSlab, len(p.ranks))
	// experts[i][k] is every routed expert's state of kind k (stateSuffixes) of the expert
	// group of local rank i, by parameter name, when experts span processes.
	experts := make([][]map[string][]float32, len(p.ranks))
	if err := p.spmd(func(rk *rank) error {
		s, err := p.rankState(rk)
		if err != nil {
			return err
		}
		i := rk.id - p.mp.first
		slabs[i] = s
		if !p.spansExperts() {
			return nil
		}
		experts[i] = make([]map[string][]float32, len(stateSuffixes))
		for k, vals := range s.vals {
			if vals == nil {
				continue
			}
			if experts[i][k], err = p.spreadExperts(rk, func(e expertSpec) ([]float32, error) { return vals[e.off : e.off+e.n], nil }); err != nil {
				return fmt.Errorf("optimizer state: %w", err)
			}
		}
		return nil
	}); err != nil {
		return 0, err
	}
	step := 0
	// Tensor rank tp's slice of the dense parameters (and routers) from the process's first
	// rank of that tensor coordinate; the routed experts from every rank that holds them
	// (replicas hold equal state), or from the expert-group gathers.
	for tp := range local {
		if !slices.ContainsFunc(p.ranks, func(rk *rank) bool { return rk.c.TP == tp }) {
			return 0, fmt.Errorf("parallel: no rank of this process has tensor coordinate %d", tp)
		}
	}
	seen := make([]bool, len(local))
	for i, rk := range p.ranks {
		tp, s := rk.c.TP, slabs[i]
		first := !seen[tp]
		seen[tp] = true
		step = s.step
		offs := rk.m.Params.Offs
		for j, sp := range rk.m.Specs {
			n, off := sp.Numel(), offs[j]
			_, expert := p.expertHolder(sp.Name)
			for k, suf := range stateSuffixes {
				if s.vals[k] == nil || !first && !expert {
					continue
				}
				kinds[suf] = true
				local[tp][sp.Name+suf] = &state{dt: s.dts[k], vals: s.vals[k][off : off+n]}
			}
		}
		for k, byName := range experts[i] {
			for name, v := range byName {
				local[tp][name+stateSuffixes[k]] = &state{dt: s.dts[k], vals: v}
			}
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
	at, total := rk.m.Params.Offs, rk.m.Params.Flat.Numel()
	offs := make(map[string]int, len(rk.m.Specs))
	for i, s := range rk.m.Specs {
		offs[s.Name] = at[i]
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

// expertSpec is one of a rank's routed-expert parameters: its name and its place in the arena.
type expertSpec struct {
	name   string
	off, n int
	expert int
}

// expertSpecs are rank rk's routed-expert parameters in arena order.
func (p *Plan) expertSpecs(rk *rank) []expertSpec {
	var out []expertSpec
	offs := rk.m.Params.Offs
	for i, s := range rk.m.Specs {
		if x, ok := p.expertOf(s.Name); ok && p.partOf(s.Name) == 1 {
			out = append(out, expertSpec{name: s.Name, off: offs[i], n: s.Numel(), expert: x})
		}
	}
	return out
}

// renameExpert returns parameter name with its expert index replaced by x.
func renameExpert(name string, x int) string {
	head, rest, _ := strings.Cut(name, ".experts.")
	_, tail, _ := strings.Cut(rest, ".")
	return head + ".experts." + strconv.Itoa(x) + "." + tail
}

// epAllGather all-gathers vals (the same length on every rank) over rk's expert group as
// float32 bits and returns every expert rank's values, in expert-group order.
func epAllGather(rk *rank, vals []float32) ([][]float32, error) {
	dev, g := rk.dev, rk.ep.Size()
	bits := make([]int32, max(len(vals), 1))
	for i, v := range vals {
		bits[i] = int32(math.Float32bits(v))
	}
	per := len(bits)
	src, err := backend.FromInt32(dev, bits, per)
	if err != nil {
		return nil, err
	}
	defer dev.Free(src)
	dst, err := dev.Alloc(tensor.I32, per*g)
	if err != nil {
		return nil, err
	}
	defer dev.Free(dst)
	if err := rk.ep.AllGather(dst, src); err != nil {
		return nil, err
	}
	all, err := backend.ToInt32(dev, dst)
	if err != nil {
		return nil, err
	}
	out := make([][]float32, g)
	for j := range out {
		out[j] = make([]float32, len(vals))
		for i := range vals {
			out[j][i] = math.Float32frombits(uint32(all[j*per+i]))
		}
	}
	return out, nil
}

// spreadExperts all-gathers the values of rank rk's routed experts (what of reads for each)
// over the expert group and returns those of the whole expert group by parameter name (every
// expert of the model, rk's tensor slice). The experts of expert rank j are rk's with their
// indices moved by (j - rk's expert rank) · E/EP.
func (p *Plan) spreadExperts(rk *rank, of func(expertSpec) ([]float32, error)) (map[string][]float32, error) {
	specs := p.expertSpecs(rk)
	var mine []float32
	for _, s := range specs {
		v, err := of(s)
		if err != nil {
			return nil, err
		}
		if len(v) != s.n {
			return nil, fmt.Errorf("parallel: rank %d: expert parameter %s has %d values, its spec %d", rk.id, s.name, len(v), s.n)
		}
		mine = append(mine, v...)
	}
	all, err := epAllGather(rk, mine)
	if err != nil {
		return nil, fmt.Errorf("gathering the experts over the expert group: %w", err)
	}
	per, me := p.shape.Experts/p.Mesh.Layout.EP, rk.ep.Rank()
	out := make(map[string][]float32, len(specs)*len(all))
	for j, blk := range all {
		pos := 0
		for _, s := range specs {
			out[renameExpert(s.name, s.expert+(j-me)*per)] = blk[pos : pos+s.n]
			pos += s.n
		}
	}
	return out, nil
}

// spansExperts reports whether some expert group of this process's ranks has ranks in other
// processes: then reading the experts (Params, Grads, OptimizerState) all-gathers them over
// the expert groups, a collective of the processes that share an expert group. A process
// whose expert groups are all its own reads them from its ranks.
func (p *Plan) spansExperts() bool { return p.mp != nil && p.mp.crossEP }

// crossesExperts reports whether an expert group of local ranks [first, first+n) of mesh ms
// has a rank outside them.
func crossesExperts(ms *mesh.Mesh, shape mesh.ModelShape, first, n int) (bool, error) {
	if ms.Layout.EP <= 1 || shape.Experts == 0 {
		return false, nil
	}
	groups, err := ms.Groups(mesh.DimEP)
	if err != nil {
		return false, err
	}
	for _, g := range groups {
		in := 0
		for _, r := range g {
			if r >= first && r < first+n {
				in++
			}
		}
		if in > 0 && in < len(g) {
			return true, nil
		}
	}
	return false, nil
}

// expertsByTP returns, per tensor coordinate, every routed expert's values as get reads them
// from a rank's model, all-gathered over the expert groups: a collective of every local rank.
func (p *Plan) expertsByTP(get func(*models.Model, string) ([]float32, error)) ([]map[string][]float32, error) {
	got := make([]map[string][]float32, len(p.ranks))
	if err := p.spmd(func(rk *rank) error {
		m, err := p.spreadExperts(rk, func(s expertSpec) ([]float32, error) { return get(rk.m, s.name) })
		got[rk.id-p.mp.first] = m
		return err
	}); err != nil {
		return nil, err
	}
	out := make([]map[string][]float32, p.Mesh.Layout.TP)
	for i, rk := range p.ranks {
		if out[rk.c.TP] == nil {
			out[rk.c.TP] = got[i]
		}
	}
	for tp, m := range out {
		if m == nil {
			return nil, fmt.Errorf("parallel: no rank of this process has tensor coordinate %d", tp)
		}
	}
	return out, nil
}
