package nn

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Expert is one routed SwiGLU expert of a mixture-of-experts block: down(silu(gate(x)) * up(x)),
// without biases. Gate, Up [I,C]; Down [C,I].
type Expert struct {
	Gate, Up, Down Linear
}

// MoE is a sparse mixture-of-experts feed-forward block with a softmax top-k router, as in
// transformers' Qwen3-MoE, Mixtral and OLMoE blocks:
//
//	logits = x @ Router^T                      [N,E]
//	p      = softmax(logits) in fp32           [N,E]
//	S_n    = the TopK experts of token n by p[n] (+ Bias for selection only, when set)
//	w_n,e  = p[n,e], divided by sum_{S_n} p when NormTopK
//	out[n] = sum_{e in S_n} w_n,e * Expert_e(x[n])
//
// Letters: E experts, K = TopK, I the expert width, M_e the tokens routed to expert e.
//
// Routing runs on the host: the router logits [N,E] are downloaded, the top-k selection and
// weights computed in fp32, and each expert runs on the rows routed to it, gathered with the
// Embedding op (x acts as the table, the token indices as ids) and scatter-added back with
// EmbeddingBackward. The routing weight is applied on the host between the expert's output and
// the scatter (one download and upload of [M_e,C] per expert). A fused gather/grouped-GEMM/
// scatter op on the device would remove those transfers; the composition here is the reference.
//
// Cached for backward (keep): x (not owned), per expert its token ids, gathered input [M_e,C],
// gate, up and their SwiGLU product [M_e,I], and a host copy of its unweighted output [M_e,C];
// on the host, the probabilities [N,E], the selection and the weights [N,K].
//
// The auxiliary load-balancing loss couples every MoE layer of a model (transformers computes it
// over all layers' router logits concatenated), so it is computed by the model from each
// layer's Routing; before Backward the model sets AuxGrad, the gradient of the weighted aux loss
// with respect to this layer's probabilities, which Backward adds to the router gradient.
type MoE struct {
	Name    string
	Router  Linear // W [E,C], no bias
	Experts []Expert
	TopK    int
	// NormTopK renormalises the top-k probabilities of each token to sum to 1.
	NormTopK bool
	// Bias, when non-nil ([E]), is added to the probabilities to choose the top-k experts (the
	// aux-loss-free balancing bias); the weights still come from the probabilities alone.
	Bias []float32
	// AuxGrad, when non-nil ([E]), is c with d(aux objective)/d(p[n,e]) = c[e] for every token
	// n (see LoadBalancingLoss).
	AuxGrad []float64

	r   Routing
	c   []expertCache
	x   T
	dev bool // device caches live
}

// Routing is the host-side result of one forward's router, kept after the forward (also
// without keep) so that the model can compute load metrics and the aux loss.
type Routing struct {
	N, E, K int
	Probs   []float32 // [N,E] softmax of the router logits (fp32)
	Sel     []int32   // [N,K] chosen experts, by decreasing selection score
	Weights []float32 // [N,K] routing weights
}

// Load returns the number of (token, slot) assignments of each expert.
func (r *Routing) Load() []int {
	load := make([]int, r.E)
	for _, e := range r.Sel {
		load[e]++
	}
	return load
}

type expertCache struct {
	tokens []int32 // token rows routed to this expert, increasing
	slots  []int32 // slot k of each row in Sel/Weights
	ids    T       // [M] I32 tokens
	xe     T       // [M,C]
	g, u   T       // [M,I]
	a      T       // [M,I]
	y      []float32
}

var _ FFN = (*MoE)(nil)

// Routing returns the routing of the latest forward (zero before any).
func (m *MoE) Routing() *Routing { return &m.r }

