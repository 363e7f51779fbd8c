package nn

import (
	"fmt"
	"math"
	"slices"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// MoEBesideMLP is Gemma 4's feed-forward block with the mixture of experts beside the dense
// MLP (enable_moe_block). It reads the residual stream x itself (Block.FFNOnResidual), not a
// pre-normed copy:
//
//	d      = PostMLP(MLP(PreMLP(x)))                                   [N,C]
//	r      = RMSNorm(x) * RouterScale * C^-1/2 (no weight of its own)  [N,C]
//	p      = softmax(r @ Router^T) in fp32                             [N,E]
//	S_n    = the TopK experts of token n by p[n]
//	w_n,e  = p[n,e] / sum_{S_n} p * PerExpertScale[e]
//	e      = PostExperts(sum_{e in S_n} w_n,e * Expert_e(PreExperts(x)))
//	out    = d + e
//
// The experts are GeGLU (gelu_tanh(gate) * up, then down) without biases.
//
// Two paths compute the experts, as for MoE. When the backend has the optional MoE ops,
// GeGLUPacked and GroupedGEMM (backend.Optional) and the experts' weights are stacked (GateUp,
// Down), the device path (moe_beside_mlp_device.go) reads nothing on the host: MoERoute (the
// softmax top-k renormalised and multiplied by PerExpertScale, its ExpertScale), MoEPermute,
// two grouped GEMMs around the packed GeGLU (GroupedExperts), MoECombine, and their
// backwards, MoERouteBackward giving the per-expert scale's gradient too. Otherwise, or with
// Composed or HALO_MOE_PATH=composed, routing runs on the host, as the host composition of MoE
// does: the router logits [N,E] are downloaded, the selection and weights computed, each
// expert runs on its rows (gathered with the Embedding op, scatter-added back with
// EmbeddingBackward, weighted with ScaleRows), and the backward takes the weights' gradient
// with RowDot, so every backend that runs the dense layers runs this block. The host path is
// the reference of the device path.
//
// Cached for backward (keep): x (not owned), the inputs of the norms and their rstd, the
// router's normed input, the experts' normed input x2 and their sum e; on the host path per
// expert its rows' ids, gathered input, gate, up, product, weights and unweighted output, and
// on the host the probabilities, selection and weights; on the device path the
// probabilities [N,E] F32, sel, weights and slot [N,K], offsets [E+1], the per-expert scale in
// F32, the experts' gate|up rows [S,2I] and, with HALO_MOE_EXPERT_OUTPUTS=keep, their outputs
// [S,C].
type MoEBesideMLP struct {
	Name string
	// PreMLP, MLP and PostMLP are the dense branch (pre_feedforward_layernorm, mlp,
	// post_feedforward_layernorm_1).
	PreMLP  RMSNorm
	MLP     *MLP
	PostMLP RMSNorm
	// Router W [E,C]; RouterScale [C] and PerExpertScale [E] with their gradients GRouterScale
	// and GPerExpertScale (optional: frozen).
	Router                          Linear
	RouterScale, GRouterScale       T
	PerExpertScale, GPerExpertScale T
	// RouterEps is the epsilon of the router's norm.
	RouterEps float32
	// PreExperts and PostExperts normalise the experts' input and output
	// (pre_feedforward_layernorm_2, post_feedforward_layernorm_2).
	PreExperts, PostExperts RMSNorm
	Experts                 []Expert
	TopK                    int
	// GateUp and Down are the experts' weights stacked for the device path, with their
	// gradients: GateUp.W [E,2I,C] holds expert e's gate rows then its up rows, Down.W
	// [E,C,I]; the memory the Experts' Linear views read. Zero tensors: the host path.
	GateUp, Down Linear
	// Composed makes the block run the host path even where the device path could (the
	// reference); HALO_MOE_PATH=composed does it for every block.
	Composed bool

	dv    besideDev // device-path cache
	onDev bool      // the cached forward took the device path

	x                T
	h, rh, d, d1r    T // PreMLP out, its rstd; MLP out; PostMLP rstd
	rn, rr           T // router norm out and rstd
	gain             T // RouterScale * C^-1/2 in F32
	x2, r2, e, er    T // PreExperts out and rstd; experts' sum; PostExperts rstd
	probs            []float32
	sel              []int32
	weights, pesHost []float32
	ex               []besideExpert
	live             bool
}

// besideExpert is what one expert's forward keeps for its backward.
type besideExpert struct {
	rows           []int32 // token of each row
	slot           []int32 // top-k slot of each row
	ids, w         T       // [M] I32 and [M] F32 on the device
	xe, g, u, a, o T
}

var _ FFN = (*MoEBesideMLP)(nil)

func (m *MoEBesideMLP) routerGain(p *Pass) error {
	c := m.RouterScale.Dim(0)
	var err error
	if m.gain, err = p.B.Alloc(tensor.F32, c); err != nil {
		return wrap(m.Name+" router", err)
	}
	return wrap(m.Name+" router", p.B.Axpy(m.gain, float32(1/math.Sqrt(float64(c))), m.RouterScale))
}

// Forward implements FFN; x is the residual stream [N,C].
func (m *MoEBesideMLP) Forward(p *Pass, x T, keep bool) (out T, err error) {
	if m.live {
		return T{}, fmt.Errorf("nn: %s: Forward called twice without Backward or Release", m.Name)
	}
	if m.TopK < 1 || m.TopK > len(m.Experts) {
		return T{}, fmt.Errorf("nn: %s: top-k %d must be between 1 and the %d experts", m.Name, m.TopK, len(m.Experts))
	}
	m.x, m.live = x, true
	defer func() {
		if err != nil || !keep {
			m.Release(p)
		}
	}()
	if m.h, m.rh, err = m.PreMLP.Forward(p, x); err != nil {
		return T{}, err
	}
	if m.d, err = m.MLP.Forward(p, m.h, keep); err != nil {
		return T{}, err
	}
	if out, m.d1r, err = m.PostMLP.Forward(p, m.d); err != nil {
		return T{}, err
	}
	defer func() {
		if err != nil {
			_ = free(p.B, &out)
		}
	}()
	if o, ok := m.deviceOps(p, x); ok {
		m.onDev = true
		if err = m.deviceForward(p, o, x, keep); err != nil {
			return T{}, err
		}
	} else {
		if err = m.route(p, x); err != nil {
			return T{}, err
		}
		if m.x2, m.r2, err = m.PreExperts.Forward(p, x); err != nil {
			return T{}, err
		}
		if m.e, err = p.alloc(x.Shape()...); err != nil {
			return T{}, wrap(m.Name, err)
		}
		if err = m.expertsForward(p); err != nil {
			return T{}, err
		}
	}
	e2, er, err := m.PostExperts.Forward(p, m.e)
	if err != nil {
		return T{}, err
	}
	m.er = er
	err = p.B.Add(out, out, e2)
	_ = free(p.B, &e2)
	if err != nil {
		return T{}, wrap(m.Name, err)
	}
	return out, nil
}

// routerLogits normalises x for the router (keeping rn, rr and gain) and returns the router
// logits [N,E] (new).
func (m *MoEBesideMLP) routerLogits(p *Pass, x T) (lt T, err error) {
	if err = m.routerGain(p); err != nil {
		return T{}, err
	}
	norm := RMSNorm{Name: m.Name + ".router.norm", W: m.gain, Eps: m.RouterEps}
	if m.rn, m.rr, err = norm.Forward(p, x); err != nil {
		return T{}, err
	}
	return m.Router.Forward(p, m.rn)
}

// route runs the router on x and computes the selection and weights on the host.
func (m *MoEBesideMLP) route(p *Pass, x T) (err error) {
	lt, err := m.routerLogits(p, x)
	if err != nil {
		return err
	}
	logits, err := backend.ToFloat32(p.B, lt)
	_ = free(p.B, &lt)
	if err != nil {
		return wrap(m.Name+" router", err)
	}
	if m.pesHost, err = backend.ToFloat32(p.B, m.PerExpertScale); err != nil {
		return wrap(m.Name+" router", err)
	}
	n, e, k := p.N, len(m.Experts), m.TopK
	if len(logits) != n*e {
		return fmt.Errorf("nn: %s: router gives %d logits for %d tokens and %d experts", m.Name, len(logits), n, e)
	}
	m.probs, m.sel, m.weights = make([]float32, n*e), make([]int32, n*k), make([]float32, n*k)
	order := make([]int, e)
	for t := 0; t < n; t++ {
		l, pr := logits[t*e:(t+1)*e], m.probs[t*e:(t+1)*e]
		mx := slices.Max(l)
		sum := 0.0
		for j, v := range l {
			ev := math.Exp(float64(v - mx))
			pr[j] = float32(ev)
			sum += ev
		}
		for j := range pr {
			pr[j] = float32(float64(pr[j]) / sum)
		}
		for j := range order {
			order[j] = j
		}
		slices.SortStableFunc(order, func(a, b int) int {
			switch {
			case pr[a] > pr[b]:
				return -1
			case pr[a] < pr[b]:
				return 1
			}
			return 0
		})
		top := 0.0
		for j := 0; j < k; j++ {
			top += float64(pr[order[j]])
		}
		for j := 0; j < k; j++ {
			ex := order[j]
			m.sel[t*k+j] = int32(ex)
			m.weights[t*k+j] = float32(float64(pr[ex])/top) * m.pesHost[ex]
		}
	}
	return nil
}

// expertsForward runs each expert on its rows of x2 and scatter-adds the weighted outputs into e.
func (m *MoEBesideMLP) expertsForward(p *Pass) error {
	n, k := p.N, m.TopK
	m.ex = make([]besideExpert, len(m.Experts))
	for t := 0; t < n; t++ {
		for j := 0; j < k; j++ {
			ex := &m.ex[m.sel[t*k+j]]
			ex.rows = append(ex.rows, int32(t))
			ex.slot = append(ex.slot, int32(t*k+j))
		}
	}
	c := m.x.Dim(1)
	for i := range m.ex {
		ex, w := &m.ex[i], &m.Experts[i]
		if len(ex.rows) == 0 {
			continue
		}
		name := fmt.Sprintf("%s.experts[%d]", m.Name, i)
		wts := make([]float32, len(ex.slot))
		for r, s := range ex.slot {
			wts[r] = m.weights[s]
		}
		var err error
		if ex.ids, err = backend.FromInt32(p.B, ex.rows, len(ex.rows)); err != nil {
			return wrap(name, err)
		}
		if ex.w, err = backend.FromFloat32(p.B, wts, tensor.F32, len(wts)); err != nil {
			return wrap(name, err)
		}
		if ex.xe, err = p.out(len(ex.rows), c); err != nil {
			return wrap(name, err)
		}
		if err = p.B.Embedding(ex.xe, m.x2, ex.ids); err != nil {
			return wrap(name+" gather", err)
		}
		if ex.g, err = w.Gate.Forward(p, ex.xe); err != nil {
			return err
		}
		if ex.u, err = w.Up.Forward(p, ex.xe); err != nil {
			return err
		}
		if ex.a, err = p.out(ex.g.Shape()...); err != nil {
			return wrap(name, err)
		}
		if err = p.B.GeGLU(ex.a, ex.g, ex.u); err != nil {
			return wrap(name, err)
		}
		if ex.o, err = w.Down.Forward(p, ex.a); err != nil {
			return err
		}
		ow, err := p.out(ex.o.Shape()...)
		if err != nil {
			return wrap(name, err)
		}
		if err = p.B.Copy(ow, ex.o); err == nil {
			if err = p.B.ScaleRows(ow, ex.w); err == nil {
				err = p.B.EmbeddingBackward(m.e, ow, ex.ids)
			}
		}
		_ = free(p.B, &ow)
		if err != nil {
			return wrap(name+" combine", err)
		}
	}
	return nil
}

// Backward implements FFN: it returns a new dx [N,C] (the gradient of the residual stream).
func (m *MoEBesideMLP) Backward(p *Pass, dy T) (dx T, err error) {
	if !m.live {
		return T{}, fmt.Errorf("nn: %s: Backward without a cached Forward", m.Name)
	}
	defer m.Release(p)
	var dd, dh, de, dx2 T
	defer func() { _ = free(p.B, &dd, &dh, &de, &dx2) }()
	// Dense branch.
	if dd, err = p.out(dy.Shape()...); err != nil {
		return T{}, wrap(m.Name, err)
	}
	if err = m.PostMLP.Backward(p, dd, dy, m.d, m.d1r, false); err != nil {
		return T{}, err
	}
	if dh, err = m.MLP.Backward(p, dd); err != nil {
		return T{}, err
	}
	if dx, err = p.out(dy.Shape()...); err != nil {
		return T{}, wrap(m.Name, err)
	}
	defer func() {
		if err != nil {
			_ = free(p.B, &dx)
		}
	}()
	if err = m.PreMLP.Backward(p, dx, dh, m.x, m.rh, false); err != nil {
		return T{}, err
	}
	// Experts.
	if de, err = p.out(dy.Shape()...); err != nil {
		return T{}, wrap(m.Name, err)
	}
	if err = m.PostExperts.Backward(p, de, dy, m.e, m.er, false); err != nil {
		return T{}, err
	}
	// Both paths write the stacked experts' gradients (the host path through the Experts'
	// views of them): a fresh one (FreshGrads) is overwritten by the device path's grouped
	// weight gradient and zeroed first for the host path, which accumulates.
	if m.onDev {
		o, ok := m.deviceOps(p, m.x)
		if !ok {
			return T{}, fmt.Errorf("nn: %s: the forward ran on the device path, which the backward's backend lacks", m.Name)
		}
		m.dv.experts.OverwriteGateUp, m.dv.experts.OverwriteDown = p.Fresh.Take(m.GateUp.GW), p.Fresh.Take(m.Down.GW)
		if err = m.deviceBackward(p, o, dx, de); err != nil {
			return T{}, err
		}
		return dx, nil
	}
	if err := zeroFresh(p, m.Name, m.GateUp.GW, m.Down.GW); err != nil {
		return T{}, err
	}
	if dx2, err = p.alloc(dy.Shape()...); err != nil {
		return T{}, wrap(m.Name, err)
	}
	dw := make([]float32, len(m.weights))
	if err = m.expertsBackward(p, de, dx2, dw); err != nil {
		return T{}, err
	}
	if err = m.PreExperts.Backward(p, dx, dx2, m.x, m.r2, true); err != nil {
		return T{}, err
	}
	// Router.
	if err = m.routerBackward(p, dx, dw); err != nil {
		return T{}, err
	}
	return dx, nil
}

// expertsBackward accumulates the experts' gradients, writes the gradient of their input into
// dx2 (+=) and the gradient of each routing weight into dw [N*K].
func (m *MoEBesideMLP) expertsBackward(p *Pass, de, dx2 T, dw []float32) error {
	c := m.x.Dim(1)
	for i := range m.ex {
		ex, w := &m.ex[i], &m.Experts[i]
		if len(ex.rows) == 0 {
			continue
		}
		name := fmt.Sprintf("%s.experts[%d]", m.Name, i)
		rows := len(ex.rows)
		var do, gw, da, dxe T
		err := func() (err error) {
			if do, err = p.out(rows, c); err != nil {
				return err
			}
			if err = p.B.Embedding(do, de, ex.ids); err != nil {
				return err
			}
			if gw, err = p.outF32(rows); err != nil {
				return err
			}
			if err = p.B.RowDot(gw, do, ex.o); err != nil {
				return err
			}
			g, err := backend.ToFloat32(p.B, gw)
			if err != nil {
				return err
			}
			for r, s := range ex.slot {
				dw[s] = g[r]
			}
			if err = p.B.ScaleRows(do, ex.w); err != nil {
				return err
			}
			if da, err = p.out(ex.a.Shape()...); err != nil {
				return err
			}
			if err = w.Down.Backward(p, da, do, ex.a, false); err != nil {
				return err
			}
			if err = p.B.GeGLUBackward(ex.g, ex.u, da, ex.g, ex.u); err != nil {
				return err
			}
			if dxe, err = p.out(rows, c); err != nil {
				return err
			}
			if err = w.Gate.Backward(p, dxe, ex.g, ex.xe, false); err != nil {
				return err
			}
			if err = w.Up.Backward(p, dxe, ex.u, ex.xe, true); err != nil {
				return err
			}
			return p.B.EmbeddingBackward(dx2, dxe, ex.ids)
		}()
		_ = free(p.B, &do, &gw, &da, &dxe)
		if err != nil {
			return wrap(name, err)
		}
	}
	return nil
}

// routerBackward takes the routing weights' gradient dw [N*K] back through the per-expert
// scale, the top-k renormalisation, the softmax, the router projection and its norm, adding
// the gradient of the residual stream into dx.
func (m *MoEBesideMLP) routerBackward(p *Pass, dx T, dw []float32) error {
	n, e, k := p.N, len(m.Experts), m.TopK
	dl := make([]float32, n*e)
	dpes := make([]float32, e)
	dp := make([]float64, e)
	for t := 0; t < n; t++ {
		pr := m.probs[t*e : (t+1)*e]
		top := 0.0
		for j := 0; j < k; j++ {
			top += float64(pr[m.sel[t*k+j]])
		}
		// q_j = p_j / top; w_j = q_j * pes_j.
		dq := make([]float64, k)
		dot := 0.0
		for j := 0; j < k; j++ {
			ex := m.sel[t*k+j]
			g := float64(dw[t*k+j])
			dpes[ex] += float32(g * float64(pr[ex]) / top)
			dq[j] = g * float64(m.pesHost[ex])
			dot += dq[j] * float64(pr[ex])
		}
		clear(dp)
		for j := 0; j < k; j++ {
			dp[m.sel[t*k+j]] = dq[j]/top - dot/(top*top)
		}
		s := 0.0
		for j := range pr {
			s += dp[j] * float64(pr[j])
		}
		for j := range pr {
			dl[t*e+j] = float32(float64(pr[j]) * (dp[j] - s))
		}
	}
	if !m.GPerExpertScale.IsNil() {
		g, err := backend.FromFloat32(p.B, dpes, tensor.F32, e)
		if err != nil {
			return wrap(m.Name+" router", err)
		}
		err = p.B.Axpy(m.GPerExpertScale, 1, g)
		_ = free(p.B, &g)
		if err != nil {
			return wrap(m.Name+" per-expert scale", err)
		}
	}
	dlt, err := backend.FromFloat32(p.B, dl, p.DType, n, e)
	if err != nil {
		return wrap(m.Name+" router", err)
	}
	defer func() { _ = free(p.B, &dlt) }()
	return m.routerInputBackward(p, dx, dlt)
}

// routerInputBackward takes the router logits' gradient dlt [N,E] back through the router
// projection and its norm, adding the gradient of the residual stream into dx and the
// gradients of the router and RouterScale into theirs.
func (m *MoEBesideMLP) routerInputBackward(p *Pass, dx, dlt T) error {
	drn, err := p.out(dx.Shape()...)
	if err != nil {
		return wrap(m.Name+" router", err)
	}
	defer func() { _ = free(p.B, &drn) }()
	if err = m.Router.Backward(p, drn, dlt, m.rn, false); err != nil {
		return err
	}
	c := m.RouterScale.Dim(0)
	var dg T
	if !m.GRouterScale.IsNil() {
		if dg, err = p.B.Alloc(tensor.F32, c); err != nil {
			return wrap(m.Name+" router", err)
		}
		defer func() { _ = free(p.B, &dg) }()
	}
	norm := RMSNorm{Name: m.Name + ".router.norm", W: m.gain, GW: dg, Eps: m.RouterEps}
	if err = norm.Backward(p, dx, drn, m.x, m.rr, true); err != nil {
		return err
	}
	if !dg.IsNil() {
		if err = p.B.Axpy(m.GRouterScale, float32(1/math.Sqrt(float64(c))), dg); err != nil {
			return wrap(m.Name+" router scale", err)
		}
	}
	return nil
}

// Release implements FFN.
func (m *MoEBesideMLP) Release(p *Pass) {
	if m.MLP != nil {
		m.MLP.Release(p)
	}
	_ = free(p.B, &m.h, &m.rh, &m.d, &m.d1r, &m.rn, &m.rr, &m.gain, &m.x2, &m.r2, &m.e, &m.er)
	for i := range m.ex {
		ex := &m.ex[i]
		_ = free(p.B, &ex.ids, &ex.w, &ex.xe, &ex.g, &ex.u, &ex.a, &ex.o)
	}
	m.dv.release(p)
	m.ex, m.probs, m.sel, m.weights = nil, nil, nil, nil
	m.x, m.live, m.onDev = T{}, false, false
}
