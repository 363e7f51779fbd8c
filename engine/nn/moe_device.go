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
//	experts:      ys [S,C] = Expert_e(xs) for the rows of each expert (GroupedExperts: two
//	              grouped GEMMs and the packed SwiGLU), or, under a SortedRunner (expert
//	              parallelism), the same on the experts' owners
//	MoECombine:   out[n] = sum_k weights[n,k] * ys[slot[n,k]]   [N,C]
//
// and the backward in reverse (MoECombineBackward, the experts' backward, MoEPermuteBackward,
// MoERouteBackward, the router's backward). Cached for backward (keep): probs [N,E] F32, sel,
// weights and slot [N,K], offsets [E+1], ys [S,C], and the experts' gate|up rows gu [S,2I]
// (MoEKeptBytes counts them). The sorted rows xs [S,C] and the SwiGLU output act [S,I] are not
// kept: the backward sorts x again (MoEPermute, a gather) and recomputes act from gu (one
// elementwise pass), which saves K*(C+I) activation elements per token and layer. The
// per-expert statistics (the loads, as a copy of the offsets; the aux loss's counts and
// probability sums) stay on the device until the model reads them once per forward
// (Routing.Fetch).

// moeDev is the device-path cache of one forward.
type moeDev struct {
	probs, sel, weights T // [N,E] F32, [N,K] I32, [N,K] F32
	offsets, slot       T // [E+1] I32, [N,K] I32
	ys                  T // [S,C]
	experts             GroupedExperts
	sorted              SortedRunner // the runner that computed the experts, if any
}

func (d *moeDev) release(p *Pass) {
	d.experts.Release(p.B)
	_ = free(p.B, &d.probs, &d.sel, &d.weights, &d.offsets, &d.slot, &d.ys)
	d.sorted = nil
}

// MoEKeptBytes is the device memory a device-path MoE block keeps from a training forward for
// its backward, for n tokens of hidden size c, e experts, top-k k and expert width inter, with
// activations of el bytes: probs [N,E] F32; sel, weights and slot [N,K] of 4 bytes; offsets
// [E+1] I32; gate|up [S,2I] and the experts' outputs [S,C] in the activation dtype (S = N*K).
// The routing statistics (offsets [E+1] I32 and probability sums [E] F32) are apart: they live
// until the model reads them after the forward. Not kept, and so not counted: the sorted rows
// [S,C] and the SwiGLU output [S,I] (MoERecomputedBytes).
//
// With HALO_MOE_EXPERT_OUTPUTS=recompute (the default) the experts' outputs are not kept
// either (a block holding its experts; under expert parallelism they are): K*C*el bytes per
// token fewer.
func MoEKeptBytes(n, c, e, k, inter, el int) int64 {
	n64, s := int64(n), int64(n)*int64(k)
	if !MoEKeepsExpertOutputs() {
		c = 0
	}
	return n64*int64(e)*4 + 3*s*4 + int64(e+1)*4 + s*int64(2*inter+c)*int64(el)
}

// MoEBesideKeptBytes is what a device-path MoEBesideMLP (Gemma 4's MoE block beside its MLP)
// keeps for its backward beyond its dense branch, for n tokens: MoEKeptBytes of its GeGLU
// experts, the router's normed input, the experts' normed input and their combined output [N,C]
// in the activation dtype with the three norms' rstd [N] F32, and the per-expert scale [E] F32.
func MoEBesideKeptBytes(n, c, e, k, inter, el int) int64 {
	return MoEKeptBytes(n, c, e, k, inter, el) + int64(n)*(3*int64(c)*int64(el)+3*4) + int64(e)*4
}

// MoEKeepsExpertOutputs reports whether a MoE block holding its experts keeps their outputs
// ys [S,C] for the backward (HALO_MOE_EXPERT_OUTPUTS=keep). Under expert parallelism the
// outputs are always kept.
func MoEKeepsExpertOutputs() bool { return !swMoEOutputs.Is("recompute") }

// MoERecomputedBytes is what the device path's backward recomputes rather than keeps: the
// sorted rows [S,C] and the SwiGLU output [S,I], K*(C+I)*el bytes per token.
func MoERecomputedBytes(n, c, k, inter, el int) int64 {
	return int64(n) * int64(k) * int64(c+inter) * int64(el)
}