// route computes probabilities, top-k selection and weights on the host from logits [N,E].
func (m *MoE) route(logits []float32, n int) error {
	e, k := len(m.Experts), m.TopK
	if k <= 0 || k > e {
		return fmt.Errorf("nn: %s: top-k %d must be in [1, %d experts]", m.Name, k, e)
	}
	if m.Bias != nil && len(m.Bias) != e {
		return fmt.Errorf("nn: %s: balancing bias has %d entries for %d experts", m.Name, len(m.Bias), e)
	}
	r := &m.r
	r.N, r.E, r.K = n, e, k
	r.Probs = resize(r.Probs, n*e)
	r.Sel = resizeI(r.Sel, n*k)
	r.Weights = resize(r.Weights, n*k)
	score := make([]float64, e)
	for t := 0; t < n; t++ {
		row := logits[t*e : (t+1)*e]
		pr := r.Probs[t*e : (t+1)*e]
		softmax32(pr, row)
		for j := range score {
			score[j] = float64(pr[j])
			if m.Bias != nil {
				score[j] += float64(m.Bias[j])
			}
			if math.IsNaN(score[j]) {
				return fmt.Errorf("nn: %s: router output of token %d is NaN", m.Name, t)
			}
		}
		sel := r.Sel[t*k : (t+1)*k]
		topK(sel, score)
		w := r.Weights[t*k : (t+1)*k]
		var sum float32
		for j, s := range sel {
			w[j] = pr[s]
			sum += pr[s]
		}
		if m.NormTopK {
			for j := range w {
				w[j] /= sum
			}
		}
	}
	return nil
}

// softmax32 writes softmax(z) into p, accumulating in fp64 and rounding once to fp32.
func softmax32(p, z []float32) {
	mx := math.Inf(-1)
	for _, v := range z {
		mx = math.Max(mx, float64(v))
	}
	s := 0.0
	for _, v := range z {
		s += math.Exp(float64(v) - mx)
	}
	for i, v := range z {
		p[i] = float32(math.Exp(float64(v)-mx) / s)
	}
}

// topK writes the indices of the len(sel) largest scores into sel, largest first; ties go to
// the lower index; scores must not be NaN. It keeps sel sorted while scanning, O(E*K) at worst.
func topK(sel []int32, score []float64) {
	k, n := len(sel), 0
	for i, s := range score {
		if n == k && !(s > score[sel[k-1]]) {
			continue
		}
		j := min(n, k-1)
		for j > 0 && s > score[sel[j-1]] {
			sel[j] = sel[j-1]
			j--
		}
		sel[j] = int32(i)
		n = min(n+1, k)
	}
}

func resize(v []float32, n int) []float32 {
	if cap(v) < n {
		return make([]float32, n)
	}
	return v[:n]
}

func resizeI(v []int32, n int) []int32 {
	if cap(v) < n {
		return make([]int32, n)
	}
	return v[:n]
}

// Forward implements FFN.
func (m *MoE) Forward(p *Pass, x T, keep bool) (out T, err error) {
	if m.dev {
		return T{}, fmt.Errorf("nn: %s: Forward called twice without Backward or Release", m.Name)
	}
	m.dev, m.x = true, x
	defer func() {
		if err != nil || !keep {
			m.Release(p)
		}
	}()
	n, c := x.Dim(0), x.Dim(1)
	logits, err := m.Router.Forward(p, x)
	if err != nil {
		return T{}, err
	}
	lv, err := backend.ToFloat32(p.B, logits)
	_ = free(p.B, &logits)
	if err != nil {
		return T{}, wrap(m.Name+" router", err)
	}
	if err = m.route(lv, n); err != nil {
		return T{}, err
	}
	m.c = make([]expertCache, len(m.Experts))
	k := m.TopK
	for t := 0; t < n; t++ {
		for j, e := range m.r.Sel[t*k : (t+1)*k] {
			ec := &m.c[e]
			ec.tokens = append(ec.tokens, int32(t))
			ec.slots = append(ec.slots, int32(j))
		}
	}
	if out, err = p.alloc(n, c); err != nil {
		return T{}, wrap(m.Name, err)
	}
	for e := range m.Experts {
		if err = m.expertForward(p, e, x, out, keep); err != nil {
			_ = free(p.B, &out)
			return T{}, err
		}
	}
	return out, nil
}

