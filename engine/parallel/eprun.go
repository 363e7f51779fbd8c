package parallel

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// epRunner computes the experts of one MoE block under expert parallelism (nn.ExpertRunner):
// the block's tokens go to their experts' owners in the expert group (ExpertRoute.Dispatch),
// each owner runs its experts over what it received, grouped by expert (nn.ExpertGroup), and
// the results come back (Combine), where they are weighted by the router and summed over each
// token's slots on the host. Backward runs the same exchanges in reverse order for the
// gradients. Every rank of the expert group runs each exchange of each layer in the same order,
// which the plan guarantees by giving every rank the same number of micro-batches.
//
// Cached for backward (keep): the route, the expert group's caches, and a host copy of the
// combined unweighted results [N·K, C] (for the gradient of the routing weights).
type epRunner struct {
	c     comm.Communicator // the expert group
	g     nn.ExpertGroup
	route *ExpertRoute
	back  []float32 // [N·K·C] Combine's output
}

var _ nn.ExpertRunner = (*epRunner)(nil)

// Forward implements nn.ExpertRunner.
func (r *epRunner) Forward(p *nn.Pass, m *nn.MoE, x T, keep bool) (out T, err error) {
	rt := m.Routing()
	n, c := x.Dim(0), x.Dim(1)
	route, err := NewExpertRoute(r.c, rt.Sel, rt.N, rt.K, rt.E)
	if err != nil {
		return T{}, fmt.Errorf("parallel: %s: %w", m.Name, err)
	}
	b := r.c.Backend()
	recv, err := route.Dispatch(x)
	if err != nil {
		return T{}, fmt.Errorf("parallel: %s: dispatch: %w", m.Name, err)
	}
	defer b.Free(recv)
	rows := route.Received()
	src := make([]int32, rows)
	for i := range src {
		src[i] = int32(i)
	}
	r.g = nn.ExpertGroup{Name: m.Name, Experts: m.Experts, First: m.FirstExpert}
	y, err := r.g.Forward(p, recv, src, route.RecvExperts, nil, keep)
	if err != nil {
		return T{}, err
	}
	defer b.Free(y)
	back, err := route.Combine(y)
	if err != nil {
		r.g.Release(p)
		return T{}, fmt.Errorf("parallel: %s: combine: %w", m.Name, err)
	}
	bv, err := backend.ToFloat32(b, back)
	_ = b.Free(back)
	if err != nil {
		r.g.Release(p)
		return T{}, err
	}
	k := rt.K
	ov := make([]float32, n*c)
	for t := 0; t < n; t++ {
		o := ov[t*c : (t+1)*c]
		for j := 0; j < k; j++ {
			w := rt.Weights[t*k+j]
			row := bv[(t*k+j)*c : (t*k+j+1)*c]
			for i, v := range row {
				o[i] += w * v
			}
		}
	}
	if out, err = p.B.Alloc(p.DType, n, c); err != nil {
		r.g.Release(p)
		return T{}, err
	}
	if err = upload(p.B, out, ov); err != nil {
		_ = p.B.Free(out)
		r.g.Release(p)
		return T{}, err
	}
	if keep {
		r.route, r.back = route, bv
	}
	return out, nil
}

// Backward implements nn.ExpertRunner.
func (r *epRunner) Backward(p *nn.Pass, m *nn.MoE, dy T) (dx T, dw []float64, err error) {
	defer r.Release(p)
	if r.route == nil {
		return T{}, nil, fmt.Errorf("parallel: %s: expert Backward without a cached Forward", m.Name)
	}
	rt := m.Routing()
	n, c, k := dy.Dim(0), dy.Dim(1), rt.K
	b := r.c.Backend()
	dyv, err := backend.ToFloat32(b, dy)
	if err != nil {
		return T{}, nil, err
	}
	dw = make([]float64, n*k)
	db := make([]float32, n*k*c)
	for t := 0; t < n; t++ {
		g := dyv[t*c : (t+1)*c]
		for j := 0; j < k; j++ {
			a := t*k + j
			w := rt.Weights[a]
			row := r.back[a*c : (a+1)*c]
			dot := 0.0
			for i, v := range g {
				dot += float64(v) * float64(row[i])
				db[a*c+i] = w * v
			}
			dw[a] = dot
		}
	}
	dback, err := b.Alloc(dy.DType(), max(n*k, 1), c)
	if err != nil {
		return T{}, nil, err
	}
	defer b.Free(dback)
	if err := upload(b, dback, db); err != nil {
		return T{}, nil, err
	}
	dRecv, err := r.route.CombineBackward(dback)
	if err != nil {
		return T{}, nil, fmt.Errorf("parallel: %s: combine backward: %w", m.Name, err)
	}
	defer b.Free(dRecv)
	dxr, _, err := r.g.Backward(p, dRecv)
	if err != nil {
		return T{}, nil, err
	}
	defer b.Free(dxr)
	if dx, err = r.route.DispatchBackward(dxr); err != nil {
		return T{}, nil, fmt.Errorf("parallel: %s: dispatch backward: %w", m.Name, err)
	}
	return dx, dw, nil
}