// GroupedExperts computes stacked SwiGLU (or GeGLU) experts over rows sorted by expert, one
// grouped GEMM per projection, for the rows [offsets[g], offsets[g+1]) of each expert g:
//
//	gu  = xs · GateUp_g^T         [M,2I]   (gate rows, then up rows)
//	act = silu(gu[:, :I]) * gu[:, I:]   [M,I]   (gelu_tanh(gu[:, :I]) * gu[:, I:] with GeGLU)
//	ys  = act · Down_g^T          [M,C]
//
// Cached for backward (keep): gu only, and a reference to offsets (the caller keeps it
// alive). The backward recomputes act from gu and takes the input rows from its caller. The
// parameter gradients GateUp.GW and Down.GW are "+="; a zero GW skips that gradient.
type GroupedExperts struct {
	Name         string
	GateUp, Down Linear // W [G,2I,C] and [G,C,I]
	// OverwriteGateUp and OverwriteDown make the next Backward write GateUp.GW and Down.GW
	// (=) instead of adding to them (+=): they hold no values yet this step (FreshGrads). The
	// weight-gradient GEMM writes every expert's block, zeros for an expert without rows. Each
	// is cleared by the Backward that honours it.
	OverwriteGateUp, OverwriteDown bool
	// GeGLU makes the experts GeGLU (Gemma 4's): the packed activation is GeGLUPacked.
	GeGLU bool

	gu, offsets T
}

// Usable reports whether o has the packed activation of these experts and the grouped GEMM.
func (g *GroupedExperts) Usable(o backend.Optional) bool {
	if o.GroupedGEMM == nil {
		return false
	}
	if g.GeGLU {
		return o.GeGLUPacked != nil && o.GeGLUPackedBackward != nil
	}
	return o.SwiGLUPacked != nil && o.SwiGLUPackedBackward != nil
}

// act writes the packed activation of gu [M,2I] into out [M,I].
func (g *GroupedExperts) act(o backend.Optional, out, gu T) error {
	if g.GeGLU {
		return wrap(g.Name+" geglu", o.GeGLUPacked(out, gu))
	}
	return wrap(g.Name+" swiglu", o.SwiGLUPacked(out, gu))
}

// actBackward writes the packed activation's gradient into dgu [M,2I] (may be gu).
func (g *GroupedExperts) actBackward(o backend.Optional, dgu, dact, gu T) error {
	if g.GeGLU {
		return wrap(g.Name+" geglu", o.GeGLUPackedBackward(dgu, dact, gu))
	}
	return wrap(g.Name+" swiglu", o.SwiGLUPackedBackward(dgu, dact, gu))
}

// Forward returns ys [M,C] (new; the caller owns it) for xs [M,C] and offsets [G+1] I32.
func (g *GroupedExperts) Forward(p *Pass, o backend.Optional, xs, offsets T, keep bool) (ys T, err error) {
	if !g.gu.IsNil() {
		return T{}, fmt.Errorf("nn: %s: grouped experts Forward called twice without Backward or Release", g.Name)
	}
	s, c := xs.Dim(0), xs.Dim(1)
	inter := g.GateUp.W.Dim(1) / 2
	var gu, act T
	defer func() {
		_ = free(p.B, &act)
		if err != nil {
			_ = free(p.B, &gu, &ys)
		}
	}()
	if gu, err = p.out(s, 2*inter); err != nil {
		return T{}, wrap(g.Name, err)
	}
	if err = o.GroupedGEMM(backend.GroupedGEMMArgs{Kind: backend.GroupedForward, A: xs, B: g.GateUp.W, Out: gu, Offsets: offsets}); err != nil {
		return T{}, wrap(g.GateUp.Name, err)
	}
	if act, err = p.out(s, inter); err != nil {
		return T{}, wrap(g.Name, err)
	}
	if err = g.act(o, act, gu); err != nil {
		return T{}, err
	}
	if ys, err = p.out(s, c); err != nil {
		return T{}, wrap(g.Name, err)
	}
	if err = o.GroupedGEMM(backend.GroupedGEMMArgs{Kind: backend.GroupedForward, A: act, B: g.Down.W, Out: ys, Offsets: offsets}); err != nil {
		return T{}, wrap(g.Down.Name, err)
	}
	if keep {
		g.gu, g.offsets = gu, offsets
	} else {
		_ = free(p.B, &gu)
	}
	return ys, nil
}

