package parallel

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/optim"
)

// fsdpShard is a rank's FSDP state: its shards of the parameter arena's parts.
type fsdpShard struct {
	on    bool
	parts []fsdpPart
	// pack [max G·S] stages the parts whose elements are not one contiguous block of G·S in
	// the arena; one collective runs at a time, so every part shares it.
	pack T
}

// seg is a block [off, off+n) of the flat arena.
type seg struct{ off, n int }

// fsdpPart is a set of the arena's elements sharded over one group: without expert
// parallelism the whole arena over the data group; under it the dense parameters (and
// routers) over the data group and the rank's experts over the expert-data group, the ranks
// that hold the same experts. Packed in order, its segments are P elements, cut into G shards
// of S (the last padded).
type fsdpPart struct {
	c           comm.Communicator
	segs        []seg
	p, s        int
	lo, hi      int // this rank's shard [lo, hi) of the packed elements
	param, grad T   // [S] master parameter shard and reduced gradient shard (nil when local)
	direct      bool
	// local: the group is this rank alone (experts without replicas), so the part is not
	// sharded: the optimizer works on the arena's views and no collective runs.
	local bool
}

// partOf is the FSDP part of a parameter: 1 for a routed expert's under expert parallelism,
// else 0.
func (p *Plan) partOf(name string) int {
	if _, ok := p.expertHolder(name); ok {
		return 1
	}
	return 0
}

// fsdpParts splits rank rk's arena into the parts FSDP shards, by group.
func (p *Plan) fsdpParts(rk *rank) []fsdpPart {
	var dense, expert []seg
	add := func(s []seg, off, n int) []seg {
		// A segment that ends where this one starts, up to the arena's alignment padding,
		// takes it in, padding included (zeros that stay zero), so that a part stays one block.
		if k := len(s); k > 0 && models.AlignArenaOffset(s[k-1].off+s[k-1].n) == off {
			s[k-1].n = off + n - s[k-1].off
			return s
		}
		return append(s, seg{off, n})
	}
	offs := rk.m.Params.Offs
	for i, s := range rk.m.Specs {
		if p.partOf(s.Name) == 1 {
			expert = add(expert, offs[i], s.Numel())
		} else {
			dense = add(dense, offs[i], s.Numel())
		}
	}
	parts := []fsdpPart{{c: rk.data, segs: dense}}
	if len(expert) > 0 {
		parts = append(parts, fsdpPart{c: rk.edata, segs: expert})
	}
	return parts
}

// packed returns the position in the part's packed order of the n arena elements from off,
// and whether one segment holds them.
func (pt *fsdpPart) packed(off, n int) (int, bool) {
	pos := 0
	for _, sg := range pt.segs {
		if off >= sg.off && off+n <= sg.off+sg.n {
			return pos + off - sg.off, true
		}
		pos += sg.n
	}
	return 0, false
}

// setupFSDP builds rank rk's shards, copies its current parameters into them and returns the
// optimizer's parameters over them.
func (p *Plan) setupFSDP(rk *rank, counted func(string) bool) error {
	sh := &rk.shard
	sh.on = true
	sh.parts = p.fsdpParts(rk)
	m := rk.m
	offs := m.Params.Offs
	pack := 0
	for i := range sh.parts {
		pt := &sh.parts[i]
		for _, s := range pt.segs {
			pt.p += s.n
		}
		g := pt.c.Size()
		if g == 1 {
			pt.local, pt.s, pt.hi = true, pt.p, pt.p
			for j, s := range m.Specs {
				if p.partOf(s.Name) == i {
					rk.optParams = append(rk.optParams, optim.Param{Name: s.Name, Value: m.Params.Views[j], Grad: m.Grads.Views[j], NoDecay: !s.Decay})
					rk.optElem = append(rk.optElem, 0)
					rk.countNorm = append(rk.countNorm, counted(s.Name))
				}
			}
			continue
		}
		pt.s = (pt.p + g - 1) / g
		r := pt.c.Rank()
		pt.lo, pt.hi = min(r*pt.s, pt.p), min((r+1)*pt.s, pt.p)
		pt.direct = len(pt.segs) == 1 && pt.p == pt.s*g
		if !pt.direct {
			pack = max(pack, pt.s*g)
		}
		var err error
		if pt.param, err = rk.dev.Alloc(p.dtype, pt.s); err != nil {
			return err
		}
		if pt.grad, err = rk.dev.Alloc(p.dtype, pt.s); err != nil {
			return err
		}
		// The shard's parameters, and its optimizer parameters, spec by spec.
		covered := 0
		for j, s := range m.Specs {
			n, o := s.Numel(), offs[j]
			if p.partOf(s.Name) != i {
				continue
			}
			pos, ok := pt.packed(o, n)
			if !ok {
				return fmt.Errorf("parallel: rank %d: FSDP part %d has no segment holding %s (spec table and segments disagree)", rk.id, i, s.Name)
			}
			covered += n
			lo, hi := max(pos, pt.lo), min(pos+n, pt.hi)
			if lo < hi {
				src, _ := m.Params.Flat.View(o+lo-pos, hi-lo)
				v, _ := pt.param.View(lo-pt.lo, hi-lo)
				gv, _ := pt.grad.View(lo-pt.lo, hi-lo)
				if err := rk.dev.Copy(v, src); err != nil {
					return err
				}
				rk.optParams = append(rk.optParams, optim.Param{Name: s.Name, Value: v, Grad: gv, NoDecay: !s.Decay})
				rk.optElem = append(rk.optElem, lo-pos)
				rk.countNorm = append(rk.countNorm, counted(s.Name))
			}
		}
		if covered > pt.p {
			return fmt.Errorf("parallel: rank %d: FSDP part of %d elements holds specs of %d (spec table and segments disagree)", rk.id, pt.p, covered)
		}
	}
	if pack > 0 {
		var err error
		if sh.pack, err = rk.dev.Alloc(p.dtype, pack); err != nil {
			return err
		}
	}
	return nil
}

