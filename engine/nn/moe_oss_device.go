package nn

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// The device path of OSSMoE: where the backend has the MoE ops and the grouped GEMM, the
// block routes, sorts and combines on the device and runs each projection as one grouped
// product over all experts, with no host read inside the layer:
//
//	logits = Router(x)                                   [N,E] (with the router's bias)
//	MoERoute (softmax, top-K, renormalised)              probs [N,E], sel, weights [N,K]
//	MoEPermute                                            offsets [E+1], slot [N,K], xs [S,C]
//	ids    = the expert of each sorted row               [S] (MoEPermute of sel itself)
//	gu     = GateUpBias[ids] + xs · GateUp_e              [S,2I] (grouped, GateUp [E,C,2I])
//	a      = SwiGLUClamped(gu)                            [S,I]
//	ys     = DownBias[ids] + a · Down_e                   [S,C] (grouped, Down [E,I,C])
//	out[n] = sum_j weights[n,j] * ys[slot[n,j]]           (MoECombine)
//
// Softmax over the K chosen logits equals the softmax over all E renormalised over the chosen
// (the full sum cancels), so MoERoute's softmax with NormTopK gives gpt-oss's weights, and its
// backward their gradient. The checkpoint's [in, out] expert layout is what the grouped
// input-gradient kind multiplies by (out = a · b_e), so no weight is transposed: the forward
// runs GroupedInputGrad, the input gradient GroupedForward, the weight gradient
// GroupedWeightGrad with the operands in the other order. The biases' rows are gathered with
// Embedding and their gradients summed with EmbeddingBackward, as on the host path.
//
// Cached for backward (keep): probs, sel, weights, slot, offsets, ids, gu [S,2I] and ys [S,C];
// the sorted rows xs and the activation a are made again in the backward.

type ossDev struct {
	active              bool
	probs, sel, weights T // [N,E] F32, [N,K] I32, [N,K] F32
	offsets, slot       T // [E+1] I32, [N,K] I32
	idRows, ids         T // [S,1] I32 (owned) and its [S] view
	gu, ys              T // [S,2I], [S,C]
}

func (d *ossDev) release(b backend.Backend) {
	_ = free(b, &d.probs, &d.sel, &d.weights, &d.offsets, &d.slot, &d.idRows, &d.gu, &d.ys)
	*d = ossDev{}
}

// deviceOps reports whether this forward can take the device path, and the ops.
func (m *OSSMoE) deviceOps(p *Pass, x T) (backend.Optional, bool) {
	o := p.B.Optional()
	ok := !swMoEPath.Is("composed") && x.Rank() == 2 && x.Dim(0) > 0 &&
		o.MoERoute != nil && o.MoERouteBackward != nil && o.MoEPermute != nil && o.MoEPermuteBackward != nil &&
		o.MoECombine != nil && o.MoECombineBackward != nil && o.GroupedGEMM != nil
	return o, ok
}

func (m *OSSMoE) routing() backend.MoERouting {
	return backend.MoERouting{Score: backend.RouterSoftmax, TopK: m.TopK, NormTopK: true}
}

// sortRows returns x's rows [N,C] sorted by expert as the forward sorted them ([S,C], new),
// and with them new offsets, order and slot tensors the caller frees (equal to the forward's).
func (m *OSSMoE) sortRows(p *Pass, o backend.Optional, sel, x T, e int) (xs, offsets, order, slot T, err error) {
	n, k := sel.Dim(0), sel.Dim(1)
	i32 := func(shape ...int) (T, error) { return p.B.Empty(tensor.I32, shape...) }
	if offsets, err = i32(e + 1); err == nil {
		if order, err = i32(n * k); err == nil {
			if slot, err = i32(n, k); err == nil {
				xs, err = p.B.Empty(x.DType(), n*k, x.Dim(1))
			}
		}
	}
	if err == nil {
		err = o.MoEPermute(backend.MoEPermuteArgs{E: e, Sel: sel, X: x, Offsets: offsets, Order: order, Slot: slot, Xs: xs})
	}
	if err != nil {
		_ = free(p.B, &xs, &offsets, &order, &slot)
		return T{}, T{}, T{}, T{}, wrap(m.Name+" permute", err)
	}
	return xs, offsets, order, slot, nil
}

