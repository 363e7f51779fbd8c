package nn

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// The device path of MoEBesideMLP's experts, with the weights stacked (GateUp [E,2I,C], Down
// [E,C,I]) and nothing read on the host:
//
//	logits = Router(RMSNorm(x) * RouterScale * C^-1/2)       [N,E]   (as the host path)
//	MoERoute:    probs [N,E], sel [N,K], weights [N,K] = softmax top-k renormalised, times
//	             PerExpertScale[sel] (ExpertScale, from an F32 copy of the parameter)
//	x2 = PreExperts(x); MoEPermute: offsets [E+1], slot [N,K], xs [S,C]
//	GroupedExperts (GeGLU): ys [S,C]
//	MoECombine:  e[n] = sum_k weights[n,k] * ys[slot[n,k]]   [N,C]
//
// The backward runs the combine's (or, without the kept outputs, the unweighted experts'
// backward that gives the weights' gradient as a row dot product), the experts' grouped
// backward, MoEPermuteBackward into dx2, PreExperts' backward, and MoERouteBackward, which also
// writes the per-expert scale's gradient [E] (summed per expert in a fixed order), then the
// router's projection and norm as on the host path.

// besideDev is the device-path cache of one forward of MoEBesideMLP.
type besideDev struct {
	probs, sel, weights T // [N,E] F32, [N,K] I32, [N,K] F32
	offsets, slot       T // [E+1] I32, [N,K] I32
	pes                 T // [E] F32: PerExpertScale as MoERoute read it
	ys                  T // [S,C], kept under HALO_MOE_EXPERT_OUTPUTS=keep
	experts             GroupedExperts
}

func (d *besideDev) release(p *Pass) {
	d.experts.Release(p.B)
	_ = free(p.B, &d.probs, &d.sel, &d.weights, &d.offsets, &d.slot, &d.pes, &d.ys)
}

// besideRouting is the block's routing: softmax, top-k renormalised (the per-expert scale is
// MoERoute's ExpertScale).
func (m *MoEBesideMLP) besideRouting() backend.MoERouting {
	return backend.MoERouting{Score: backend.RouterSoftmax, TopK: m.TopK, NormTopK: true}
}

// deviceOps reports whether this forward can take the device path, and the ops.
func (m *MoEBesideMLP) deviceOps(p *Pass, x T) (backend.Optional, bool) {
	o := p.B.Optional()
	ex := GroupedExperts{GeGLU: true}
	ok := !m.Composed && !swMoEPath.Is("composed") && x.Rank() == 2 && x.Dim(0) > 0 &&
		!m.GateUp.W.IsNil() && !m.Down.W.IsNil() &&
		o.MoERoute != nil && o.MoERouteBackward != nil && o.MoEPermute != nil && o.MoEPermuteBackward != nil &&
		o.MoECombine != nil && o.MoECombineBackward != nil && ex.Usable(o)
	return o, ok
}

// checkStacked checks the stacked weights and the per-expert scale against the block.
func (m *MoEBesideMLP) checkStacked(c int) error {
	e := len(m.Experts)
	gu, dn := m.GateUp.W, m.Down.W
	if gu.Rank() != 3 || gu.Dim(0) != e || gu.Dim(1)%2 != 0 || gu.Dim(2) != c {
		return fmt.Errorf("nn: %s: stacked gate_up weight %v must be [E=%d, 2I, C=%d]", m.Name, gu, e, c)
	}
	if inter := gu.Dim(1) / 2; !dn.Shape().Equal(tensor.Shape{e, c, inter}) {
		return fmt.Errorf("nn: %s: stacked down weight %v must be [E=%d, C=%d, I=%d]", m.Name, dn, e, c, inter)
	}
	if m.PerExpertScale.Numel() != e {
		return fmt.Errorf("nn: %s: per-expert scale %v must have the %d experts' entries", m.Name, m.PerExpertScale, e)
	}
	return nil
}