// Backward takes dys [M,C], which it frees (the caller hands it over), and rows, which returns
// the forward's input rows xs [M,C] when the last weight gradient needs them (owned: Backward
// frees them after that use); it adds the parameter gradients and returns dxs [M,C] (new; the
// caller owns it), and releases the cache. Each buffer is freed once its last use is queued, so
// the backward holds at most max(dys + gu + two [M,I], gu + dxs + xs) at once.
func (g *GroupedExperts) Backward(p *Pass, o backend.Optional, dys T, rows func() (xs T, owned bool, err error)) (dxs T, err error) {
	dxs, _, err = g.backward(p, o, dys, T{}, rows)
	return dxs, err
}

// backward is Backward, and with ws [M,1] F32 set, the backward of ys weighted by ws without
// ys: dys is then the unweighted gradient dyu, and it also returns dws [M] F32 (new) with
// dws[r] = dot(dyu[r] · Down_g, act[r]), the gradient of the weight of row r; the weighted
// gradients are dyu and its input gradient scaled by ws.
func (g *GroupedExperts) backward(p *Pass, o backend.Optional, dys, ws T, rows func() (xs T, owned bool, err error)) (dxs, dws T, err error) {
	var dact, act, xs, w T
	owned := false
	defer func() {
		_ = free(p.B, &dys, &dact, &act)
		if owned {
			_ = free(p.B, &xs)
		}
		if err != nil {
			_ = free(p.B, &dxs, &dws)
		}
	}()
	if g.gu.IsNil() {
		return T{}, T{}, fmt.Errorf("nn: %s: grouped experts Backward without a cached Forward", g.Name)
	}
	defer g.Release(p.B)
	s, inter, c := g.gu.Dim(0), g.gu.Dim(1)/2, dys.Dim(1)
	if dact, err = p.out(s, inter); err != nil {
		return T{}, T{}, wrap(g.Name, err)
	}
	if err = o.GroupedGEMM(backend.GroupedGEMMArgs{Kind: backend.GroupedInputGrad, A: dys, B: g.Down.W, Out: dact, Offsets: g.offsets}); err != nil {
		return T{}, T{}, wrap(g.Down.Name, err)
	}
	if !g.Down.GW.IsNil() || !ws.IsNil() {
		// The activation was not kept: recompute it from gu for the weight gradients.
		if act, err = p.out(s, inter); err != nil {
			return T{}, T{}, wrap(g.Name, err)
		}
		if err = g.act(o, act, g.gu); err != nil {
			return T{}, T{}, err
		}
	}
	if !ws.IsNil() {
		if w, err = ws.Reshape(s); err != nil {
			return T{}, T{}, wrap(g.Name, err)
		}
		if dws, err = p.outF32(s); err != nil {
			return T{}, T{}, wrap(g.Name, err)
		}
		if err = p.B.RowDot(dws, dact, act); err != nil {
			return T{}, T{}, wrap(g.Name+" weight gradient", err)
		}
		if err = p.B.ScaleRows(dys, w); err != nil {
			return T{}, T{}, wrap(g.Name+" weights", err)
		}
		if err = p.B.ScaleRows(dact, w); err != nil {
			return T{}, T{}, wrap(g.Name+" weights", err)
		}
	}
	if !g.Down.GW.IsNil() {
		if err = o.GroupedGEMM(backend.GroupedGEMMArgs{Kind: backend.GroupedWeightGrad, A: dys, B: act, Out: g.Down.GW, Offsets: g.offsets, Accumulate: !g.OverwriteDown}); err != nil {
			return T{}, T{}, wrap(g.Down.Name, err)
		}
		g.OverwriteDown = false
	}
	_ = free(p.B, &act, &dys)
	// gu becomes its own gradient.
	if err = g.actBackward(o, g.gu, dact, g.gu); err != nil {
		return T{}, T{}, err
	}
	_ = free(p.B, &dact)
	if dxs, err = p.out(s, c); err != nil {
		return T{}, T{}, wrap(g.Name, err)
	}
	if err = o.GroupedGEMM(backend.GroupedGEMMArgs{Kind: backend.GroupedInputGrad, A: g.gu, B: g.GateUp.W, Out: dxs, Offsets: g.offsets}); err != nil {
		return T{}, T{}, wrap(g.GateUp.Name, err)
	}
	if !g.GateUp.GW.IsNil() {
		if xs, owned, err = rows(); err != nil {
			return T{}, T{}, err
		}
		if err = o.GroupedGEMM(backend.GroupedGEMMArgs{Kind: backend.GroupedWeightGrad, A: g.gu, B: xs, Out: g.GateUp.GW, Offsets: g.offsets, Accumulate: !g.OverwriteGateUp}); err != nil {
			return T{}, T{}, wrap(g.GateUp.Name, err)
		}
		g.OverwriteGateUp = false
	}
	return dxs, dws, nil
}