func (m *OSSMoE) deviceForward(p *Pass, o backend.Optional, x T, keep bool) (out T, err error) {
	ne, cw, iw := m.dims()
	n, k := x.Dim(0), m.TopK
	s := n * k
	d := &m.dev
	d.active = true
	var logits, xs, order, junkOff, junkOrder, junkSlot, act T
	defer func() {
		_ = free(p.B, &logits, &xs, &order, &junkOff, &junkOrder, &junkSlot, &act)
		if err != nil {
			_ = free(p.B, &out)
		}
	}()
	if logits, err = m.Router.Forward(p, x); err != nil {
		return T{}, err
	}
	i32 := func(shape ...int) (T, error) { return p.B.Empty(tensor.I32, shape...) }
	if d.probs, err = p.outF32(n, ne); err == nil {
		if d.sel, err = i32(n, k); err == nil {
			d.weights, err = p.outF32(n, k)
		}
	}
	if err != nil {
		return T{}, wrap(m.Name, err)
	}
	if err = o.MoERoute(backend.MoERouteArgs{MoERouting: m.routing(), Logits: logits, Probs: d.probs, Sel: d.sel, Weights: d.weights}); err != nil {
		return T{}, wrap(m.Name+" router", err)
	}
	_ = free(p.B, &logits)
	if xs, d.offsets, order, d.slot, err = m.sortRows(p, o, d.sel, x, ne); err != nil {
		return T{}, err
	}
	// The expert of each sorted row: the slots' own expert ids sorted the same way (one slot per
	// row, so the order within an expert does not matter: its rows all carry its id).
	sel1, err := d.sel.Reshape(s, 1)
	if err != nil {
		return T{}, wrap(m.Name, err)
	}
	if d.idRows, junkOff, junkOrder, junkSlot, err = m.sortRows(p, o, sel1, sel1, ne); err != nil {
		return T{}, err
	}
	if d.ids, err = d.idRows.Reshape(s); err != nil {
		return T{}, wrap(m.Name, err)
	}
	if d.gu, err = p.out(s, 2*iw); err == nil {
		if err = p.B.Embedding(d.gu, m.GateUpBias, d.ids); err == nil {
			err = o.GroupedGEMM(backend.GroupedGEMMArgs{Kind: backend.GroupedInputGrad, A: xs, B: m.GateUp, Out: d.gu, Offsets: d.offsets, Accumulate: true})
		}
	}
	if err != nil {
		return T{}, wrap(m.Name+" gate_up", err)
	}
	_ = free(p.B, &xs)
	if act, err = p.out(s, iw); err == nil {
		err = p.B.SwiGLUClamped(act, d.gu, m.Alpha, m.Limit)
	}
	if err != nil {
		return T{}, wrap(m.Name, err)
	}
	if d.ys, err = p.out(s, cw); err == nil {
		if err = p.B.Embedding(d.ys, m.DownBias, d.ids); err == nil {
			err = o.GroupedGEMM(backend.GroupedGEMMArgs{Kind: backend.GroupedInputGrad, A: act, B: m.Down, Out: d.ys, Offsets: d.offsets, Accumulate: true})
		}
	}
	if err != nil {
		return T{}, wrap(m.Name+" down", err)
	}
	if out, err = p.out(n, cw); err != nil {
		return T{}, wrap(m.Name, err)
	}
	if err = o.MoECombine(backend.MoECombineArgs{Ys: d.ys, Slot: d.slot, Weights: d.weights, Out: out}); err != nil {
		return T{}, wrap(m.Name+" combine", err)
	}
	return out, nil
}