// deviceForward routes x, runs the experts on the device and leaves their combined output in
// m.e [N,C] (with x2, r2 and the device cache kept).
func (m *MoEBesideMLP) deviceForward(p *Pass, o backend.Optional, x T, keep bool) (err error) {
	n, c := x.Dim(0), x.Dim(1)
	e, k := len(m.Experts), m.TopK
	s := n * k
	if err = m.checkStacked(c); err != nil {
		return err
	}
	d := &m.dv
	var logits, order, xs T
	defer func() { _ = free(p.B, &logits, &order, &xs) }()
	if logits, err = m.routerLogits(p, x); err != nil {
		return err
	}
	if d.pes, err = p.outF32(e); err == nil {
		err = p.B.Copy(d.pes, m.PerExpertScale)
	}
	if err != nil {
		return wrap(m.Name+" per-expert scale", err)
	}
	i32 := func(shape ...int) (T, error) { return p.B.Alloc(tensor.I32, shape...) }
	if d.probs, err = p.outF32(n, e); err == nil {
		if d.sel, err = i32(n, k); err == nil {
			d.weights, err = p.outF32(n, k)
		}
	}
	if err != nil {
		return wrap(m.Name, err)
	}
	if err = o.MoERoute(backend.MoERouteArgs{MoERouting: m.besideRouting(), Logits: logits, Probs: d.probs, Sel: d.sel,
		Weights: d.weights, ExpertScale: d.pes}); err != nil {
		return wrap(m.Name+" router", err)
	}
	_ = free(p.B, &logits)
	if m.x2, m.r2, err = m.PreExperts.Forward(p, x); err != nil {
		return err
	}
	if d.offsets, err = i32(e + 1); err == nil {
		if order, err = i32(s); err == nil {
			if d.slot, err = i32(n, k); err == nil {
				xs, err = p.out(s, c)
			}
		}
	}
	if err != nil {
		return wrap(m.Name, err)
	}
	if err = o.MoEPermute(backend.MoEPermuteArgs{E: e, Sel: d.sel, X: m.x2, Offsets: d.offsets, Order: order, Slot: d.slot, Xs: xs}); err != nil {
		return wrap(m.Name+" permute", err)
	}
	_ = free(p.B, &order)
	d.experts = GroupedExperts{Name: m.Name + ".experts", GateUp: m.GateUp, Down: m.Down, GeGLU: true}
	if d.ys, err = d.experts.Forward(p, o, xs, d.offsets, keep); err != nil {
		return err
	}
	_ = free(p.B, &xs)
	if m.e, err = p.out(n, c); err != nil {
		return wrap(m.Name, err)
	}
	if err = o.MoECombine(backend.MoECombineArgs{Ys: d.ys, Slot: d.slot, Weights: d.weights, Out: m.e}); err != nil {
		return wrap(m.Name+" combine", err)
	}
	if !keep || swMoEOutputs.Is("recompute") {
		// The backward takes the weights' gradient without the outputs (unweightedExperts).
		_ = free(p.B, &d.ys)
	}
	return nil
}

// deviceBackward takes de [N,C], the gradient of the experts' combined output, back through
// the experts, PreExperts and the router, adding the residual stream's gradient into dx and
// every parameter gradient into its own.
func (m *MoEBesideMLP) deviceBackward(p *Pass, o backend.Optional, dx, de T) (err error) {
	d := &m.dv
	n, c := dx.Dim(0), dx.Dim(1)
	e, k := len(m.Experts), m.TopK
	var dw, dxs, dys, dx2, dlogits, dpes T
	defer func() { _ = free(p.B, &dw, &dxs, &dys, &dx2, &dlogits, &dpes) }()
	if dw, err = p.outF32(n, k); err != nil {
		return wrap(m.Name, err)
	}
	if d.ys.IsNil() {
		dxs, err = unweightedExperts(p, o, m.Name, e, &d.experts, d.sel, d.weights, d.slot, m.x2, de, dw)
	} else {
		if dys, err = p.out(n*k, c); err != nil {
			return wrap(m.Name, err)
		}
		if err = o.MoECombineBackward(backend.MoECombineBackwardArgs{DOut: de, Ys: d.ys, Slot: d.slot, Weights: d.weights, DYs: dys, DWeights: dw}); err != nil {
			return wrap(m.Name+" combine", err)
		}
		_ = free(p.B, &d.ys)
		g := dys
		dys = T{} // the experts' backward frees it
		dxs, err = d.experts.Backward(p, o, g, func() (T, bool, error) {
			xs, err := sortRows(p, o, m.Name, e, d.sel, m.x2)
			return xs, true, err
		})
	}
	if err != nil {
		return err
	}
	if dx2, err = p.out(n, c); err != nil {
		return wrap(m.Name, err)
	}
	if err = o.MoEPermuteBackward(backend.MoEPermuteBackwardArgs{DXs: dxs, Slot: d.slot, DX: dx2}); err != nil {
		return wrap(m.Name+" permute", err)
	}
	_ = free(p.B, &dxs)
	if err = m.PreExperts.Backward(p, dx, dx2, m.x, m.r2, true); err != nil {
		return err
	}
	_ = free(p.B, &dx2)
	// Router: the routing weights' gradient through the per-expert scale, the renormalised
	// top-k and the softmax, then the projection and its norm.
	if dlogits, err = p.out(n, e); err != nil {
		return wrap(m.Name, err)
	}
	if !m.GPerExpertScale.IsNil() {
		if dpes, err = p.outF32(e); err != nil {
			return wrap(m.Name, err)
		}
	}
	if err = o.MoERouteBackward(backend.MoERouteBackwardArgs{MoERouting: m.besideRouting(), Probs: d.probs, Sel: d.sel,
		Weights: d.weights, DWeights: dw, DLogits: dlogits, ExpertScale: d.pes, DExpertScale: dpes}); err != nil {
		return wrap(m.Name+" router", err)
	}
	if !dpes.IsNil() {
		if err = p.B.Axpy(m.GPerExpertScale, 1, dpes); err != nil {
			return wrap(m.Name+" per-expert scale", err)
		}
	}
	return m.routerInputBackward(p, dx, dlogits)
}