func (m *MoE) expertForward(p *Pass, e int, x, out T, keep bool) (err error) {
	ec := &m.c[e]
	mrows := len(ec.tokens)
	if mrows == 0 {
		return nil
	}
	ex := &m.Experts[e]
	name := fmt.Sprintf("%s expert %d", m.Name, e)
	var ye T
	defer func() {
		_ = free(p.B, &ye)
		if !keep {
			ec.release(p)
		}
	}()
	if ec.ids, err = backend.FromInt32(p.B, ec.tokens, mrows); err != nil {
		return wrap(name, err)
	}
	if ec.xe, err = p.alloc(mrows, x.Dim(1)); err != nil {
		return wrap(name, err)
	}
	if err = p.B.Embedding(ec.xe, x, ec.ids); err != nil {
		return wrap(name+" gather", err)
	}
	if ec.g, err = ex.Gate.Forward(p, ec.xe); err != nil {
		return err
	}
	if ec.u, err = ex.Up.Forward(p, ec.xe); err != nil {
		return err
	}
	if ec.a, err = p.alloc(ec.g.Shape()...); err != nil {
		return wrap(name, err)
	}
	if err = p.B.SwiGLU(ec.a, ec.g, ec.u); err != nil {
		return wrap(name, err)
	}
	if ye, err = ex.Down.Forward(p, ec.a); err != nil {
		return err
	}
	yv, err := backend.ToFloat32(p.B, ye)
	if err != nil {
		return wrap(name, err)
	}
	c := x.Dim(1)
	scaled := make([]float32, len(yv))
	for r, t := range ec.tokens {
		w := m.r.Weights[int(t)*m.TopK+int(ec.slots[r])]
		for i := r * c; i < (r+1)*c; i++ {
			scaled[i] = yv[i] * w
		}
	}
	if err = upload(p.B, ye, scaled); err != nil {
		return wrap(name, err)
	}
	if err = p.B.EmbeddingBackward(out, ye, ec.ids); err != nil {
		return wrap(name+" combine", err)
	}
	if keep {
		ec.y = yv
	}
	return nil
}

func upload(b backend.Backend, dst T, v []float32) error {
	raw, err := tensor.EncodeFloat32(dst.DType(), v)
	if err != nil {
		return err
	}
	return b.Upload(dst, raw)
}

// Backward implements FFN.
func (m *MoE) Backward(p *Pass, dy T) (dx T, err error) {
	if !m.dev || m.c == nil {
		return T{}, fmt.Errorf("nn: %s: Backward without a cached Forward", m.Name)
	}
	defer m.Release(p)
	r := &m.r
	n, c, k, e := r.N, m.x.Dim(1), r.K, r.E
	if dx, err = p.alloc(n, c); err != nil {
		return T{}, wrap(m.Name, err)
	}
	defer func() {
		if err != nil {
			_ = free(p.B, &dx)
		}
	}()
	dw := make([]float64, n*k) // d objective / d weight[n,k]
	for ei := range m.Experts {
		if err = m.expertBackward(p, ei, dy, dx, dw); err != nil {
			return T{}, err
		}
	}
	// Router: d objective / d p, then through the softmax.
	dz := make([]float32, n*e)
	dp := make([]float64, e)
	for t := 0; t < n; t++ {
		clear(dp)
		pr := r.Probs[t*e : (t+1)*e]
		sel := r.Sel[t*k : (t+1)*k]
		w := r.Weights[t*k : (t+1)*k]
		g := dw[t*k : (t+1)*k]
		if m.NormTopK {
			s, dot := 0.0, 0.0
			for j, x := range sel {
				s += float64(pr[x])
				dot += g[j] * float64(w[j])
			}
			for j, x := range sel {
				dp[x] += (g[j] - dot) / s
			}
		} else {
			for j, x := range sel {
				dp[x] += g[j]
			}
		}
		for j, c := range m.AuxGrad {
			dp[j] += c
		}
		dot := 0.0
		for j, v := range pr {
			dot += float64(v) * dp[j]
		}
		for j, v := range pr {
			dz[t*e+j] = float32(float64(v) * (dp[j] - dot))
		}
	}
	dlogits, err := p.alloc(n, e)
	if err != nil {
		return T{}, wrap(m.Name, err)
	}
	defer func() { _ = free(p.B, &dlogits) }()
	if err = upload(p.B, dlogits, dz); err != nil {
		return T{}, wrap(m.Name+" router", err)
	}
	if err = m.Router.Backward(p, dx, dlogits, m.x, true); err != nil {
		return T{}, err
	}
	return dx, nil
}