// deviceBackward is Backward on the device path; overwriteGU and overwriteDown make the
// grouped weight gradients write GGateUp and GDown (=) rather than add to them.
func (m *OSSMoE) deviceBackward(p *Pass, o backend.Optional, dy T, overwriteGU, overwriteDown bool) (dx T, err error) {
	ne, cw, iw := m.dims()
	d := &m.dev
	n, k := m.c.n, m.TopK
	s := n * k
	var dw, dys, act, dact, xs, offs, order, slot, dxs, dlogits T
	defer func() {
		_ = free(p.B, &dw, &dys, &act, &dact, &xs, &offs, &order, &slot, &dxs, &dlogits)
		if err != nil {
			_ = free(p.B, &dx)
		}
	}()
	if dw, err = p.outF32(n, k); err == nil {
		dys, err = p.out(s, cw)
	}
	if err != nil {
		return T{}, wrap(m.Name, err)
	}
	if err = o.MoECombineBackward(backend.MoECombineBackwardArgs{DOut: dy, Ys: d.ys, Slot: d.slot, Weights: d.weights, DYs: dys, DWeights: dw}); err != nil {
		return T{}, wrap(m.Name+" combine", err)
	}
	_ = free(p.B, &d.ys)
	if !m.GDownBias.IsNil() {
		if err = p.B.EmbeddingBackward(m.GDownBias, dys, d.ids); err != nil {
			return T{}, wrap(m.Name+" down bias", err)
		}
	}
	if !m.GDown.IsNil() {
		// The activation was not kept: make it again from gu.
		if act, err = p.out(s, iw); err == nil {
			if err = p.B.SwiGLUClamped(act, d.gu, m.Alpha, m.Limit); err == nil {
				err = o.GroupedGEMM(backend.GroupedGEMMArgs{Kind: backend.GroupedWeightGrad, A: act, B: dys, Out: m.GDown, Offsets: d.offsets, Accumulate: !overwriteDown})
			}
		}
		if err != nil {
			return T{}, wrap(m.Name+" down", err)
		}
		_ = free(p.B, &act)
	}
	if dact, err = p.out(s, iw); err == nil {
		err = o.GroupedGEMM(backend.GroupedGEMMArgs{Kind: backend.GroupedForward, A: dys, B: m.Down, Out: dact, Offsets: d.offsets})
	}
	if err != nil {
		return T{}, wrap(m.Name+" down", err)
	}
	_ = free(p.B, &dys)
	// gu becomes its gradient (the op reads each pair before writing it).
	if err = p.B.SwiGLUClampedBackward(d.gu, dact, d.gu, m.Alpha, m.Limit); err != nil {
		return T{}, wrap(m.Name, err)
	}
	_ = free(p.B, &dact)
	if !m.GGateUpBias.IsNil() {
		if err = p.B.EmbeddingBackward(m.GGateUpBias, d.gu, d.ids); err != nil {
			return T{}, wrap(m.Name+" gate_up bias", err)
		}
	}
	if !m.GGateUp.IsNil() {
		if xs, offs, order, slot, err = m.sortRows(p, o, d.sel, m.c.x, ne); err != nil {
			return T{}, err
		}
		if err = o.GroupedGEMM(backend.GroupedGEMMArgs{Kind: backend.GroupedWeightGrad, A: xs, B: d.gu, Out: m.GGateUp, Offsets: d.offsets, Accumulate: !overwriteGU}); err != nil {
			return T{}, wrap(m.Name+" gate_up", err)
		}
		_ = free(p.B, &xs, &offs, &order, &slot)
	}
	if dxs, err = p.out(s, cw); err == nil {
		err = o.GroupedGEMM(backend.GroupedGEMMArgs{Kind: backend.GroupedForward, A: d.gu, B: m.GateUp, Out: dxs, Offsets: d.offsets})
	}
	if err != nil {
		return T{}, wrap(m.Name+" gate_up", err)
	}
	if dx, err = p.out(n, cw); err != nil {
		return T{}, wrap(m.Name, err)
	}
	if err = o.MoEPermuteBackward(backend.MoEPermuteBackwardArgs{DXs: dxs, Slot: d.slot, DX: dx}); err != nil {
		return T{}, wrap(m.Name+" permute", err)
	}
	if dlogits, err = p.out(n, ne); err != nil {
		return T{}, wrap(m.Name, err)
	}
	if err = o.MoERouteBackward(backend.MoERouteBackwardArgs{MoERouting: m.routing(), Probs: d.probs, Sel: d.sel, Weights: d.weights,
		DWeights: dw, DLogits: dlogits}); err != nil {
		return T{}, wrap(m.Name+" router", err)
	}
	if err = m.Router.Backward(p, dx, dlogits, m.c.x, true); err != nil {
		return T{}, err
	}
	return dx, nil
}

// checkDevice validates the stacked weights' shapes for the device path.
func (m *OSSMoE) checkDevice() error {
	ne, cw, iw := m.dims()
	for _, c := range []struct {
		name string
		t    T
		dims []int
	}{{"gate_up_proj", m.GateUp, []int{ne, cw, 2 * iw}}, {"gate_up_proj_bias", m.GateUpBias, []int{ne, 2 * iw}},
		{"down_proj", m.Down, []int{ne, iw, cw}}, {"down_proj_bias", m.DownBias, []int{ne, cw}}} {
		if c.t.Rank() != len(c.dims) {
			return fmt.Errorf("nn: %s: %s %v, want %v", m.Name, c.name, c.t, c.dims)
		}
		for i, v := range c.dims {
			if c.t.Dim(i) != v {
				return fmt.Errorf("nn: %s: %s %v, want %v", m.Name, c.name, c.t, c.dims)
			}
		}
	}
	return nil
}
