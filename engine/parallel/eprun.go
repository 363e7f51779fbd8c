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
	back  []float32    // [N·K·C] Combine's output
	dev   *sortedRoute // the device path's cache (ForwardSorted)
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
	if r.dev != nil {
		r.dev.release(p.B)
		r.dev = nil
	}
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
	offs := m.Grads.Offs
	cur, lo, off := false, 0, 0
	for i, s := range m.Specs {
		_, k := p.expertHolder(s.Name)
		if k != cur {
			if err := flush(cur, lo, off); err != nil {
				return err
			}
			cur, lo = k, offs[i]
		}
		off = offs[i] + s.Numel()
	}
	return flush(cur, lo, off)
}

// The device path under expert parallelism (nn.SortedRunner). The block routes and sorts its
// N tokens' S = N·K slots by global expert on the device (MoERoute, MoEPermute); experts are
// owned in contiguous blocks of E_l = E/EP, so the sorted rows are also grouped by owner. The
// runner then:
//
//	counts [E] --all-to-all--> recvCounts [EP, E_l]   rows of each local expert from each rank
//	one download of counts and recvCounts             the only host read of the layer
//	xs [S,C] --all-to-all (dispatch)--> recv [M,C]    grouped by source rank, then expert
//	MoEPermute(E_l, rsel, recv) -> rxs [M,C]           by local expert, then source rank
//	GroupedExperts(rxs) -> rys [M,C]
//	MoEPermuteBackward(rys, rslot) -> back [M,C]       source-rank order again
//	back --all-to-all (combine)--> ys [S,C]            the block's sorted order
//
// rsel [M,1] I32 (each received row's local expert) is made on the host from recvCounts and
// uploaded. The backward runs the same exchanges for the gradients, with the split sizes of
// the forward: no host read. Cached for backward (keep): the splits, rsel, rslot, the local
// offsets and the received rows rxs (M·C), plus the experts' gate|up rows.
type sortedRoute struct {
	send, recv []int // rows to and from each rank of the expert group
	m          int   // rows received (M)
	rsel       T     // [M,1] I32 local expert of each received row, in arrival order
	roff, rslt T     // [E_l+1] I32 offsets of rxs; [M,1] I32 position of each received row in rxs
	rxs        T     // [M,C] received rows sorted by local expert
	experts    nn.GroupedExperts
}

func (s *sortedRoute) release(b backend.Backend) {
	s.experts.Release(b)
	freeAll(b, &s.rsel, &s.roff, &s.rslt, &s.rxs)
}

// freeAll frees tensors and zeroes them; zero tensors are skipped.
func freeAll(b backend.Backend, ts ...*T) {
	for _, t := range ts {
		if !t.IsNil() {
			_ = b.Free(*t)
		}
		*t = T{}
	}
}

var _ nn.SortedRunner = (*epRunner)(nil)

// splits reads this rank's per-expert counts and the counts the other ranks send it (one
// download) and returns the row splits of the exchange and the received rows' local experts.
func (r *epRunner) splits(p *nn.Pass, m *nn.MoE, counts T) (send, recv []int, rsel []int32, err error) {
	b, ep, e := p.B, r.c.Size(), m.Routed()
	el := e / ep
	stat, err := b.Alloc(tensor.I32, 2*e)
	if err != nil {
		return nil, nil, nil, err
	}
	defer b.Free(stat)
	mine, _ := stat.View(0, e)
	theirs, _ := stat.View(e, e, 1)
	if err = b.Copy(mine, counts); err != nil {
		return nil, nil, nil, err
	}
	src, err := counts.Reshape(e, 1)
	if err != nil {
		return nil, nil, nil, err
	}
	per := make([]int, ep)
	for j := range per {
		per[j] = el
	}
	if err = r.c.AllToAll(theirs, src, per, per, comm.Dispatch); err != nil {
		return nil, nil, nil, fmt.Errorf("expert counts: %w", err)
	}
	v, err := backend.ToInt32(b, stat)
	if err != nil {
		return nil, nil, nil, err
	}
	send, recv = make([]int, ep), make([]int, ep)
	for x := range e {
		send[x/el] += int(v[x])
	}
	for i := range ep {
		for l := range el {
			c := int(v[e+i*el+l])
			if c < 0 {
				return nil, nil, nil, fmt.Errorf("rank %d sends %d rows for expert %d", i, c, m.FirstExpert+l)
			}
			recv[i] += c
			for range c {
				rsel = append(rsel, int32(l))
			}
		}
	}
	return send, recv, rsel, nil
}