// Release drops the cache of a Forward.
func (g *GroupedExperts) Release(b backend.Backend) {
	_ = free(b, &g.gu)
	g.offsets = T{}
}

// deviceOps reports whether this forward can take the device path, and the ops. A block
// holding every expert computes them itself; one with a SortedRunner (expert parallelism)
// hands the sorted rows to it.
func (m *MoE) deviceOps(p *Pass, x T) (backend.Optional, bool) {
	o := p.B.Optional()
	_, sorted := m.Runner.(SortedRunner)
	experts := (m.Runner == nil && m.holdsAll()) || sorted
	ok := !m.Composed && m.SparseMixer == nil && !swMoEPath.Is("composed") && experts && x.Rank() == 2 && x.Dim(0) > 0 && !m.GateUp.W.IsNil() && !m.Down.W.IsNil() &&
		o.MoERoute != nil && o.MoERouteBackward != nil && o.MoEPermute != nil && o.MoEPermuteBackward != nil &&
		o.MoECombine != nil && o.MoECombineBackward != nil && (&GroupedExperts{}).Usable(o)
	return o, ok
}

// checkStacked checks the stacked weights of the held experts against the block: GateUp
// [E_held,2I,C], Down [E_held,C,I].
func (m *MoE) checkStacked(c int) (inter int, err error) {
	e := len(m.Experts)
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
	if !m.ScoreBias.IsNil() && m.ScoreBias.Numel() != e {
		return T{}, fmt.Errorf("nn: %s: score correction bias %v has %d entries for %d experts", m.Name, m.ScoreBias, m.ScoreBias.Numel(), e)
	}
	if _, err := m.checkStacked(c); err != nil {
		return T{}, err
	}
	sr, _ := m.Runner.(SortedRunner)
	s := n * k
	d := &m.d
	r := &m.r
	r.reset()
	r.N, r.E, r.K = n, e, k
	var logits, order, counts, xs, sbias T
	defer func() {
		_ = free(p.B, &logits, &order, &counts, &xs, &sbias)
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
	if !m.ScoreBias.IsNil() {
		// The checkpoint's correction bias in fp32, plus the balancing bias when set.
		if sbias, err = p.outF32(e); err == nil {
			err = p.B.Copy(sbias, m.ScoreBias)
		}
		if err == nil && !bias.IsNil() {
			err = p.B.Add(sbias, sbias, bias)
		}
		if err != nil {
			return T{}, wrap(m.Name+" score bias", err)
		}
		bias = sbias
	}
	i32 := func(shape ...int) (T, error) { return p.B.Alloc(tensor.I32, shape...) }
	if d.probs, err = p.outF32(n, e); err == nil {
		if d.sel, err = i32(n, k); err == nil {
			if d.weights, err = p.outF32(n, k); err == nil {
				if r.offsets, err = i32(e + 1); err == nil {
					if r.psum, err = p.outF32(e); err == nil && sr != nil {
						counts, err = i32(e) // zero: MoERoute adds to it
					}
				}
			}
		}
	}
	if err != nil {
		return T{}, wrap(m.Name, err)
	}
	r.b = p.B
	route := m.routing()
	if err = o.MoERoute(backend.MoERouteArgs{MoERouting: route, Logits: logits, Bias: bias, Probs: d.probs, Sel: d.sel,
		Weights: d.weights, ProbSum: r.psum, Counts: counts}); err != nil {
		return T{}, wrap(m.Name+" router", err)
	}
	if !bias.IsNil() || route.Grouped() {
		// The load-balancing loss counts the top-k of the probabilities alone, over every
		// expert.
		if err = m.unbiasedCounts(p, o, route, logits); err != nil {
			return T{}, err
		}
	}
	_ = free(p.B, &logits)
	if d.offsets, err = i32(e + 1); err == nil {
		if order, err = i32(s); err == nil {
			if d.slot, err = i32(n, k); err == nil {
				xs, err = p.out(s, c)
			}
		}
	}
	if err != nil {
		return T{}, wrap(m.Name, err)
	}
	if err = o.MoEPermute(backend.MoEPermuteArgs{E: e, Sel: d.sel, X: x, Offsets: d.offsets, Order: order, Slot: d.slot, Xs: xs}); err != nil {
		return T{}, wrap(m.Name+" permute", err)
	}
	// The expert loads are the offsets' differences: keep a copy for Fetch.
	if err = p.B.Copy(r.offsets, d.offsets); err != nil {
		return T{}, wrap(m.Name, err)
	}
	_ = free(p.B, &order)
	if sr != nil {
		d.sorted = sr
		d.ys, err = sr.ForwardSorted(p, m, xs, d.offsets, counts, keep)
	} else {
		d.experts = GroupedExperts{Name: m.Name, GateUp: m.GateUp, Down: m.Down}
		d.ys, err = d.experts.Forward(p, o, xs, d.offsets, keep)
	}
	if err != nil {
		return T{}, err
	}
	_ = free(p.B, &xs, &counts)
	if out, err = p.out(n, c); err != nil {
		return T{}, wrap(m.Name, err)
	}
	if err = o.MoECombine(backend.MoECombineArgs{Ys: d.ys, Slot: d.slot, Weights: d.weights, Out: out}); err != nil {
		return T{}, wrap(m.Name+" combine", err)
	}
	if sr == nil && swMoEOutputs.Is("recompute") {
		// The backward takes the weights' gradient without the outputs (deviceBackward).
		_ = free(p.B, &d.ys)
	}
	return out, nil
}

// unbiasedCounts routes the logits again without the biases and the group limit, keeping only
// the per-expert counts (the aux loss's F term; transformers' top-k of the probabilities).
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
	route.NGroup, route.TopKGroup = 0, 0
	return wrap(m.Name+" router", o.MoERoute(backend.MoERouteArgs{MoERouting: route, Logits: logits, Probs: probs, Sel: sel, Weights: w, Counts: m.r.auxCounts}))
}

