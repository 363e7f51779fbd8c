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
func (p *Plan) OptimizerState() (step int, out []optim.StateTensor, err error) {
	// Per tensor rank: the local flat state of each kind, assembled from the data ranks' pieces.
	type flat struct {
		dt   tensor.DType
		vals []float32
	}
	ntp := p.Mesh.Layout.TP
	local := make([]map[string]*flat, ntp)
	for i := range local {
		local[i] = map[string]*flat{}
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
		byName := map[string]optim.StateTensor{}
		for _, t := range ts {
			byName[t.Name] = t
		}
		total := rk.m.Params.Flat.Numel()
		for i, op := range rk.optParams {
			for _, suf := range stateSuffixes {
				t, ok := byName[op.Name+suf]
				if !ok {
					continue
				}
				f := local[rk.c.TP][suf]
				if f == nil {
					f = &flat{dt: t.DType, vals: make([]float32, total)}
					local[rk.c.TP][suf] = f
				}
				v, err := tensor.DecodeFloat32(t.DType, t.Data)
				if err != nil {
					return 0, nil, err
				}
				copy(f.vals[rk.optOff[i]:], v)
			}
		}
	}
	specs := p.ranks[0].m.Specs
	offs := map[string]int{}
	off := 0
	for _, s := range specs {
		offs[s.Name] = off
		off += s.Numel()
	}
	for _, fs := range p.specs {
		for _, suf := range stateSuffixes {
			if local[0][suf] == nil {
				continue
			}
			parts := make([][]float32, ntp)
			o, n := offs[fs.Name], numel(fs.Shape)
			if pl := p.place[fs.Name]; pl == colShard || pl == rowShard {
				n /= ntp
			}
			for tp := range parts {
				parts[tp] = local[tp][suf].vals[o : o+n]
			}
			dt := local[0][suf].dt
			raw, err := tensor.EncodeFloat32(dt, unslice(parts, fs.Shape, p.place[fs.Name]))
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
// its slice (tensor split) and its shard (FSDP). The step count is restored too.
func (p *Plan) LoadOptimizerState(step int, ts []optim.StateTensor) error {
	full := map[string]optim.StateTensor{}
	for _, t := range ts {
		full[t.Name] = t
	}
	ntp := p.Mesh.Layout.TP
	return p.spmd(func(rk *rank) error {
		// Local flat state of each kind for this tensor rank.
		flats := map[string][]float32{}
		dts := map[string]tensor.DType{}
		off := 0
		for _, s := range rk.m.Specs {
			for _, suf := range stateSuffixes {
				t, ok := full[s.Name+suf]
				if !ok {
					continue
				}
				v, err := tensor.DecodeFloat32(t.DType, t.Data)
				if err != nil {
					return fmt.Errorf("parallel: optimizer state %s: %w", t.Name, err)
				}
				fs := p.fullSpec(s.Name)
				if len(v) != numel(fs.Shape) {
					return fmt.Errorf("parallel: optimizer state %s has %d elements, parameter %s has %d (shape %v)", t.Name, len(v), s.Name, numel(fs.Shape), fs.Shape)
				}
				if flats[suf] == nil {
					flats[suf] = make([]float32, rk.m.Params.Flat.Numel())
					dts[suf] = t.DType
				}
				copy(flats[suf][off:], slice(v, fs.Shape, p.place[s.Name], rk.c.TP, ntp))
			}
			off += s.Numel()
		}
		var mine []optim.StateTensor
		for i, op := range rk.optParams {
			for _, suf := range stateSuffixes {
				f := flats[suf]
				if f == nil {
					continue
				}
				n := op.Value.Numel()
				raw, err := tensor.EncodeFloat32(dts[suf], f[rk.optOff[i]:rk.optOff[i]+n])
				if err != nil {
					return err
				}
				mine = append(mine, optim.StateTensor{Name: op.Name + suf, DType: dts[suf], Shape: op.Value.Shape().Clone(), Data: raw})
			}
		}
		return rk.opt.Import(step, mine)
	})
}

func (p *Plan) fullSpec(name string) models.ParamSpec {
	for _, s := range p.specs {
		if s.Name == name {
			return s
		}
	}
	return models.ParamSpec{}
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
	if err := mesh.Check(l.Norm(d.Len()), d.Len(), p.shape, 0); err != nil {
		return nil, err
	}
	staging, err := models.New(p.cfg, cpu.New(cpu.Options{}), models.Options{DType: p.dtype})
	if err != nil {
		return nil, err
	}
	defer func() {
		b := staging.Backend()
		staging.Close()
		b.Close()
	}()
	if err := p.Gather(staging); err != nil {
		return nil, err
	}
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
