package parallel

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/optim"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Options are the choices of New beyond the layout.
type Options struct {
	// Optimizer configures AdamW on every rank (Mode MasterF32 or BF16). In BF16 mode the
	// stochastic-rounding stream is keyed by each rank's own parameter numbering, so updates
	// are equally valid but not bit-identical to a single device's.
	Optimizer optim.Config
	// NewBackend opens the device of world rank r; nil opens a CPU backend with Workers
	// workers (simulated devices).
	NewBackend func(r int) (backend.Backend, error)
	// Workers per simulated CPU device (0 = 1).
	Workers int
	// World makes the communicators over the ranks' devices (devs[r] is world rank r's, as
	// NewBackend opened it); the plan builds its groups with Split and closes the world with
	// Close. nil makes an in-process world (comm.NewWorld), right for CPU devices and for
	// tests; GPUs use engine/comm/nccl (NewLocalWorld(...).Fabric()). The world must drive
	// every rank of the plan in this process, or with Local those ranks only.
	World func(devs []backend.Backend) (comm.Fabric, error)
	// Local, when set, makes the plan one process's share of a multi-process run: it drives
	// only these global ranks (NewBackend is called with global ranks, World with their
	// devices) and communicates with the other processes through World. See LocalRanks for
	// what is supported.
	Local *LocalRanks
}

// placed is where one parameter of the full model goes under the plan's layout: its split over
// the tensor group as the layout applies the family's table (Replicated when there is one
// tensor rank, and for a routed expert's weights under etp = 1), and the routed expert it
// belongs to (-1 for every other parameter).
type placed struct {
	split  models.Split
	expert int
}

// Plan is a model laid out over a mesh of devices: one model per rank (built from the same
// family code with fewer heads, a narrower MLP or fewer tokens), the communicators of the mesh,
// and the optimizer state (sharded under FSDP). It drives every rank itself, one goroutine per
// rank; its methods are called from one goroutine at a time.
type Plan struct {
	Mesh  *mesh.Mesh
	cfg   *config.Config
	specs []models.ParamSpec // the full (unsplit) parameter table
	place map[string]placed  // every parameter of the full model, from the family's table
	world comm.Fabric
	ranks []*rank
	dtype tensor.DType
	shape mesh.ModelShape // of the full model
	// labels and padID are the source's classifier labels (0 for a language model) and its
	// pad id, which a classifier pools by, so that every rank's model is the same kind.
	labels, padID int
	// failed is set when a rank failed inside a step: the communicators were aborted so that
	// no rank waits forever, and only host-side reads (Gather, Params, OptimizerState,
	// Relayout) remain possible.
	failed error
	// auxCoef is the model's router aux-loss weight (0 for dense models); aux the mean aux
	// loss of the last ForwardBackward.
	auxCoef, aux float64
	// load is the tokens per expert of each MoE layer in the last ForwardBackward, summed over
	// its rows and the ranks that route distinct tokens (nil for dense models).
	load [][]int
	// mp is set when the plan drives only some ranks of its mesh (Options.Local).
	mp *multiProc
	// lora is set when the model carries LoRA adapters (lora.go).
	lora *loraPlan
}

type rank struct {
	id              int
	c               mesh.Coord
	dev             backend.Backend
	rb              *rankBackend
	m               *models.Model
	tp, cp, data    comm.Communicator
	world           comm.Communicator
	ep, edata       comm.Communicator // expert group and expert-data group (replicas of the same experts)
	opt             *optim.AdamW
	lossSum, auxSum float64
	optParams       []optim.Param
	optElem         []int  // per optParams entry: the offset of its first element in its (local) parameter
	countNorm       []bool // per optParams entry: counted once in the global gradient norm
	shard           fsdpShard
	dataRank, dataN int
}

// ShapeOf returns the structure of m that the layout rules read (its family's config.Shape).
func ShapeOf(m *models.Model) mesh.ModelShape { return m.Arch.Shape }