// staging returns the [G·S] buffer a part's collectives run on: a view of the arena when the
// part is one block of that size, else the shared pack buffer.
func (sh *fsdpShard) staging(pt *fsdpPart, flat T) T {
	n := pt.s * pt.c.Size()
	if pt.direct {
		v, _ := flat.View(pt.segs[0].off, n)
		return v
	}
	v, _ := sh.pack.View(0, n)
	return v
}

// packFrom copies the part's segments of flat into the staging buffer st (a no-op when direct).
func (rk *rank) packFrom(pt *fsdpPart, st, flat T) error {
	if pt.direct {
		return nil
	}
	pos := 0
	for _, s := range pt.segs {
		src, _ := flat.View(s.off, s.n)
		dst, _ := st.View(pos, s.n)
		if err := rk.dev.Copy(dst, src); err != nil {
			return err
		}
		pos += s.n
	}
	return nil
}

// unpackTo copies the staging buffer st back into the part's segments of flat.
func (rk *rank) unpackTo(pt *fsdpPart, flat, st T) error {
	if pt.direct {
		return nil
	}
	pos := 0
	for _, s := range pt.segs {
		dst, _ := flat.View(s.off, s.n)
		src, _ := st.View(pos, s.n)
		if err := rk.dev.Copy(dst, src); err != nil {
			return err
		}
		pos += s.n
	}
	return nil
}

// reduceScatterGrads sums the gradient arena over each part's group into the rank's shards.
func (p *Plan) reduceScatterGrads(rk *rank) error {
	sh := &rk.shard
	flat := rk.m.Grads.Flat
	for i := range sh.parts {
		pt := &sh.parts[i]
		if pt.local {
			continue
		}
		st := sh.staging(pt, flat)
		if err := rk.packFrom(pt, st, flat); err != nil {
			return err
		}
		if err := pt.c.ReduceScatter(pt.grad, st, comm.Sum); err != nil {
			return err
		}
	}
	return nil
}

// allGather brings every part's shards (param or grad) back into flat.
func (p *Plan) allGather(rk *rank, flat T, shard func(*fsdpPart) T) error {
	sh := &rk.shard
	for i := range sh.parts {
		pt := &sh.parts[i]
		if pt.local {
			continue
		}
		st := sh.staging(pt, flat)
		if err := pt.c.AllGather(st, shard(pt)); err != nil {
			return err
		}
		if err := rk.unpackTo(pt, flat, st); err != nil {
			return err
		}
	}
	return nil
}

// gatherParams all-gathers the FSDP parameter shards into the rank's compute arena.
func (p *Plan) gatherParams(rk *rank) error {
	return p.allGather(rk, rk.m.Params.Flat, func(pt *fsdpPart) T { return pt.param })
}

// gatherGrads all-gathers the reduced FSDP gradient shards into the rank's gradient arena.
func (p *Plan) gatherGrads(rk *rank) error {
	return p.allGather(rk, rk.m.Grads.Flat, func(pt *fsdpPart) T { return pt.grad })
}

// buffers are the rank's FSDP allocations.
func (sh *fsdpShard) buffers() []T {
	out := []T{sh.pack}
	for _, pt := range sh.parts {
		out = append(out, pt.param, pt.grad)
	}
	return out
}