// sortAgain writes the rows of x sorted by expert into a new xs [S,C], as the forward's
// MoEPermute did (the backward's input rows of the experts, not kept by the forward).
func (m *MoE) sortAgain(p *Pass, o backend.Optional) (T, error) {
	return m.sortBy(p, o, m.d.sel, m.x)
}

// sortBy gathers the rows of x [R,C'] in the order MoEPermute sorts sel [R,K'] by expert:
// a new [R*K', C'] tensor of x's dtype. With sel the forward's [N,K] and x [N,·] it is the
// forward's sort; with sel viewed as [S,1] and x [S,·] (one row per slot) it sorts per-slot
// values, such as the routing weights, into the slots' sorted order.
func (m *MoE) sortBy(p *Pass, o backend.Optional, sel, x T) (T, error) {
	return sortRows(p, o, m.Name, m.r.E, sel, x)
}

// sortRows is MoE.sortBy for a block named name of e experts.
func sortRows(p *Pass, o backend.Optional, name string, e int, sel, x T) (xs T, err error) {
	rows, k := sel.Dim(0), sel.Dim(1)
	var off, order, slot T
	defer func() {
		_ = free(p.B, &off, &order, &slot)
		if err != nil {
			_ = free(p.B, &xs)
		}
	}()
	i32 := func(shape ...int) (T, error) { return p.B.Empty(tensor.I32, shape...) }
	if off, err = i32(e + 1); err == nil {
		if order, err = i32(rows * k); err == nil {
			if slot, err = i32(rows, k); err == nil {
				xs, err = p.B.Empty(x.DType(), rows*k, x.Dim(1))
			}
		}
	}
	if err != nil {
		return T{}, wrap(name, err)
	}
	return xs, wrap(name+" permute", o.MoEPermute(backend.MoEPermuteArgs{E: e, Sel: sel, X: x, Offsets: off, Order: order, Slot: slot, Xs: xs}))
}

// unweightedBackward is the experts' backward without their kept outputs
// (HALO_MOE_EXPERT_OUTPUTS=recompute): the output gradient goes into the slots unweighted,
// dyu[p] = dy[n] for the slot p of (n,j), and with ws[p] = weights[n,j] sorted the same way,
//
//	d weights[n,j] = dot(dy[n], ys[p]) = dot(dyu[p] · Down_e, act[p])
//
// which GroupedExperts' backward computes beside the gradients (it scales dyu and its input
// gradient by ws where the weighted ones are needed). It writes dw [N,K] and returns dxs.
func (m *MoE) unweightedBackward(p *Pass, o backend.Optional, dy, dw T) (dxs T, err error) {
	d := &m.d
	return unweightedExperts(p, o, m.Name, m.r.E, &d.experts, d.sel, d.weights, d.slot, m.x, dy, dw)
}