// New lays src (a single-device model with its weights) out over devices with layout l. The
// layout is checked first (mesh.Check); then each rank gets its own model and its slice of the
// weights. src is only read.
func New(src *models.Model, devices mesh.Devices, l mesh.Layout, o Options) (*Plan, error) {
	cfg := src.Config()
	if cfg == nil {
		return nil, errors.New("parallel: the source model has no config.json (build it with models.New or models.Load)")
	}
	shape := ShapeOf(src)
	ms, err := mesh.New(devices, l, shape, 0)
	if err != nil {
		return nil, err
	}
	l = ms.Layout
	if err := checkLoRA(src, l, devices.Len(), o); err != nil {
		return nil, err
	}
	p := &Plan{Mesh: ms, specs: src.Specs, place: map[string]placed{}, dtype: src.DType(), shape: shape,
		labels: src.Arch.NumLabels, padID: src.Arch.PadID}
	if ad := src.LoRA(); ad != nil {
		p.lora = &loraPlan{cfg: ad.Config, specs: ad.Specs, dropoutKey: src.DropoutKey()}
	}
	if err := p.placeAll(src); err != nil {
		return nil, err
	}
	if src.IsMoE() {
		p.auxCoef = src.AuxLossScale()
	}
	local := cfg.Clone()
	if l.TP > 1 {
		local.HeadDim = src.Arch.HeadDim
		local.NumAttentionHeads = src.Arch.Heads / l.TP
		local.NumKeyValueHeads = src.Arch.KVHeads / l.TP
		if local.NumGlobalKeyValueHeads > 0 {
			local.NumGlobalKeyValueHeads /= l.TP // gemma4_text's full layers (rule tp-heads)
		}
		if !shape.MoE() {
			local.IntermediateSize = src.Arch.Intermediate / l.TP
		}
	}
	if l.ETP > 1 {
		// Each expert's FFN is split over the tensor group, as the family's table places
		// its projections (bind checks the rank's shapes against it).
		local.MoEIntermediateSize = shape.ExpertIntermediate / l.ETP
	}
	p.cfg = cfg
	first, n := 0, ms.Size()
	if o.Local != nil {
		if err := checkLocal(ms, o); err != nil {
			return nil, err
		}
		first, n = o.Local.First, o.Local.Count
		p.mp = &multiProc{first: first}
		if p.mp.crossEP, err = crossesExperts(ms, shape, first, n); err != nil {
			return nil, err
		}
	}
	devs := make([]backend.Backend, n)
	for r := range devs {
		if o.NewBackend != nil {
			devs[r], err = o.NewBackend(first + r)
		} else {
			devs[r] = cpu.New(cpu.Options{Workers: max(o.Workers, 1)})
		}
		if err != nil {
			for _, d := range devs[:r] {
				_ = d.Close()
			}
			return nil, fmt.Errorf("parallel: device of rank %d: %w", first+r, err)
		}
	}
	closeDevs := func() {
		for _, d := range devs {
			_ = d.Close()
		}
	}
	if p.world, err = newWorld(devs, o.World); err != nil {
		closeDevs()
		return nil, err
	}
	closeAll := func() {
		_ = p.world.Close()
		closeDevs()
	}
	groups := map[mesh.Dim][]comm.Communicator{}
	for _, d := range []mesh.Dim{mesh.DimTP, mesh.DimCP, mesh.DimData, mesh.DimEP, mesh.DimEData} {
		g, err := ms.Groups(d)
		if err == nil {
			groups[d], err = p.world.Split(string(d), g)
		}
		if err == nil && len(groups[d]) != n {
			err = fmt.Errorf("parallel: the world's split %q gave %d communicators for %d ranks", d, len(groups[d]), n)
		}
		if err != nil {
			closeAll()
			return nil, err
		}
	}
	full := map[string]models.ParamSpec{}
	for _, s := range src.Specs {
		full[s.Name] = s
	}
	for r := 0; r < n; r++ {
		rk := &rank{id: first + r, c: ms.Coord(first + r), dev: devs[r], tp: groups[mesh.DimTP][r], cp: groups[mesh.DimCP][r],
			data: groups[mesh.DimData][r], world: p.world.Comm(r), ep: groups[mesh.DimEP][r], edata: groups[mesh.DimEData][r]}
		rk.dataRank, rk.dataN = rk.data.Rank(), rk.data.Size()
		rk.rb = newRankBackend(devs[r], rk.tp, rk.cp)
		p.ranks = append(p.ranks, rk)
	}
	// From here on Close releases everything, devices included.
	for _, rk := range p.ranks {
		if rk.m, err = models.New(local, rk.rb, models.Options{DType: src.DType(), Experts: p.heldExperts(rk), NumLabels: p.labels}); err != nil {
			p.Close()
			return nil, fmt.Errorf("parallel: rank %d: %w", rk.id, err)
		}
		rk.m.Arch.PadID = p.padID
		err = p.bind(rk, full, src)
		if err == nil {
			err = p.attachLoRA(rk, src)
		}
		if err == nil {
			err = rk.m.EnableGrads()
		}
		if err == nil {
			// After EnableGrads, which rebuilds the layers.
			p.setRunners(rk)
		}
		if err == nil {
			err = p.setupOptimizer(rk, o.Optimizer)
		}
		if err == nil {
			// The aux-loss-free balancing state goes with the router.
			err = copyBalancing(rk.m, src)
		}
		if err != nil {
			p.Close()
			return nil, err
		}
	}
	return p, nil
}

