package nn

import (
	"fmt"
	"slices"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// The device path of the MoE block: with the backend's optional MoE ops and GroupedGEMM and
// the experts' weights stacked (MoE.GateUp, MoE.Down), nothing of the layer is read on the
// host:
//
//	logits = Router(x)                                   [N,E]
//	MoERoute:     probs [N,E], sel [N,K], weights [N,K], per-expert counts and prob sums [E]
//	MoEPermute:   offsets [E+1], slot [N,K], xs [S,C] (the rows sorted by expert)
//	GroupedGEMM:  gu = xs · GateUp_e^T                   [S,2I]
//	SwiGLUPacked: act = silu(gu[:, :I]) * gu[:, I:]      [S,I]
//	GroupedGEMM:  ys = act · Down_e^T                    [S,C]
//	MoECombine:   out[n] = sum_k weights[n,k] * ys[slot[n,k]]   [N,C]
//
// and the backward in reverse (MoECombineBackward, the grouped input and weight gradients,
// SwiGLUPackedBackward in place, MoEPermuteBackward, MoERouteBackward, the router's
// backward). Cached for backward (keep): probs, sel, weights, offsets, slot, xs, gu, act, ys.
// The per-expert statistics (the loads, as a copy of the offsets; the aux loss's counts and
// probability sums) stay on the device until the model reads them once per forward
// (Routing.Fetch).

// moeDev is the device-path cache of one forward.
type moeDev struct {
	probs, sel, weights T // [N,E] F32, [N,K] I32, [N,K] F32
	offsets, slot       T // [E+1] I32, [N,K] I32
	xs, gu, act, ys     T // [S,C], [S,2I], [S,I], [S,C]
}

func (d *moeDev) release(b backend.Backend) {
	_ = free(b, &d.probs, &d.sel, &d.weights, &d.offsets, &d.slot, &d.xs, &d.gu, &d.act, &d.ys)
}

// deviceOps reports whether this forward can take the device path, and the ops.
func (m *MoE) deviceOps(p *Pass, x T) (backend.Optional, bool) {
	o := p.B.Optional()
	ok := !m.Composed && !swMoEPath.Is("composed") && m.Runner == nil && x.Rank() == 2 && x.Dim(0) > 0 && m.holdsAll() && !m.GateUp.W.IsNil() && !m.Down.W.IsNil() &&
		o.MoERoute != nil && o.MoERouteBackward != nil && o.MoEPermute != nil && o.MoEPermuteBackward != nil &&
		o.MoECombine != nil && o.MoECombineBackward != nil && o.SwiGLUPacked != nil && o.SwiGLUPackedBackward != nil &&
		o.GroupedGEMM != nil
	return o, ok
}

// checkStacked checks the stacked weights against the block: GateUp [E,2I,C], Down [E,C,I].
func (m *MoE) checkStacked(c int) (inter int, err error) {
	e := m.Routed()
	gu, dn := m.GateUp.W, m.Down.W
	if gu.Rank() != 3 || gu.Dim(0) != e || gu.Dim(1)%2 != 0 || gu.Dim(2) != c {
		return 0, fmt.Errorf("nn: %s: stacked gate_up weight %v must be [E=%d, 2I, C=%d]", m.Name, gu, e, c)
	}
	inter = gu.Dim(1) / 2
	if !dn.Shape().Equal(tensor.Shape{e, c, inter}) {
		return 0, fmt.Errorf("nn: %s: stacked down weight %v must be [E=%d, C=%d, I=%d]", m.Name, dn, e, c, inter)
	}
	return inter, nil
}

// deviceBias returns the balancing bias on the device, uploading it when the host copy changed.
func (m *MoE) deviceBias(p *Pass) (T, error) {
	if m.Bias == nil {
		return T{}, nil
	}
	if m.biasDev.IsNil() || m.biasB != p.B || !slices.Equal(m.biasHost, m.Bias) {
		m.dropBias()
		t, err := backend.FromFloat32(p.B, m.Bias, tensor.F32, len(m.Bias))
		if err != nil {
			return T{}, wrap(m.Name+" balancing bias", err)
		}
		m.biasDev, m.biasB, m.biasHost = t, p.B, append(m.biasHost[:0], m.Bias...)
	}
	return m.biasDev, nil
}

func (m *MoE) dropBias() {
	if m.biasB != nil {
		_ = free(m.biasB, &m.biasDev)
	}
	m.biasB = nil
}

func (m *MoE) deviceForward(p *Pass, o backend.Optional, x T, keep bool) (out T, err error) {
	n, c := x.Dim(0), x.Dim(1)
	e, k := m.Routed(), m.TopK
	if k <= 0 || k > e {
		return T{}, fmt.Errorf("nn: %s: top-k %d must be in [1, %d experts]", m.Name, k, e)
	}
	if m.Bias != nil && len(m.Bias) != e {
		return T{}, fmt.Errorf("nn: %s: balancing bias has %d entries for %d experts", m.Name, len(m.Bias), e)
	}
	inter, err := m.checkStacked(c)
	if err != nil {
		return T{}, err
	}
	s := n * k
	d := &m.d
	r := &m.r
	r.reset()
	r.N, r.E, r.K = n, e, k
	var logits, order T
	defer func() {
		_ = free(p.B, &logits, &order)
		if err != nil {
			_ = free(p.B, &out)
		}
	}()
	if logits, err = m.Router.Forward(p, x); err != nil {
		return T{}, err
	}
	bias, err := m.deviceBias(p)
	if err != nil {
		return T{}, err
	}
	i32 := func(shape ...int) (T, error) { return p.B.Alloc(tensor.I32, shape...) }
	if d.probs, err = p.outF32(n, e); err == nil {
		if d.sel, err = i32(n, k); err == nil {
			if d.weights, err = p.outF32(n, k); err == nil {
				if r.offsets, err = i32(e + 1); err == nil {
					r.psum, err = p.outF32(e)
				}
			}
		}
	}
	if err != nil {
		return T{}, wrap(m.Name, err)
	}
	r.b = p.B
	route := backend.MoERouting{TopK: k, NormTopK: m.NormTopK}
	if err = o.MoERoute(backend.MoERouteArgs{MoERouting: route, Logits: logits, Bias: bias, Probs: d.probs, Sel: d.sel,
		Weights: d.weights, ProbSum: r.psum}); err != nil {
		return T{}, wrap(m.Name+" router", err)
	}
	if !bias.IsNil() {
		// The load-balancing loss counts the top-k of the probabilities alone.
		if err = m.unbiasedCounts(p, o, route, logits); err != nil {
			return T{}, err
		}
	}
	_ = free(p.B, &logits)
	if d.offsets, err = i32(e + 1); err == nil {
		if order, err = i32(s); err == nil {
			if d.slot, err = i32(n, k); err == nil {
				d.xs, err = p.out(s, c)
			}
		}
	}
	if err != nil {
		return T{}, wrap(m.Name, err)
	}
	if err = o.MoEPermute(backend.MoEPermuteArgs{E: e, Sel: d.sel, X: x, Offsets: d.offsets, Order: order, Slot: d.slot, Xs: d.xs}); err != nil {
		return T{}, wrap(m.Name+" permute", err)
	}
	// The expert loads are the offsets' differences: keep a copy for Fetch.
	if err = p.B.Copy(r.offsets, d.offsets); err != nil {
		return T{}, wrap(m.Name, err)
	}
	_ = free(p.B, &order)
	if d.gu, err = p.out(s, 2*inter); err != nil {
		return T{}, wrap(m.Name, err)
	}
	if err = o.GroupedGEMM(backend.GroupedGEMMArgs{Kind: backend.GroupedForward, A: d.xs, B: m.GateUp.W, Out: d.gu, Offsets: d.offsets}); err != nil {
		return T{}, wrap(m.GateUp.Name, err)
	}
	if d.act, err = p.out(s, inter); err != nil {
		return T{}, wrap(m.Name, err)
	}
	if err = o.SwiGLUPacked(d.act, d.gu); err != nil {
		return T{}, wrap(m.Name+" swiglu", err)
	}
	if d.ys, err = p.out(s, c); err != nil {
		return T{}, wrap(m.Name, err)
	}
	if err = o.GroupedGEMM(backend.GroupedGEMMArgs{Kind: backend.GroupedForward, A: d.act, B: m.Down.W, Out: d.ys, Offsets: d.offsets}); err != nil {
		return T{}, wrap(m.Down.Name, err)
	}
	if out, err = p.out(n, c); err != nil {
		return T{}, wrap(m.Name, err)
	}
	if err = o.MoECombine(backend.MoECombineArgs{Ys: d.ys, Slot: d.slot, Weights: d.weights, Out: out}); err != nil {
		return T{}, wrap(m.Name+" combine", err)
	}
	return out, nil
}

// unbiasedCounts routes the logits again without the balancing bias, keeping only the
// per-expert counts (the aux loss's F term; transformers' top-k of the probabilities).
func (m *MoE) unbiasedCounts(p *Pass, o backend.Optional, route backend.MoERouting, logits T) (err error) {
	n, e, k := logits.Dim(0), m.Routed(), m.TopK
	var probs, sel, w T
	defer func() { _ = free(p.B, &probs, &sel, &w) }()
	if probs, err = p.outF32(n, e); err == nil {
		if sel, err = p.B.Alloc(tensor.I32, n, k); err == nil {
			if w, err = p.outF32(n, k); err == nil {
				r := &m.r
				r.auxCounts, err = p.B.Alloc(tensor.I32, e)
			}
		}
	}
	if err != nil {
		return wrap(m.Name, err)
	}
	return wrap(m.Name+" router", o.MoERoute(backend.MoERouteArgs{MoERouting: route, Logits: logits, Probs: probs, Sel: sel, Weights: w, Counts: m.r.auxCounts}))
}

func (m *MoE) deviceBackward(p *Pass, o backend.Optional, dy T) (dx T, err error) {
	d := &m.d
	r := &m.r
	n, e, k := r.N, r.E, r.K
	c := dy.Dim(1)
	s := n * k
	var dys, dw, dact, dxs, aux, dlogits T
	defer func() {
		_ = free(p.B, &dys, &dw, &dact, &dxs, &aux, &dlogits)
		if err != nil {
			_ = free(p.B, &dx)
		}
	}()
	if dx, err = p.out(n, c); err != nil {
		return T{}, wrap(m.Name, err)
	}
	if dw, err = p.outF32(n, k); err != nil {
		return T{}, wrap(m.Name, err)
	}
	if dys, err = p.out(s, c); err != nil {
		return T{}, wrap(m.Name, err)
	}
	if err = o.MoECombineBackward(backend.MoECombineBackwardArgs{DOut: dy, Ys: d.ys, Slot: d.slot, Weights: d.weights, DYs: dys, DWeights: dw}); err != nil {
		return T{}, wrap(m.Name+" combine", err)
	}
	_ = free(p.B, &d.ys)
	inter := d.act.Dim(1)
	if dact, err = p.out(s, inter); err != nil {
		return T{}, wrap(m.Name, err)
	}
	if err = o.GroupedGEMM(backend.GroupedGEMMArgs{Kind: backend.GroupedInputGrad, A: dys, B: m.Down.W, Out: dact, Offsets: d.offsets}); err != nil {
		return T{}, wrap(m.Down.Name, err)
	}
	if !m.Down.GW.IsNil() {
		if err = o.GroupedGEMM(backend.GroupedGEMMArgs{Kind: backend.GroupedWeightGrad, A: dys, B: d.act, Out: m.Down.GW, Offsets: d.offsets, Accumulate: true}); err != nil {
			return T{}, wrap(m.Down.Name, err)
		}
	}
	_ = free(p.B, &dys, &d.act)
	// gu becomes its own gradient.
	if err = o.SwiGLUPackedBackward(d.gu, dact, d.gu); err != nil {
		return T{}, wrap(m.Name+" swiglu", err)
	}
	_ = free(p.B, &dact)
	if dxs, err = p.out(s, c); err != nil {
		return T{}, wrap(m.Name, err)
	}
	if err = o.GroupedGEMM(backend.GroupedGEMMArgs{Kind: backend.GroupedInputGrad, A: d.gu, B: m.GateUp.W, Out: dxs, Offsets: d.offsets}); err != nil {
		return T{}, wrap(m.GateUp.Name, err)
	}
	if !m.GateUp.GW.IsNil() {
		if err = o.GroupedGEMM(backend.GroupedGEMMArgs{Kind: backend.GroupedWeightGrad, A: d.gu, B: d.xs, Out: m.GateUp.GW, Offsets: d.offsets, Accumulate: true}); err != nil {
			return T{}, wrap(m.GateUp.Name, err)
		}
	}
	_ = free(p.B, &d.gu, &d.xs)
	if err = o.MoEPermuteBackward(backend.MoEPermuteBackwardArgs{DXs: dxs, Slot: d.slot, DX: dx}); err != nil {
		return T{}, wrap(m.Name+" permute", err)
	}
	if m.AuxGrad != nil {
		if len(m.AuxGrad) != e {
			return T{}, fmt.Errorf("nn: %s: aux gradient has %d entries for %d experts", m.Name, len(m.AuxGrad), e)
		}
		c32 := make([]float32, e)
		for j, v := range m.AuxGrad {
			c32[j] = float32(v)
		}
		if aux, err = backend.FromFloat32(p.B, c32, tensor.F32, e); err != nil {
			return T{}, wrap(m.Name+" router", err)
		}
	}
	if dlogits, err = p.out(n, e); err != nil {
		return T{}, wrap(m.Name, err)
	}
	if err = o.MoERouteBackward(backend.MoERouteBackwardArgs{MoERouting: backend.MoERouting{TopK: k, NormTopK: m.NormTopK},
		Probs: d.probs, Sel: d.sel, Weights: d.weights, DWeights: dw, AuxGrad: aux, DLogits: dlogits}); err != nil {
		return T{}, wrap(m.Name+" router", err)
	}
	if err = m.Router.Backward(p, dx, dlogits, m.x, true); err != nil {
		return T{}, err
	}
	return dx, nil
}
