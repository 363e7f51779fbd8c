package parallel

import (
	"fmt"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"

	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/optim"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// stateSuffixes are the optimizer state tensors per parameter (optim.StateTensor names).
var stateSuffixes = []string{".exp_avg", ".exp_avg_sq", ".master"}

// OptimizerState returns the optimizer state of the whole model in the layout-free form a
// single-device optim.AdamW exports: one tensor per parameter and kind, named
// "<param>.exp_avg", "<param>.exp_avg_sq" (and ".master"), shaped like the full parameter. It
// is what a checkpoint stores and what LoadOptimizerState reads into any other layout.
//
// On a plan over several processes (Options.Local) it is a collective: every process must
// call it, between the same steps. Under FSDP the optimizer shards are all-gathered over each
// data group, and under expert parallelism the experts other processes hold over the expert
// groups; every process then returns the same state, bit for bit the state a single process
// driving every rank returns.
func (p *Plan) OptimizerState() (step int, out []optim.StateTensor, err error) {
	ntp := p.Mesh.Layout.TP
	// local[tp][param+suffix] is tensor rank tp's slice of one parameter's state, assembled
	// from the pieces of the ranks that hold it (its shards under FSDP).
	local := make([]map[string]*state, ntp)
	for i := range local {
		local[i] = map[string]*state{}
	}
	kinds := map[string]bool{}
	if p.mp != nil {
		if step, err = p.multiState(local, kinds); err != nil {
			return 0, nil, err
		}
		return p.assembleState(step, local, kinds)
	}
	for _, rk := range p.ranks {
		if !rk.shard.on && rk.edata.Rank() != 0 {
			continue // replicated over the (expert-)data group: one copy is enough
		}
		st, ts, err := rk.opt.Export()
		if err != nil {
			return 0, nil, fmt.Errorf("parallel: rank %d: %w", rk.id, err)
		}
		step = st
		byName := make(map[string]optim.StateTensor, len(ts))
		for _, t := range ts {
			byName[t.Name] = t
		}
		size := p.sizesOf(rk.m)
		for i, op := range rk.optParams {
			for _, suf := range stateSuffixes {
				t, ok := byName[op.Name+suf]
				if !ok {
					continue
				}
				kinds[suf] = true
				f := local[rk.c.TP][op.Name+suf]
				if f == nil {
					f = &state{dt: t.DType, vals: make([]float32, size[op.Name])}
					local[rk.c.TP][op.Name+suf] = f
				}
				v, err := tensor.DecodeFloat32(t.DType, t.Data)
				if err != nil {
					return 0, nil, err
				}
				copy(f.vals[rk.optElem[i]:], v)
			}
		}
	}
	return p.assembleState(step, local, kinds)
}

// state is one parameter's optimizer state of one kind on one tensor rank.
type state struct {
	dt   tensor.DType
	vals []float32
}

// assembleState joins every tensor rank's slices into the layout-free state.
func (p *Plan) assembleState(step int, local []map[string]*state, kinds map[string]bool) (_ int, out []optim.StateTensor, _ error) {
	ntp := p.Mesh.Layout.TP
	for _, fs := range p.trainedSpecs() {
		for _, suf := range stateSuffixes {
			if !kinds[suf] {
				continue
			}
			parts := make([][]float32, ntp)
			var dt tensor.DType
			for tp := range parts {
				f := local[tp][fs.Name+suf]
				if f == nil {
					return 0, nil, fmt.Errorf("parallel: no rank holds the optimizer state %s of tensor rank %d", fs.Name+suf, tp)
				}
				parts[tp], dt = f.vals, f.dt
			}
			raw, err := tensor.EncodeFloat32(dt, unslice(parts, fs.Shape, p.place[fs.Name].split))
			if err != nil {
				return 0, nil, err
			}
			out = append(out, optim.StateTensor{Name: fs.Name + suf, DType: dt, Shape: append([]int(nil), fs.Shape...), Data: raw})
		}
	}
	return step, out, nil
}

// LoadOptimizerState replaces the optimizer state of every rank with the layout-free state ts
// (from OptimizerState of any layout, or a single-device optim.AdamW Export): each rank keeps
// its slice (tensor split), its experts (expert parallel) and its shard (FSDP). The step count
// is restored too.
func (p *Plan) LoadOptimizerState(step int, ts []optim.StateTensor) error {
	full := make(map[string]optim.StateTensor, len(ts))
	for _, t := range ts {
		full[t.Name] = t
	}
	specs := make(map[string]models.ParamSpec, len(p.trainedSpecs()))
	for _, s := range p.trainedSpecs() {
		specs[s.Name] = s
	}
	ntp := p.Mesh.Layout.TP
	return p.spmd(func(rk *rank) error {
		var mine []optim.StateTensor
		for i, op := range rk.optParams {
			fs := specs[op.Name]
			for _, suf := range stateSuffixes {
				t, ok := full[op.Name+suf]
				if !ok {
					continue
				}
				v, err := tensor.DecodeFloat32(t.DType, t.Data)
				if err != nil {
					return fmt.Errorf("parallel: optimizer state %s: %w", t.Name, err)
				}
				if len(v) != numel(fs.Shape) {
					return fmt.Errorf("parallel: optimizer state %s has %d elements, parameter %s has %d (shape %v)", t.Name, len(v), op.Name, numel(fs.Shape), fs.Shape)
				}
				sl := slice(v, fs.Shape, p.place[op.Name].split, rk.c.TP, ntp)
				n := op.Value.Numel()
				raw, err := tensor.EncodeFloat32(t.DType, sl[rk.optElem[i]:rk.optElem[i]+n])
				if err != nil {
					return err
				}
				mine = append(mine, optim.StateTensor{Name: op.Name + suf, DType: t.DType, Shape: op.Value.Shape().Clone(), Data: raw})
			}
		}
		return rk.opt.Import(step, mine)
	})
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// Relayout returns a new plan of the same model in layout l on devices d, carrying the current
// parameters and optimizer state over in memory (gathered, then resliced and resharded). An
// invalid layout is refused with the *mesh.LayoutError before anything changes, and p stays
// usable; on success p is closed.
func (p *Plan) Relayout(d mesh.Devices, l mesh.Layout, o Options) (*Plan, error) {
	if err := p.refuseMulti("Relayout"); err != nil {
		return nil, err
	}
	if err := mesh.Check(l.Norm(d.Len()), d.Len(), p.shape, 0); err != nil {
		return nil, err
	}
	staging, err := models.New(p.cfg, cpu.New(cpu.Options{}), models.Options{DType: p.dtype, NumLabels: p.labels})
	if err != nil {
		return nil, err
	}
	staging.Arch.PadID = p.padID
	defer func() {
		b := staging.Backend()
		staging.Close()
		b.Close()
	}()
	if err := p.Gather(staging); err != nil {
		return nil, err
	}
	staging.SetAuxLossScale(p.auxCoef) // the run's weight, which may differ from config.json's
	step, st, err := p.OptimizerState()
	if err != nil {
		return nil, err
	}
	np, err := New(staging, d, l, o)
	if err != nil {
		return nil, err
	}
	if err := np.LoadOptimizerState(step, st); err != nil {
		np.Close()
		return nil, err
	}
	p.Close()
	return np, nil
}