// placeAll places every parameter of the full model by its family's tensor-parallel table
// (models.Family.Placements) under the plan's layout, and checks that each split fits the
// parameter's full shape. Ranks' models are narrowed to match (fewer heads, a narrower MLP or
// expert), which bind checks.
func (p *Plan) placeAll(src *models.Model) error {
	l := p.Mesh.Layout
	for _, s := range src.Specs {
		pp, err := src.Family.Place(s.Name)
		if err != nil {
			return fmt.Errorf("parallel: %w", err)
		}
		split := pp.Split
		if l.TP == 1 || (pp.Expert >= 0 && l.ETP == 1) {
			split = models.Replicated
		}
		if _, err := split.Local(s.Shape, l.TP); err != nil {
			return fmt.Errorf("parallel: weight %q %v: the %s tensor-parallel table places it %s (entry %q), but %v; fix the entry in engine/models or choose another tensor_parallel_size",
				s.Name, s.Shape, src.Family.ModelType, describeSplit(split, l.TP), pp.Module, err)
		}
		p.place[s.Name] = placed{split: split, expert: pp.Expert}
	}
	return nil
}

// describeSplit says in words how split lays a parameter out over n tensor ranks.
func describeSplit(split models.Split, n int) string {
	switch split {
	case models.Column:
		return fmt.Sprintf("column-parallel (output features, dim 0, cut into %d parts)", n)
	case models.Row:
		return fmt.Sprintf("row-parallel (input features, dim 1, cut into %d parts)", n)
	case models.PerHead:
		return "whole on every tensor rank (a per-head norm, gradient summed over the tensor group)"
	}
	return "whole on every tensor rank"
}

// bind checks every parameter of rank rk's model against its placement (the rank's shape must
// be the placed part of the full shape), registers the tensor-parallel weights with the rank's
// backend, and copies the rank's slice of src's weights.
func (p *Plan) bind(rk *rank, full map[string]models.ParamSpec, src *models.Model) error {
	tp, ntp := rk.c.TP, p.Mesh.Layout.TP
	colSize := map[string]int{}
	var cols []struct {
		w     T
		group string
	}
	for i, s := range rk.m.Specs {
		f, ok := full[s.Name]
		pl, placed := p.place[s.Name]
		if !ok || !placed {
			return fmt.Errorf("parallel: rank %d: parameter %q has no counterpart in the full model", rk.id, s.Name)
		}
		want, err := pl.split.Local(f.Shape, ntp)
		if err == nil && !slices.Equal(want, s.Shape) {
			err = fmt.Errorf("each rank should hold %v, but rank %d's model holds %v", want, rk.id, s.Shape)
		}
		if err != nil {
			return fmt.Errorf("parallel: weight %q %v: the %s tensor-parallel table places it %s: %v; the table (engine/models) and the rank's narrowed config disagree",
				s.Name, f.Shape, src.Family.ModelType, describeSplit(pl.split, ntp), err)
		}
		w := rk.m.Params.Views[i]
		if strings.HasSuffix(s.Name, ".weight") && len(s.Shape) == 2 {
			switch pl.split {
			case models.Column:
				// Weights of one parent module (q/k/v of self_attn, gate/up of mlp) share
				// their input.
				parent := strings.TrimSuffix(s.Name, ".weight")
				if i := strings.LastIndex(parent, "."); i >= 0 {
					parent = parent[:i]
				}
				colSize[parent]++
				cols = append(cols, struct {
					w     T
					group string
				}{w, parent})
			case models.Row:
				rk.rb.row[keyOf(w)] = true
			}
			if pl.expert >= 0 && (pl.split == models.Column || pl.split == models.Row) {
				rk.rb.splitExperts = true
			}
		}
		vals, err := src.ParamFloat32(s.Name)
		if err != nil {
			return err
		}
		if err := rk.m.SetParam(s.Name, slice(vals, f.Shape, pl.split, tp, ntp)); err != nil {
			return fmt.Errorf("parallel: rank %d: %w", rk.id, err)
		}
	}
	for _, c := range cols {
		rk.rb.col[keyOf(c.w)] = colInfo{group: c.group, size: colSize[c.group]}
	}
	return nil
}

// slice returns tensor rank tp's part of a full parameter (row-major, shape full).
func slice(v []float32, full []int, pl models.Split, tp, ntp int) []float32 {
	switch pl {
	case models.Column:
		n := len(v) / ntp
		return v[tp*n : (tp+1)*n]
	case models.Row:
		rows, cols := full[0], full[1]
		w := cols / ntp
		out := make([]float32, 0, rows*w)
		for r := 0; r < rows; r++ {
			out = append(out, v[r*cols+tp*w:r*cols+(tp+1)*w]...)
		}
		return out
	}
	return v
}