// unweightedExperts is the unweighted backward of grouped experts ex of a block named name with
// e experts, for the forward's sel, weights and slot [N,K], its experts' input rows x [N,C]
// (sorted again for the weight gradient) and the output gradient dy [N,C]: it writes dw [N,K]
// and returns dxs [S,C].
func unweightedExperts(p *Pass, o backend.Optional, name string, e int, ex *GroupedExperts, sel, weights, slot, x, dy, dw T) (dxs T, err error) {
	s := sel.Numel()
	var dyu, ws, dws T
	defer func() { _ = free(p.B, &dyu, &ws, &dws) }()
	if dyu, err = sortRows(p, o, name, e, sel, dy); err != nil {
		return T{}, err
	}
	sel1, err := sel.Reshape(s, 1)
	if err != nil {
		return T{}, wrap(name, err)
	}
	w1, err := weights.Reshape(s, 1)
	if err != nil {
		return T{}, wrap(name, err)
	}
	if ws, err = sortRows(p, o, name, e, sel1, w1); err != nil {
		return T{}, err
	}
	dxs, dws, err = ex.backward(p, o, dyu, ws, func() (T, bool, error) {
		xs, err := sortRows(p, o, name, e, sel, x)
		return xs, true, err
	})
	dyu = T{} // freed by the experts' backward
	if err != nil {
		return T{}, err
	}
	// dw[n,j] = dws[slot[n,j]]: the permute's backward with one slot per row.
	slot1, err := slot.Reshape(s, 1)
	if err != nil {
		return T{}, wrap(name, err)
	}
	dw1, err := dw.Reshape(s, 1)
	if err != nil {
		return T{}, wrap(name, err)
	}
	dws1, err := dws.Reshape(s, 1)
	if err != nil {
		return T{}, wrap(name, err)
	}
	if err = o.MoEPermuteBackward(backend.MoEPermuteBackwardArgs{DXs: dws1, Slot: slot1, DX: dw1}); err != nil {
		_ = free(p.B, &dxs)
		return T{}, wrap(name+" combine", err)
	}
	return dxs, nil
}

// weightedBackward is the experts' backward with their kept outputs: the combine's backward
// weights the output gradient into the slots and takes the weights' gradient dw [N,K] against
// ys; the experts (here or on their owners) take the slots' gradient back to dxs.
func (m *MoE) weightedBackward(p *Pass, o backend.Optional, dy, dw T) (dxs T, err error) {
	d := &m.d
	dys, err := p.out(m.r.N*m.r.K, dy.Dim(1))
	if err != nil {
		return T{}, wrap(m.Name, err)
	}
	defer func() { _ = free(p.B, &dys) }()
	if err = o.MoECombineBackward(backend.MoECombineBackwardArgs{DOut: dy, Ys: d.ys, Slot: d.slot, Weights: d.weights, DYs: dys, DWeights: dw}); err != nil {
		return T{}, wrap(m.Name+" combine", err)
	}
	_ = free(p.B, &d.ys)
	if d.sorted != nil {
		return d.sorted.BackwardSorted(p, m, dys)
	}
	// The experts' backward frees dys early and asks for the re-sorted rows late.
	g := dys
	dys = T{}
	return d.experts.Backward(p, o, g, func() (T, bool, error) {
		xs, err := m.sortAgain(p, o)
		return xs, true, err
	})
}

func (m *MoE) deviceBackward(p *Pass, o backend.Optional, dy T) (dx T, err error) {
	d := &m.d
	r := &m.r
	n, e, k := r.N, r.E, r.K
	c := dy.Dim(1)
	var dw, dxs, aux, dlogits T
	defer func() {
		_ = free(p.B, &dw, &dxs, &aux, &dlogits)
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
	if d.ys.IsNil() && d.sorted == nil {
		// The forward did not keep the experts' outputs (HALO_MOE_EXPERT_OUTPUTS=recompute).
		dxs, err = m.unweightedBackward(p, o, dy, dw)
	} else {
		dxs, err = m.weightedBackward(p, o, dy, dw)
	}
	if err != nil {
		return T{}, err
	}
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
	if err = o.MoERouteBackward(backend.MoERouteBackwardArgs{MoERouting: m.routing(),
		Probs: d.probs, Sel: d.sel, Weights: d.weights, DWeights: dw, AuxGrad: aux, DLogits: dlogits}); err != nil {
		return T{}, wrap(m.Name+" router", err)
	}
	if err = m.Router.Backward(p, dx, dlogits, m.x, true); err != nil {
		return T{}, err
	}
	return dx, nil
}