// ForwardSorted implements nn.SortedRunner.
func (r *epRunner) ForwardSorted(p *nn.Pass, m *nn.MoE, xs, offsets, counts T, keep bool) (ys T, err error) {
	if r.dev != nil {
		return T{}, fmt.Errorf("parallel: %s: expert ForwardSorted called twice without BackwardSorted or Release", m.Name)
	}
	ep, e := r.c.Size(), m.Routed()
	if e%ep != 0 || len(m.Experts) != e/ep || m.FirstExpert != r.c.Rank()*(e/ep) {
		return T{}, fmt.Errorf("parallel: %s: expert rank %d of %d holds experts [%d,%d) of %d; it should own [%d,%d)",
			m.Name, r.c.Rank(), ep, m.FirstExpert, m.FirstExpert+len(m.Experts), e, r.c.Rank()*(e/ep), (r.c.Rank()+1)*(e/ep))
	}
	b, o := p.B, p.B.Optional()
	s, c := xs.Dim(0), xs.Dim(1)
	send, recv, rsel, err := r.splits(p, m, counts)
	if err != nil {
		return T{}, fmt.Errorf("parallel: %s: %w", m.Name, err)
	}
	sr := &sortedRoute{send: send, recv: recv, m: len(rsel),
		experts: nn.GroupedExperts{Name: m.Name, GateUp: m.GateUp, Down: m.Down}}
	var rcv, rorder, rys, back T
	defer func() {
		freeAll(b, &rcv, &rorder, &rys, &back)
		if err != nil || !keep {
			sr.release(b)
		}
		if err != nil {
			freeAll(b, &ys)
		}
	}()
	fail := func(what string, err error) (T, error) {
		return T{}, fmt.Errorf("parallel: %s: %s: %w", m.Name, what, err)
	}
	mr := sr.m
	if rcv, err = b.Empty(xs.DType(), max(mr, 1), c); err != nil {
		return fail("dispatch", err)
	}
	rv, _ := rcv.Rows(0, mr)
	if err = r.c.AllToAll(rv, xs, send, recv, comm.Dispatch); err != nil {
		return fail("dispatch", err)
	}
	if back, err = b.Empty(xs.DType(), max(mr, 1), c); err != nil {
		return fail("combine", err)
	}
	if mr > 0 {
		el := len(m.Experts)
		if sr.rsel, err = backend.FromInt32(b, rsel, mr, 1); err != nil {
			return fail("dispatch", err)
		}
		i32 := func(shape ...int) (T, error) { return b.Empty(tensor.I32, shape...) }
		if sr.roff, err = i32(el + 1); err == nil {
			if rorder, err = i32(mr); err == nil {
				if sr.rslt, err = i32(mr, 1); err == nil {
					sr.rxs, err = b.Empty(xs.DType(), mr, c)
				}
			}
		}
		if err != nil {
			return fail("dispatch", err)
		}
		if err = o.MoEPermute(backend.MoEPermuteArgs{E: el, Sel: sr.rsel, X: rv, Offsets: sr.roff, Order: rorder, Slot: sr.rslt, Xs: sr.rxs}); err != nil {
			return fail("sort of the received rows", err)
		}
		freeAll(b, &rcv, &rorder)
		if rys, err = sr.experts.Forward(p, o, sr.rxs, sr.roff, keep); err != nil {
			return T{}, err
		}
		if err = o.MoEPermuteBackward(backend.MoEPermuteBackwardArgs{DXs: rys, Slot: sr.rslt, DX: back}); err != nil {
			return fail("order of the results", err)
		}
	}
	if ys, err = b.Empty(xs.DType(), s, c); err != nil {
		return fail("combine", err)
	}
	bk, _ := back.Rows(0, mr)
	if err = r.c.AllToAll(ys, bk, recv, send, comm.Combine); err != nil {
		return fail("combine", err)
	}
	if keep {
		r.dev = sr
	}
	return ys, nil
}

// BackwardSorted implements nn.SortedRunner.
func (r *epRunner) BackwardSorted(p *nn.Pass, m *nn.MoE, dys T) (dxs T, err error) {
	sr := r.dev
	defer r.Release(p)
	if sr == nil {
		return T{}, fmt.Errorf("parallel: %s: expert BackwardSorted without a cached ForwardSorted", m.Name)
	}
	b, o := p.B, p.B.Optional()
	s, c, mr := dys.Dim(0), dys.Dim(1), sr.m
	var drcv, drys, drxs, dsrc, off, order, slot T
	defer func() {
		freeAll(b, &drcv, &drys, &drxs, &dsrc, &off, &order, &slot)
		if err != nil {
			freeAll(b, &dxs)
		}
	}()
	fail := func(what string, err error) (T, error) {
		return T{}, fmt.Errorf("parallel: %s: %s: %w", m.Name, what, err)
	}
	if drcv, err = b.Empty(dys.DType(), max(mr, 1), c); err != nil {
		return fail("combine backward", err)
	}
	dv, _ := drcv.Rows(0, mr)
	if err = r.c.AllToAll(dv, dys, sr.send, sr.recv, comm.Dispatch); err != nil {
		return fail("combine backward", err)
	}
	if dsrc, err = b.Empty(dys.DType(), max(mr, 1), c); err != nil {
		return fail("dispatch backward", err)
	}
	if mr > 0 {
		// The gradients of the results arrive in source-rank order: sort them by local expert
		// as the forward sorted the rows.
		el := len(m.Experts)
		i32 := func(shape ...int) (T, error) { return b.Empty(tensor.I32, shape...) }
		if off, err = i32(el + 1); err == nil {
			if order, err = i32(mr); err == nil {
				if slot, err = i32(mr, 1); err == nil {
					drys, err = b.Empty(dys.DType(), mr, c)
				}
			}
		}
		if err != nil {
			return fail("combine backward", err)
		}
		if err = o.MoEPermute(backend.MoEPermuteArgs{E: el, Sel: sr.rsel, X: dv, Offsets: off, Order: order, Slot: slot, Xs: drys}); err != nil {
			return fail("sort of the received gradients", err)
		}
		freeAll(b, &drcv)
		drxs, err = sr.experts.Backward(p, o, drys, func() (T, bool, error) { return sr.rxs, false, nil })
		drys = T{} // freed by the experts' backward
		if err != nil {
			return T{}, err
		}
		if err = o.MoEPermuteBackward(backend.MoEPermuteBackwardArgs{DXs: drxs, Slot: sr.rslt, DX: dsrc}); err != nil {
			return fail("order of the row gradients", err)
		}
	}
	if dxs, err = b.Empty(dys.DType(), s, c); err != nil {
		return fail("dispatch backward", err)
	}
	ds, _ := dsrc.Rows(0, mr)
	if err = r.c.AllToAll(dxs, ds, sr.recv, sr.send, comm.Combine); err != nil {
		return fail("dispatch backward", err)
	}
	return dxs, nil
}