// unslice assembles a full parameter from its tensor-rank parts.
func unslice(parts [][]float32, full []int, pl models.Split) []float32 {
	switch pl {
	case models.Column:
		var out []float32
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	case models.Row:
		rows, cols := full[0], full[1]
		w := cols / len(parts)
		out := make([]float32, 0, rows*cols)
		for r := 0; r < rows; r++ {
			for _, p := range parts {
				out = append(out, p[r*w:(r+1)*w]...)
			}
		}
		return out
	}
	return parts[0]
}

// setupOptimizer builds rank rk's AdamW: over its whole model (replicated over the data group,
// its experts over the expert-data group), or under FSDP over its shards only.
func (p *Plan) setupOptimizer(rk *rank, oc optim.Config) error {
	m := rk.m
	counted := func(name string) bool {
		pl := p.place[name].split
		return pl == models.Column || pl == models.Row || rk.c.TP == 0
	}
	if p.lora != nil {
		p.setupLoRAOptimizer(rk)
	} else if !p.Mesh.Layout.FSDP || rk.dataN == 1 {
		for i, s := range m.Specs {
			first := rk.dataRank == 0
			if _, ok := p.expertHolder(s.Name); ok {
				// Expert parallelism: a rank holds (and updates) the experts it owns only;
				// each one's gradient is counted once, by the first of its replicas.
				first = rk.edata.Rank() == 0
			}
			rk.optElem = append(rk.optElem, 0)
			rk.optParams = append(rk.optParams, optim.Param{Name: s.Name, Value: m.Params.Views[i], Grad: m.Grads.Views[i], NoDecay: !s.Decay})
			rk.countNorm = append(rk.countNorm, counted(s.Name) && first)
		}
	} else if err := p.setupFSDP(rk, counted); err != nil {
		return err
	}
	var err error
	rk.opt, err = optim.NewAdamW(rk.dev, rk.optParams, oc)
	return err
}

// newWorld makes the plan's communicators over devs: through mk, or in process.
func newWorld(devs []backend.Backend, mk func([]backend.Backend) (comm.Fabric, error)) (comm.Fabric, error) {
	if mk == nil {
		w, err := comm.NewWorld(devs)
		if err != nil {
			return nil, err
		}
		return w.Fabric(), nil
	}
	w, err := mk(devs)
	if err != nil {
		return nil, fmt.Errorf("parallel: communicators over %d devices: %w", len(devs), err)
	}
	if w.Size() != len(devs) {
		_ = w.Close()
		return nil, fmt.Errorf("parallel: the communicator world drives %d ranks in this process; the plan has %d (a plan drives every rank of its mesh itself)", w.Size(), len(devs))
	}
	return w, nil
}

// Close frees every rank's model, optimizer and device, and the communicators.
func (p *Plan) Close() error {
	var errs []error
	if p.world != nil {
		// Communicators first: they may hold device memory and streams.
		errs = append(errs, p.world.Close())
		p.world = nil
	}
	for _, rk := range p.ranks {
		if rk.opt != nil {
			rk.opt.Free()
		}
		if rk.m != nil {
			errs = append(errs, rk.m.Close())
		}
		for _, t := range rk.shard.buffers() {
			if !t.IsNil() {
				errs = append(errs, rk.dev.Free(t))
			}
		}
		errs = append(errs, rk.dev.Close())
	}
	p.ranks = nil
	return errors.Join(errs...)
}

// spmd runs fn on every rank, one goroutine each (locked to its OS thread, as device contexts
// require), and joins their errors.
func (p *Plan) spmd(fn func(rk *rank) error) error {
	if p.failed != nil {
		return fmt.Errorf("parallel: an earlier step failed (%v); the plan's communicators are closed: build a new plan with Relayout or New", p.failed)
	}
	errs := make([]error, len(p.ranks))
	var wg sync.WaitGroup
	for i, rk := range p.ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			defer func() {
				if v := recover(); v != nil {
					errs[i] = fmt.Errorf("parallel: rank %d: panic: %v", rk.id, v)
					p.world.Abort(errs[i])
				}
			}()
			if err := fn(rk); err != nil {
				errs[i] = fmt.Errorf("rank %d: %w", rk.id, err)
				// Release the ranks waiting for this one in a collective.
				p.world.Abort(errs[i])
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		p.failed = err
		return err
	}
	return nil
}