// Release implements nn.ExpertRunner.
func (r *epRunner) Release(p *nn.Pass) {
	r.g.Release(p)
	r.route, r.back = nil, nil
}

func upload(b backend.Backend, dst T, v []float32) error {
	if len(v) == 0 {
		return nil
	}
	d, err := dst.Rows(0, len(v)/dst.Dim(1))
	if err != nil {
		return err
	}
	raw, err := tensor.EncodeFloat32(d.DType(), v)
	if err != nil {
		return err
	}
	return b.Upload(d, raw)
}

// expertOf returns the routed expert a parameter of the full model belongs to, as the
// family's tensor-parallel table places it, and false for every other parameter.
func (p *Plan) expertOf(name string) (int, bool) {
	pl, ok := p.place[name]
	return pl.expert, ok && pl.expert >= 0
}

// expertHolder returns the data index (within the expert group's block 0) of the rank that
// owns parameter name under expert parallelism without FSDP, and whether it is an expert's.
func (p *Plan) expertHolder(name string) (int, bool) {
	l := p.Mesh.Layout
	if l.EP <= 1 || p.shape.Experts == 0 {
		return 0, false
	}
	x, ok := p.expertOf(name)
	if !ok {
		return 0, false
	}
	return ExpertOwner(x, p.shape.Experts, l.EP), true
}

// heldExperts is the range of experts rank rk's model holds: its expert group's block under
// expert parallelism, else every expert.
func (p *Plan) heldExperts(rk *rank) models.ExpertRange {
	ep := p.Mesh.Layout.EP
	if ep <= 1 || p.shape.Experts == 0 {
		return models.ExpertRange{}
	}
	per := p.shape.Experts / ep
	j := rk.ep.Rank()
	return models.ExpertRange{Lo: j * per, Hi: (j + 1) * per}
}

// setRunners hands every MoE block of rank rk's model to an expert-parallel runner.
func (p *Plan) setRunners(rk *rank) {
	if p.Mesh.Layout.EP <= 1 {
		return
	}
	for _, l := range rk.m.MoELayers() {
		l.Runner = &epRunner{c: rk.ep}
	}
}

// comms are every communicator of the rank, for statistics and recording.
func (rk *rank) comms() []comm.Communicator {
	return []comm.Communicator{rk.world, rk.tp, rk.cp, rk.data, rk.ep, rk.edata}
}

// reduceExpertGrads sums gradients without FSDP under expert parallelism: the parameters that
// are not experts' over the data group, as without EP; the rank's experts (the only ones its
// model holds) over the expert-data group (their replicas), since the expert group's tokens
// already reached them through the dispatch. Consecutive parameters of one kind are reduced as
// one view of the flat gradient arena.
func (p *Plan) reduceExpertGrads(rk *rank) error {
	m := rk.m
	flush := func(expert bool, lo, hi int) error {
		if hi <= lo {
			return nil
		}
		v, err := m.Grads.Flat.View(lo, hi-lo)
		if err != nil {
			return err
		}
		c := rk.data
		if expert {
			c = rk.edata
		}
		if c.Size() == 1 {
			return nil
		}
		return c.AllReduce(v, comm.Sum)
	}
	cur, lo, off := false, 0, 0
	for _, s := range m.Specs {
		_, k := p.expertHolder(s.Name)
		if k != cur {
			if err := flush(cur, lo, off); err != nil {
				return err
			}
			cur, lo = k, off
		}
		off += s.Numel()
	}
	return flush(cur, lo, off)
}