func (m *MoE) expertBackward(p *Pass, e int, dy, dx T, dw []float64) (err error) {
	ec := &m.c[e]
	mrows := len(ec.tokens)
	if mrows == 0 {
		return nil
	}
	ex := &m.Experts[e]
	name := fmt.Sprintf("%s expert %d", m.Name, e)
	c := dy.Dim(1)
	var dye, da, dxe T
	defer func() { _ = free(p.B, &dye, &da, &dxe) }()
	if dye, err = p.alloc(mrows, c); err != nil {
		return wrap(name, err)
	}
	if err = p.B.Embedding(dye, dy, ec.ids); err != nil {
		return wrap(name+" gather", err)
	}
	dv, err := backend.ToFloat32(p.B, dye)
	if err != nil {
		return wrap(name, err)
	}
	for r, t := range ec.tokens {
		slot := int(t)*m.TopK + int(ec.slots[r])
		w := m.r.Weights[slot]
		dot := 0.0
		for i := r * c; i < (r+1)*c; i++ {
			dot += float64(dv[i]) * float64(ec.y[i])
			dv[i] *= w
		}
		dw[slot] += dot
	}
	if err = upload(p.B, dye, dv); err != nil {
		return wrap(name, err)
	}
	if da, err = p.alloc(ec.a.Shape()...); err != nil {
		return wrap(name, err)
	}
	if err = ex.Down.Backward(p, da, dye, ec.a, false); err != nil {
		return err
	}
	if err = p.B.SwiGLUBackward(ec.g, ec.u, da, ec.g, ec.u); err != nil {
		return wrap(name, err)
	}
	if dxe, err = p.alloc(mrows, c); err != nil {
		return wrap(name, err)
	}
	if err = ex.Gate.Backward(p, dxe, ec.g, ec.xe, false); err != nil {
		return err
	}
	if err = ex.Up.Backward(p, dxe, ec.u, ec.xe, true); err != nil {
		return err
	}
	return wrap(name+" combine", p.B.EmbeddingBackward(dx, dxe, ec.ids))
}

func (ec *expertCache) release(p *Pass) {
	_ = free(p.B, &ec.ids, &ec.xe, &ec.g, &ec.u, &ec.a)
	ec.y = nil
}

// Release implements FFN. The host-side Routing is kept.
func (m *MoE) Release(p *Pass) {
	for i := range m.c {
		m.c[i].release(p)
	}
	m.c = nil
	m.x, m.dev = T{}, false
}

// LoadBalancingLoss is transformers' load_balancing_loss_func over the routings of every MoE
// layer of one forward, concatenated (no attention mask):
//
//	p      = softmax of the router logits of a row (Routing.Probs)
//	F_e    = (rows whose top-k of p contains e) / T      T = rows of all layers
//	P_e    = mean over the T rows of p[:,e]
//	aux    = E * sum_e F_e * P_e
//
// The top-k here is of p alone (a balancing Bias does not enter) and F is not differentiated.
// It returns aux and c with d(scale*aux)/d(p[n,e]) = c[e] for every row of every layer (the
// MoE.AuxGrad of each layer). Layers must agree on E and K.
func LoadBalancingLoss(rs []*Routing, scale float64) (aux float64, c []float64, err error) {
	if len(rs) == 0 {
		return 0, nil, nil
	}
	e, k := rs[0].E, rs[0].K
	count := make([]float64, e)
	psum := make([]float64, e)
	rows := 0
	r := make([]float64, e)
	sel := make([]int32, k)
	for li, rt := range rs {
		if rt.E != e || rt.K != k {
			return 0, nil, fmt.Errorf("nn: load-balancing loss: layer %d routes top-%d of %d experts, layer 0 top-%d of %d", li, rt.K, rt.E, k, e)
		}
		for t := 0; t < rt.N; t++ {
			pr := rt.Probs[t*e : (t+1)*e]
			for j, v := range pr {
				r[j] = float64(v)
			}
			topK(sel, r)
			for _, s := range sel {
				count[s]++
			}
			for j, v := range r {
				psum[j] += v
			}
			rows++
		}
	}
	if rows == 0 {
		return 0, make([]float64, e), nil
	}
	c = make([]float64, e)
	T := float64(rows)
	for j := range count {
		f := count[j] / T
		aux += f * psum[j] / T
		c[j] = scale * float64(e) * f / T
	}
	return aux * float64(e), c, nil
}