// docStarts returns b's document boundaries (as models.Batch documents them).
func docStarts(b models.Batch) []int32 {
	n := len(b.Tokens)
	if b.DocStarts != nil {
		return b.DocStarts
	}
	cu := []int32{0}
	for i := 1; i < len(b.Positions) && len(b.Positions) == n; i++ {
		if b.Positions[i] == 0 {
			cu = append(cu, int32(i))
		}
	}
	return append(cu, int32(n))
}

func positions(cu []int32, n int) []int32 {
	pos := make([]int32, n)
	for d := 0; d+1 < len(cu); d++ {
		for i := cu[d]; i < cu[d+1] && int(i) < n; i++ {
			pos[i] = i - cu[d]
		}
	}
	return pos
}

// ForwardBackward runs one optimizer step's forward and backward over rows (packed sequences
// with targets): the rows are dealt to the data-parallel ranks in equal consecutive groups,
// context parallelism splits each row over its context ranks, and the gradients of the mean
// loss over every non-ignored target of every row are left reduced (replicated on each data
// rank, or reduce-scattered into each rank's shard under FSDP). It returns the mean loss and
// the number of targets.
func (p *Plan) ForwardBackward(rows []models.Batch) (loss float64, nTargets int, err error) {
	if err := p.checkRows(rows); err != nil {
		return 0, 0, err
	}
	for _, b := range rows {
		for _, t := range b.Targets {
			if t != backend.IgnoreIndex {
				nTargets++
			}
		}
	}
	if nTargets == 0 {
		return 0, 0, errors.New("parallel: the rows have no targets to predict (every target is ignored)")
	}
	scale := float32(1 / float64(nTargets))
	sum, err := p.runRows(rows, func(rk *rank, _ int, lb models.Batch) error {
		s, _, err := rk.m.ForwardBackward(lb, scale)
		rk.lossSum += s
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	return sum / float64(nTargets), nTargets, nil
}

// RowFunc runs the forward and backward of one row of a step on a rank's model, accumulating
// (+=) the gradient of the row's share of the step's loss: the caller's own loss, such as a
// sequence-level loss reached through models.Model.ForwardBackwardWeighted or
// ForwardBackwardScores. row is the row's index in the step. It is called on the rank's
// goroutine, concurrently for the rows of different data ranks, and by every tensor rank of a
// data rank with the same row (their models compute the same outputs); primary is true on
// exactly one of them (tensor rank 0), which alone should record results such as the loss.
type RowFunc func(m *models.Model, row int, b models.Batch, primary bool) error

// ForwardBackwardRows is ForwardBackward with the loss of each row computed by fn instead of
// the mean token cross-entropy: the rows are dealt to the data ranks as there, and the
// gradients fn accumulates are reduced over the data ranks the same way. Context parallelism
// splits a row's tokens over ranks, and fn sees whole rows, so it is refused (the caller names
// its rule); so is a plan that spans several processes.
func (p *Plan) ForwardBackwardRows(rows []models.Batch, fn RowFunc) error {
	if l := p.Mesh.Layout; l.CP > 1 {
		return fmt.Errorf("parallel: a step of row losses needs each row whole on its ranks, and context_parallel_size %d splits rows", l.CP)
	}
	if err := p.refuseMulti("a step of row losses (ForwardBackwardRows)"); err != nil {
		return err
	}
	if err := p.checkRows(rows); err != nil {
		return err
	}
	_, err := p.runRows(rows, func(rk *rank, i int, lb models.Batch) error {
		return fn(rk.m, i, lb, rk.c.TP == 0)
	})
	return err
}

// checkRows validates a step's rows before any rank runs them.
func (p *Plan) checkRows(rows []models.Batch) error {
	l := p.Mesh.Layout
	if len(rows) == 0 || len(rows)%l.DP != 0 {
		return fmt.Errorf("parallel: %d rows do not split over data_parallel_size %d; give a multiple of %d rows", len(rows), l.DP, l.DP)
	}
	for i, b := range rows {
		if b.Targets == nil {
			return fmt.Errorf("parallel: row %d has no targets", i)
		}
		if err := mesh.CheckSeqLen(l, len(b.Tokens)); err != nil {
			return fmt.Errorf("parallel: row %d: %w", i, err)
		}
		if err := p.checkRow(b); err != nil {
			return fmt.Errorf("parallel: row %d: %w", i, err)
		}
	}
	return nil
}

// runRows deals rows over the data ranks and runs fn on each rank for each of its rows (the
// rank's chunks of the row under context parallelism), then reduces the gradients. It returns
// the sum of the ranks' lossSum (each tensor group's rank 0), which fn may add to.
func (p *Plan) runRows(rows []models.Batch, fn func(rk *rank, row int, lb models.Batch) error) (sum float64, err error) {
	l := p.Mesh.Layout
	per := len(rows) / l.DP
	moe := p.shape.MoE()
	err = p.spmd(func(rk *rank) error {
		rk.lossSum, rk.auxSum = 0, 0
		if err := rk.m.ZeroGrads(); err != nil {
			return err
		}
		// Layers rebuilt since the last step (EnableGrads, a recompute switch) have lost
		// their expert runners; running them locally would be silently wrong.
		p.setRunners(rk)
		if moe {
			// As engine/train does: the objective is the mean over the step's rows (its
			// micro-batches) of CE + coef * aux.
			rk.m.SetAuxLossScale(p.auxCoef / float64(len(rows)))
			rk.m.TakeExpertLoad() // count this step's rows only
		}
		for j, b := range rows[rk.c.DP*per : (rk.c.DP+1)*per] {
			if p.lora != nil {
				// Row i of the step draws the dropout masks of micro-batch i on one device.
				rk.m.SetDropoutKey(p.lora.dropoutKey + uint64(rk.c.DP*per+j))
			}
			lb := b
			rk.rb.geom = nil
			if l.CP > 1 {
				cu := docStarts(b)
				g := &cpGeom{cu: cu, chunk: len(b.Tokens) / (2 * l.CP), cp: l.CP}
				pos := b.Positions
				if pos == nil {
					pos = positions(cu, len(b.Tokens))
				}
				lb = models.Batch{}
				for _, c := range g.chunksOf(rk.c.CP) {
					lo, hi := c*g.chunk, (c+1)*g.chunk
					lb.Tokens = append(lb.Tokens, b.Tokens[lo:hi]...)
					lb.Positions = append(lb.Positions, pos[lo:hi]...)
					lb.Targets = append(lb.Targets, b.Targets[lo:hi]...)
				}
				rk.rb.geom = g
			}
			clear(rk.rb.pending)
			err := fn(rk, rk.c.DP*per+j, lb)
			rk.rb.geom = nil
			if err != nil {
				return err
			}
			if moe {
				rk.auxSum += rk.m.AuxLoss()
			}
		}
		if err := rk.m.SettleGrads(); err != nil {
			return err
		}
		if err := p.reduceGrads(rk); err != nil {
			return err
		}
		if p.mp != nil {
			return p.shareSums(rk)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	aux := 0.0
	for _, rk := range p.ranks {
		if rk.c.TP == 0 {
			sum += rk.lossSum
			aux += rk.auxSum
		}
	}
	if p.mp != nil {
		// Every process adds every rank's sums and loads, in rank order.
		sum, aux, p.load = p.worldSums()
	} else if p.load, err = p.takeLoads(); err != nil {
		return 0, err
	}
	p.aux = aux / float64(len(rows))
	if p.lora != nil {
		p.lora.dropoutKey += uint64(len(rows))
	}
	return sum, nil
}

// checkRow validates a row on the host before any rank runs it, so that bad input is an error
// of the call rather than of one rank in the middle of a step.
func (p *Plan) checkRow(b models.Batch) error {
	v := int32(p.shape.Vocab)
	if len(b.Targets) != len(b.Tokens) || len(b.Tokens) == 0 {
		return fmt.Errorf("%d tokens and %d targets; give one target per token", len(b.Tokens), len(b.Targets))
	}
	if b.Positions != nil && len(b.Positions) != len(b.Tokens) {
		return fmt.Errorf("%d positions for %d tokens", len(b.Positions), len(b.Tokens))
	}
	for i, t := range b.Tokens {
		if t < 0 || t >= v {
			return fmt.Errorf("token %d at position %d is outside the vocabulary [0,%d)", t, i, v)
		}
		if g := b.Targets[i]; g != backend.IgnoreIndex && (g < 0 || g >= v) {
			return fmt.Errorf("target %d at position %d is outside the vocabulary [0,%d) (use %d to ignore a position)", g, i, v, backend.IgnoreIndex)
		}
	}
	if cu := b.DocStarts; cu != nil {
		if len(cu) < 2 || cu[0] != 0 || int(cu[len(cu)-1]) != len(b.Tokens) {
			return fmt.Errorf("DocStarts must start at 0 and end at %d (the token count), got %v", len(b.Tokens), cu[:min(len(cu), 8)])
		}
		for d := 1; d < len(cu); d++ {
			if cu[d] <= cu[d-1] {
				return fmt.Errorf("DocStarts must be strictly increasing, got %v at document %d", cu[d-1:d+1], d-1)
			}
		}
	}
	return nil
}

// SetWeightDecay changes AdamW's decoupled weight decay on every rank for following steps.
func (p *Plan) SetWeightDecay(wd float64) {
	for _, rk := range p.ranks {
		rk.opt.SetWeightDecay(wd)
	}
}

// Steps is the number of optimizer steps taken (the same on every rank).
func (p *Plan) Steps() int { return p.ranks[0].opt.Steps() }

// AuxLoss is the mean router load-balancing loss over the rows of the last ForwardBackward
// (0 for dense models).
func (p *Plan) AuxLoss() float64 { return p.aux }

// reduceGrads completes the gradients after the last micro-batch: partial tensor-parallel
// gradients are summed over the tensor group, then every gradient over the data group
// (all-reduce, or reduce-scatter into the shard under FSDP).
func (p *Plan) reduceGrads(rk *rank) error {
	m := rk.m
	if rk.tp.Size() > 1 {
		for i, s := range m.Specs {
			if p.place[s.Name].split == models.PerHead {
				if err := rk.tp.AllReduce(m.Grads.Views[i], comm.Sum); err != nil {
					return err
				}
			}
		}
	}
	if rk.dataN == 1 {
		return nil
	}
	if p.lora != nil {
		return rk.data.AllReduce(m.TrainableGrads(), comm.Sum)
	}
	if !rk.shard.on {
		if p.Mesh.Layout.EP > 1 {
			return p.reduceExpertGrads(rk)
		}
		return rk.data.AllReduce(m.Grads.Flat, comm.Sum)
	}
	return p.reduceScatterGrads(rk)
}

// Step applies AdamW with learning rate lr on every rank, after clipping the global gradient
// norm to maxNorm (0: no clipping). It returns the global gradient norm (before clipping).
// Under FSDP each rank updates its shard and the parameters are all-gathered for the next step.
func (p *Plan) Step(lr, maxNorm float64) (gradNorm float64, err error) {
	norms := make([]float64, len(p.ranks))
	err = p.spmd(func(rk *rank) error {
		var ts []T
		for i, op := range rk.optParams {
			if rk.countNorm[i] {
				ts = append(ts, op.Grad)
			}
		}
		local := 0.0
		if len(ts) > 0 {
			ss, err := rk.dev.SumSquares(ts)
			if err != nil {
				return err
			}
			for _, v := range ss {
				local += v
			}
		}
		total, err := allReduceF64(rk.world, local)
		if err != nil {
			return err
		}
		norm := math.Sqrt(total)
		norms[rk.id-p.ranks[0].id] = norm
		if math.IsNaN(norm) || math.IsInf(norm, 0) {
			return fmt.Errorf("parallel: gradient norm is %v; the step is skipped", norm)
		}
		if err := rk.opt.Step(lr, optim.ClipCoef(norm, maxNorm)); err != nil {
			return err
		}
		if !rk.shard.on {
			return nil
		}
		return p.gatherParams(rk)
	})
	return norms[0], err
}

// allReduceF64 sums one float64 over c's group without losing it to float32: each value
// travels as a float32 pair (high part, remainder).
func allReduceF64(c comm.Communicator, v float64) (float64, error) {
	hi := float32(v)
	lo := float32(v - float64(hi))
	t, err := backend.FromFloat32(c.Backend(), []float32{hi, lo}, tensor.F32, 2)
	if err != nil {
		return 0, err
	}
	defer c.Backend().Free(t)
	if err := c.AllReduce(t, comm.Sum); err != nil {
		return 0, err
	}
	out, err := backend.ToFloat32(c.Backend(), t)
	if err != nil {
		return 0, err
	}
	return float64(out[0]) + float64(out[1]), nil
}

// Params returns every parameter of the full model by HF name, assembled from the ranks. On a
// plan over several processes whose expert group spans processes it is a collective (the
// experts are all-gathered over the expert groups; see LocalRanks).
func (p *Plan) Params() (map[string][]float32, error) {
	return p.collect(func(m *models.Model, name string) ([]float32, error) { return m.ParamFloat32(name) })
}

// Grads returns every reduced gradient of the full model by HF name (after ForwardBackward);
// of a model with LoRA adapters, the adapters' (AdapterGrads).
// On a plan over several processes it is a collective under FSDP or when an expert group
// spans processes.
func (p *Plan) Grads() (map[string][]float32, error) {
	if p.lora != nil {
		return p.AdapterGrads() // the frozen base has none
	}
	if p.Mesh.Layout.FSDP {
		// Bring the reduced shards back into each rank's full gradient arena.
		if err := p.spmd(func(rk *rank) error {
			if !rk.shard.on {
				return nil
			}
			return p.gatherGrads(rk)
		}); err != nil {
			return nil, err
		}
	}
	return p.collect(func(m *models.Model, name string) ([]float32, error) { return m.GradFloat32(name) })
}

func (p *Plan) collect(get func(*models.Model, string) ([]float32, error)) (map[string][]float32, error) {
	// tpRanks[d] are the ranks of data index d, in tensor order; owner[j] is the first data
	// index whose ranks hold the experts of expert rank j (d mod EP = j).
	tpRanks := map[int][]*rank{}
	owner := map[int]int{}
	for _, rk := range p.ranks {
		tpRanks[rk.dataRank] = append(tpRanks[rk.dataRank], rk)
		if j := rk.dataRank % p.Mesh.Layout.EP; rk.c.TP == 0 {
			if d, ok := owner[j]; !ok || rk.dataRank < d {
				owner[j] = rk.dataRank
			}
		}
	}
	var experts []map[string][]float32
	if p.spansExperts() {
		// Other processes hold some experts: all-gather them over the expert groups.
		var err error
		if experts, err = p.expertsByTP(get); err != nil {
			return nil, err
		}
	}
	out := make(map[string][]float32, len(p.specs))
	for _, s := range p.specs {
		if _, ok := p.expertHolder(s.Name); ok && experts != nil {
			parts := make([][]float32, len(experts))
			for tp, m := range experts {
				if parts[tp] = m[s.Name]; parts[tp] == nil {
					return nil, fmt.Errorf("parallel: no rank of the expert group of tensor coordinate %d holds %s", tp, s.Name)
				}
			}
			out[s.Name] = unslice(parts, s.Shape, p.place[s.Name].split)
			continue
		}
		// Every data replica holds the same values: read this process's first one (data
		// index 0 when the plan drives every rank).
		holder := p.ranks[0].dataRank
		if j, ok := p.expertHolder(s.Name); ok {
			// Only the expert's owners hold it; all of its replicas hold the same values.
			d, ok := owner[j]
			if !ok {
				return nil, fmt.Errorf("parallel: no rank of this process holds %s (expert rank %d)", s.Name, j)
			}
			holder = d
		}
		tpRanks := tpRanks[holder]
		parts := make([][]float32, len(tpRanks))
		for i, rk := range tpRanks {
			v, err := get(rk.m, s.Name)
			if err != nil {
				return nil, err
			}
			parts[i] = v
		}
		out[s.Name] = unslice(parts, s.Shape, p.place[s.Name].split)
	}
	return out, nil
}

// Gather writes the full parameters into dst, a single-device model of the same config (for
// an ordinary HF checkpoint: dst.Save). It reads what Params reads, so it is a collective
// where Params is.
func (p *Plan) Gather(dst *models.Model) error {
	ps, err := p.Params()
	if err != nil {
		return err
	}
	for _, s := range p.specs {
		if err := dst.SetParam(s.Name, ps[s.Name]); err != nil {
			return fmt.Errorf("parallel: gather: %w", err)
		}
	}
	if err := copyBalancing(dst, p.ranks[0].m); err != nil {
		return fmt.Errorf("parallel: gather: expert balancing: %w", err)
	}
	if err := p.gatherLoRA(dst); err != nil {
		return fmt.Errorf("parallel: gather: adapters: %w", err)
	}
	return nil
}

// CommStats returns each world rank's collective totals over every group it belongs to.
func (p *Plan) CommStats() []comm.Stats {
	out := make([]comm.Stats, len(p.ranks))
	for i, rk := range p.ranks {
		s := comm.Stats{}
		for _, c := range rk.comms() {
			for k, v := range c.Stats() {
				t := s[k]
				t.Calls += v.Calls
				t.Bytes += v.Bytes
				t.Time += v.Time
				s[k] = t
			}
		}
		out[i] = s
	}
	return out
}

// SetRecorder records every collective of every rank into r (nil stops recording). One
// recorder shared by all ranks sees their spans interleaved; for per-device step breakdowns
// give each rank its own with SetRankRecorder.
func (p *Plan) SetRecorder(r comm.Recorder) {
	for i := range p.ranks {
		p.SetRankRecorder(i, r)
	}
}

// SetRankRecorder records the collectives of world rank r into rec (engine/profile's *Recorder,
// for collective spans beside the compute spans of a profile.Wrap'ed device from
// Options.NewBackend); nil stops recording.
func (p *Plan) SetRankRecorder(r int, rec comm.Recorder) {
	for _, c := range p.ranks[r].comms() {
		c.SetRecorder(rec)
	}
}

// Size is the number of ranks.
func (p *Plan) Size() int { return len(p.ranks) }

// Placement reports how parameter name is laid out over the tensor group under this plan's
// layout: the family table's split, or models.Replicated with one tensor rank and for a routed
// expert's weights under etp = 1.
func (p *Plan) Placement(name string) models.Split { return p.place[name].split }
