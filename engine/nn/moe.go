package nn

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Expert is one routed SwiGLU expert of a mixture-of-experts block: down(silu(gate(x)) * up(x)),
// without biases. Gate, Up [I,C]; Down [C,I].
type Expert struct {
	Gate, Up, Down Linear
}

// MoE is a sparse mixture-of-experts feed-forward block with a top-k router, as in
// transformers' Qwen3-MoE, Mixtral and OLMoE blocks (softmax) and DeepSeek-V3's (sigmoid, with a
// correction bias, group-limited selection, scaled weights and shared experts):
//
//	logits = x @ Router^T                      [N,E]
//	p      = softmax(logits) or sigmoid(logits) in fp32      [N,E]
//	S_n    = the TopK experts of token n by p[n] (+ ScoreBias + Bias for selection only, when
//	         set), among the TopKGroup best of NGroup expert groups when NGroup > 1
//	w_n,e  = p[n,e], divided by sum_{S_n} p when NormTopK (+1e-20 for sigmoid), * RoutedScaling
//	out[n] = sum_{e in S_n} w_n,e * Expert_e(x[n])  (+ Shared(x[n]) when set)
//
// Letters: E experts, K = TopK, I the expert width, M_e the tokens routed to expert e.
//
// Two paths compute it. When the backend has the optional MoE ops and GroupedGEMM
// (backend.Optional) and the block has its experts' weights stacked (GateUp, Down), everything
// runs on the device with one grouped GEMM per projection (moe_device.go). Otherwise routing
// runs on the host: the router logits [N,E] are downloaded, the top-k selection and
// weights computed in fp32, and each expert runs on the rows routed to it, gathered with the
// Embedding op (x acts as the table, the token indices as ids) and scatter-added back with
// EmbeddingBackward. The routing weights of an expert's rows are uploaded ([M_e] F32) and
// applied on the device (ScaleRows) between the expert's output and the scatter; backward
// takes the weights' gradient with RowDot and reads all experts' back at once. This
// composition is the reference of the device path (and what expert-parallel runners use).
//
// Cached for backward (keep): x (not owned), per expert its token ids, gathered input [M_e,C],
// gate, up and their SwiGLU product [M_e,I], its routing weights [M_e] and unweighted output [M_e,C];
// on the host, the probabilities [N,E], the selection and the weights [N,K].
//
// The experts are computed here unless Runner is set: a parallel plan then receives the
// routing and the input rows and returns the combined expert output (and its backward), and the
// block keeps the router and its gradient. A Runner that is also a SortedRunner keeps the block
// on the device path: the block routes, sorts and combines on the device and the runner
// computes the experts over the sorted rows.
//
// The auxiliary load-balancing loss couples every MoE layer of a model (transformers computes it
// over all layers' router logits concatenated), so it is computed by the model from each
// layer's Routing; before Backward the model sets AuxGrad, the gradient of the weighted aux loss
// with respect to this layer's probabilities, which Backward adds to the router gradient.
type MoE struct {
	Name   string
	Router Linear // W [E,C], no bias
	// Experts are the experts this block holds: global experts [FirstExpert,
	// FirstExpert+len(Experts)) of NumExperts. A block that holds a subset (an expert-parallel
	// rank's model) routes over all NumExperts and needs a Runner to compute them.
	Experts []Expert
	// NumExperts is the number of routed experts E (the router's output width); 0 means
	// len(Experts).
	NumExperts int
	// FirstExpert is the global id of Experts[0].
	FirstExpert int
	TopK        int
	// NormTopK renormalises the top-k probabilities of each token to sum to 1.
	NormTopK bool
	// Bias, when non-nil ([E]), is added to the probabilities to choose the top-k experts (the
	// aux-loss-free balancing bias); the weights still come from the probabilities alone.
	Bias []float32
	// AuxGrad, when non-nil ([E]), is c with d(aux objective)/d(p[n,e]) = c[e] for every token
	// n (see LoadBalancingLoss).
	AuxGrad []float64
	// Score is the router's score function (softmax by default, or sigmoid).
	Score backend.RouterScore
	// NGroup and TopKGroup limit the selection to the TopKGroup best of NGroup groups of
	// consecutive experts (backend.MoERouting); NGroup 0 or 1 means no limit.
	NGroup, TopKGroup int
	// RoutedScaling multiplies the routing weights after the normalisation; 0 means 1.
	RoutedScaling float32
	// SparseMixer, when set, chooses the experts and their weights in place of the top-k of
	// the probabilities (Phi-3.5-MoE; moe_sparsemixer.go). TopK must be 2, NormTopK, Bias,
	// NGroup and RoutedScaling unset; the block runs the host path. Probs stay the softmax of
	// the logits, for the aux loss.
	SparseMixer *SparseMixer
	// ScoreBias, when set ([E], a float tensor on the block's backend), is a selection-only
	// bias of the checkpoint (DeepSeek-V3's e_score_correction_bias), added to the scores with
	// Bias; it has no gradient.
	ScoreBias T
	// Shared, when set, is a dense SwiGLU MLP on the same input whose output is added to the
	// routed experts' (DeepSeek-V3's shared experts).
	Shared *MLP
	// SharedGate, when set with Shared (W [1,C]), scales the shared output of each token by
	// sigmoid(x @ W^T) (Qwen2-MoE's shared_expert_gate; moe_shared_gate.go).
	SharedGate *Linear
	// SharedScale multiplies the shared output before it is added (0 means 1): with
	// RoutedScaling 0.5 too it makes the block the average of the routed and the shared
	// output (Cohere2-MoE's shared_expert_combination_strategy "average").
	SharedScale float32
	// OutBias, when set ([C]), is added to every row of the block's output (JetMoE's
	// mlp.bias); GOutBias is its gradient (+=).
	OutBias, GOutBias T

	// Runner, when set, computes the experts (an expert-parallel plan); nil computes them
	// here, on the rows of this block.
	Runner ExpertRunner

	// GateUp and Down are the experts' weights stacked for the device path, with their
	// gradients: GateUp.W [E,2I,C] holds expert e's gate rows then its up rows, Down.W
	// [E,C,I]; the same memory as the Experts' Linear views. Zero tensors: the block runs the
	// host composition.
	GateUp, Down Linear
	// Composed makes the block run the host composition even where the device path could run
	// (the reference, and a way to compare the two); HALO_MOE_PATH=composed does it for every
	// block.
	Composed bool

	r        Routing
	sg       sharedGateCache
	g        ExpertGroup
	d        moeDev // device-path cache
	onDev    bool   // the cached forward took the device path
	x        T
	dev      bool // a forward is cached
	biasDev  T    // Bias on the device (device path), uploaded when biasHost differs from Bias
	biasB    backend.Backend
	biasHost []float32
	smLogits []float32 // the router logits [N,E] of the cached forward (SparseMixer)
}

// Routing is the result of one forward's router, kept after the forward (also without keep)
// so that the model can compute load metrics and the aux loss. The host path fills Probs, Sel
// and Weights; the device path leaves them nil and keeps per-expert statistics on the device
// until Fetch reads them.
type Routing struct {
	N, E, K int
	Probs   []float32 // [N,E] softmax of the router logits (fp32); host path only
	Sel     []int32   // [N,K] chosen experts, by decreasing selection score; host path only
	Weights []float32 // [N,K] routing weights; host path only

	// Device path: offsets [E+1] I32 of the slots sorted by expert (the loads are their
	// differences), auxCounts [E] I32 of the top-k of the probabilities alone (only when a
	// balancing bias chose differently), psum [E] F32 the probabilities summed over the
	// tokens; on b until Fetch.
	b                        backend.Backend
	offsets, auxCounts, psum T
	load, auxLoad            []int
	probSum                  []float64
	fetched                  bool
}

// Fetch reads the device path's per-expert statistics to the host (one download each, after
// the whole forward) and frees them; it does nothing after a host-path forward or a previous
// Fetch. Load and LoadBalancingLoss need it after a device-path forward. FetchRoutings reads
// several layers' at once.
func (r *Routing) Fetch() error { return FetchRoutings([]*Routing{r}) }

// pending reports whether the routing's statistics are still on the device.
func (r *Routing) pending() bool { return r.b != nil }

// statParts are the device statistics of a routing in the order FetchRoutings stages them:
// offsets [E+1] I32, the probability sums [E] F32, and the unbiased counts [E] I32 when a
// balancing bias chose.
func (r *Routing) statParts() []T {
	ts := []T{r.offsets, r.psum}
	if !r.auxCounts.IsNil() {
		ts = append(ts, r.auxCounts)
	}
	return ts
}

// fill sets the host statistics from the staged words of statParts.
func (r *Routing) fill(words []uint32) {
	e := r.E
	r.load, r.auxLoad, r.probSum = make([]int, e), nil, make([]float64, e)
	off, ps := words[:e+1], words[e+1:2*e+1]
	for x := range e {
		r.load[x] = int(int32(off[x+1]) - int32(off[x]))
		r.probSum[x] = float64(math.Float32frombits(ps[x]))
	}
	if !r.auxCounts.IsNil() {
		r.auxLoad = make([]int, e)
		for x, v := range words[2*e+1 : 3*e+1] {
			r.auxLoad[x] = int(int32(v))
		}
	}
	r.fetched = true
}

// FetchRoutings reads the device-path statistics of the routings rs (the MoE layers of one
// forward) with one download per backend: each layer's are copied on the device into one
// staging buffer (a few small copies per layer), which is read at once, so a forward of L
// layers waits for the device once rather than 2L times. Routings of host-path forwards, or
// already read, are skipped. The device statistics are freed, also on an error.
func FetchRoutings(rs []*Routing) (err error) {
	var todo []*Routing
	for _, r := range rs {
		if r.pending() {
			todo = append(todo, r)
		}
	}
	defer func() {
		for _, r := range todo {
			r.drop()
		}
	}()
	for len(todo) > 0 {
		b := todo[0].b
		var mine, rest []*Routing
		words := 0
		for _, r := range todo {
			if r.b != b {
				rest = append(rest, r)
				continue
			}
			mine = append(mine, r)
			for _, t := range r.statParts() {
				words += t.Numel()
			}
		}
		if err = fetchOn(b, mine, words); err != nil {
			todo = append(mine, rest...)
			return fmt.Errorf("nn: routing statistics: %w", err)
		}
		for _, r := range mine {
			r.drop()
		}
		todo = rest
	}
	return nil
}

// fetchOn stages the statistics of rs (all on b, words 4-byte elements in all) and reads them.
func fetchOn(b backend.Backend, rs []*Routing, words int) error {
	stage, err := b.Empty(tensor.I32, words)
	if err != nil {
		return err
	}
	defer b.Free(stage)
	at := 0
	for _, r := range rs {
		for _, t := range r.statParts() {
			// A view of t's dtype over the staging bytes, so that Copy moves the bits.
			v, err := tensor.New(stage.Buffer(), stage.Offset()+int64(4*at), t.DType(), t.Numel())
			if err != nil {
				return err
			}
			if err := b.Copy(v, t); err != nil {
				return err
			}
			at += t.Numel()
		}
	}
	raw := make([]byte, 4*words)
	if err := b.Download(raw, stage); err != nil {
		return err
	}
	all := make([]uint32, words)
	for i := range all {
		all[i] = binary.LittleEndian.Uint32(raw[4*i:])
	}
	at = 0
	for _, r := range rs {
		n := 0
		for _, t := range r.statParts() {
			n += t.Numel()
		}
		r.fill(all[at : at+n])
		at += n
	}
	return nil
}

// drop frees the device statistics.
func (r *Routing) drop() {
	if r.b != nil {
		_ = free(r.b, &r.offsets, &r.auxCounts, &r.psum)
	}
	r.b = nil
}

// reset prepares the routing for a device-path forward.
func (r *Routing) reset() {
	r.drop()
	r.Probs, r.Sel, r.Weights = nil, nil, nil
	r.load, r.auxLoad, r.probSum, r.fetched = nil, nil, nil, false
}

// Load returns the number of (token, slot) assignments of each expert (after Fetch, for a
// device-path forward).
func (r *Routing) Load() []int {
	if r.fetched {
		return slices.Clone(r.load)
	}
	load := make([]int, r.E)
	for _, e := range r.Sel {
		load[e]++
	}
	return load
}

type expertCache struct {
	tokens []int32 // source rows of this expert's assignments
	slots  []int32 // assignment index of each row (into the weights)
	ids    T       // [M] I32 tokens
	xe     T       // [M,C]
	g, u   T       // [M,I]
	a      T       // [M,I]
	w      T       // [M] F32 routing weights of the rows (weighted groups)
	y      T       // [M,C] unweighted output (weighted groups, kept for the weight gradient)
	dw     T       // [M] F32 weight gradient, read back after every expert's backward
}

var _ FFN = (*MoE)(nil)

// Routing returns the routing of the latest forward (zero before any).
func (m *MoE) Routing() *Routing { return &m.r }

// Routed returns E, the number of experts the router chooses among (NumExperts, or
// len(Experts) when it is 0).
func (m *MoE) Routed() int {
	if m.NumExperts > 0 {
		return m.NumExperts
	}
	return len(m.Experts)
}

// holdsAll reports whether the block holds every routed expert.
func (m *MoE) holdsAll() bool { return m.FirstExpert == 0 && len(m.Experts) == m.Routed() }

// routing is the block's routing choices as the backend's MoE ops take them.
func (m *MoE) routing() backend.MoERouting {
	return backend.MoERouting{Score: m.Score, TopK: m.TopK, NormTopK: m.NormTopK, RoutedScaling: m.RoutedScaling,
		NGroup: m.NGroup, TopKGroup: m.TopKGroup}
}

// route computes probabilities, top-k selection and weights on the host from logits [N,E], as
// the backend's MoERoute does (the CPU oracle computes the same numbers).
func (m *MoE) route(p *Pass, logits []float32, n int) error {
	e, k := m.Routed(), m.TopK
	rt := m.routing()
	if err := rt.Check("route", e); err != nil {
		return fmt.Errorf("nn: %s: %w", m.Name, err)
	}
	if m.Bias != nil && len(m.Bias) != e {
		return fmt.Errorf("nn: %s: balancing bias has %d entries for %d experts", m.Name, len(m.Bias), e)
	}
	var sbias []float32
	if !m.ScoreBias.IsNil() {
		var err error
		if sbias, err = backend.ToFloat32(p.B, m.ScoreBias); err != nil {
			return wrap(m.Name+" score bias", err)
		}
		if len(sbias) != e {
			return fmt.Errorf("nn: %s: score correction bias has %d entries for %d experts", m.Name, len(sbias), e)
		}
	}
	if m.SparseMixer != nil {
		if err := m.checkSparseMixer(e, k); err != nil {
			return err
		}
		m.smLogits = append(m.smLogits[:0], logits[:n*e]...)
	}
	r := &m.r
	r.reset()
	r.N, r.E, r.K = n, e, k
	r.Probs = resize(r.Probs, n*e)
	r.Sel = resizeI(r.Sel, n*k)
	r.Weights = resize(r.Weights, n*k)
	score := make([]float64, e)
	var keep []bool
	var gscore []float64
	var gsel []int32
	if rt.Grouped() {
		keep, gscore, gsel = make([]bool, e), make([]float64, rt.NGroup), make([]int32, rt.TopKGroup)
	}
	scale := rt.Scaling()
	for t := 0; t < n; t++ {
		row := logits[t*e : (t+1)*e]
		pr := r.Probs[t*e : (t+1)*e]
		if m.Score == backend.RouterSigmoid {
			backend.Sigmoid64(pr, row)
		} else {
			backend.Softmax64(pr, row)
		}
		for j := range score {
			// Bias terms in the order the backend adds them: one combined fp32 bias.
			var b float32
			if sbias != nil {
				b = sbias[j]
			}
			if m.Bias != nil {
				b += m.Bias[j]
			}
			score[j] = float64(pr[j]) + float64(b)
			if math.IsNaN(score[j]) {
				return fmt.Errorf("nn: %s: router output of token %d is NaN", m.Name, t)
			}
		}
		if m.SparseMixer != nil {
			m.SparseMixer.route(r.Sel[t*k:(t+1)*k], r.Weights[t*k:(t+1)*k], row)
			continue
		}
		if keep != nil {
			backend.KeepGroups(keep, score, gscore, gsel)
		}
		sel := r.Sel[t*k : (t+1)*k]
		backend.RouteTopK(sel, score, nil)
		w := r.Weights[t*k : (t+1)*k]
		var sum float32
		for j, s := range sel {
			w[j] = pr[s]
			sum += pr[s]
		}
		if m.Score == backend.RouterSigmoid {
			sum += 1e-20
		}
		for j := range w {
			if m.NormTopK {
				w[j] /= sum
			}
			w[j] *= scale
		}
	}
	return nil
}

// topK writes the indices of the len(sel) largest scores into sel (backend.RouteTopK).
func topK(sel []int32, score []float64) { backend.RouteTopK(sel, score, nil) }

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

// ExpertRunner computes the experts of one MoE block in place of the local computation: an
// expert-parallel plan sends the rows to the ranks that own their experts and brings the
// results back. The block computes the routing and the router gradient itself; the runner sees
// the routing (MoE.Routing) and the input rows. Its methods are called from the goroutine that
// runs the block's Forward and Backward, in that order; Release may follow a Forward without
// Backward (inference, or an error).
type ExpertRunner interface {
	// Forward returns a new out [N,C] (allocated on p.B; the caller owns it) with
	// out[n] = sum_k Weights[n,k] * Expert_{Sel[n,k]}(x[n]) for x [N,C] and the block's
	// routing. With keep it caches what Backward needs.
	Forward(p *Pass, m *MoE, x T, keep bool) (T, error)
	// Backward takes dy [N,C], adds the experts' parameter gradients to their GW, and returns
	// a new dx [N,C] (the gradient through the experts only; the caller owns it) and dw [N*K],
	// d objective / d Weights[n,k]. It releases the runner's caches.
	Backward(p *Pass, m *MoE, dy T) (dx T, dw []float64, err error)
	// Release drops the caches of a Forward.
	Release(p *Pass)
}

// SortedRunner is an ExpertRunner that also computes the experts of the device path
// (moe_device.go): it receives the block's rows sorted by expert and returns the experts'
// outputs in the same order, so that routing, sort and combine stay on the device. An
// expert-parallel plan implements it with the all-to-all. Its methods are called from the
// goroutine that runs the block, ForwardSorted then BackwardSorted (or Release).
type SortedRunner interface {
	ExpertRunner
	// ForwardSorted returns a new ys [S,C] (the caller owns it) with ys[r] = Expert_e(xs[r]) for
	// the rows [offsets[e], offsets[e+1]) of xs [S,C] that chose expert e; offsets [E+1] and
	// counts [E] (the rows of each expert) are I32 on the device. With keep it caches what
	// BackwardSorted needs.
	ForwardSorted(p *Pass, m *MoE, xs, offsets, counts T, keep bool) (T, error)
	// BackwardSorted takes dys [S,C], adds the experts' parameter gradients to their GW, and
	// returns a new dxs [S,C]. It releases the runner's caches.
	BackwardSorted(p *Pass, m *MoE, dys T) (T, error)
}

// ExpertGroup computes a set of experts over rows grouped by expert, the compute shared by
// the local MoE block and expert-parallel runners. Assignment i reads row Src[i] of x, runs
// expert Expert[i] and adds W[i] times the result (1 when W is nil) to row Src[i] of the
// output:
//
//	out[Src[i]] += W[i] * Experts[Expert[i]](x[Src[i]])        x, out [R,C]
//
// Experts run in increasing index, each over its assignments in increasing order, so results
// are deterministic. Cached for backward (keep): per expert its rows, gathered input [M_e,C],
// gate, up and SwiGLU product [M_e,I], and (when W is set) its weights [M_e] and unweighted
// output [M_e,C] on the device.
//
// Expert ids are global: Experts[j] is expert First+j, and an assignment to an expert outside
// [First, First+len(Experts)) is an error naming it.
type ExpertGroup struct {
	Name    string
	Experts []Expert
	First   int

	w   []float32
	n   int // assignments
	c   []expertCache
	dev bool
}

// Forward computes the group (see ExpertGroup) and returns out [R,C], a new tensor.
func (g *ExpertGroup) Forward(p *Pass, x T, src, expert []int32, w []float32, keep bool) (out T, err error) {
	if g.dev {
		return T{}, fmt.Errorf("nn: %s: expert Forward called twice without Backward or Release", g.Name)
	}
	if len(expert) != len(src) || (w != nil && len(w) != len(src)) {
		return T{}, fmt.Errorf("nn: %s: %d source rows, %d experts and %d weights for the assignments", g.Name, len(src), len(expert), len(w))
	}
	g.dev, g.w, g.n = true, w, len(src)
	defer func() {
		if err != nil || !keep {
			g.Release(p)
		}
	}()
	g.c = make([]expertCache, len(g.Experts))
	rows := x.Dim(0)
	for i, ge := range expert {
		e := int(ge) - g.First
		if e < 0 || e >= len(g.Experts) {
			return T{}, fmt.Errorf("nn: %s: assignment %d names expert %d; this group holds experts [%d,%d)", g.Name, i, ge, g.First, g.First+len(g.Experts))
		}
		if src[i] < 0 || int(src[i]) >= rows {
			return T{}, fmt.Errorf("nn: %s: assignment %d reads row %d of %d", g.Name, i, src[i], rows)
		}
		ec := &g.c[e]
		ec.tokens = append(ec.tokens, src[i])
		ec.slots = append(ec.slots, int32(i))
	}
	if out, err = p.alloc(max(rows, 1), x.Dim(1)); err != nil {
		return T{}, wrap(g.Name, err)
	}
	for e := range g.Experts {
		if err = g.expertForward(p, e, x, out, keep); err != nil {
			_ = free(p.B, &out)
			return T{}, err
		}
	}
	return out, nil
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
	if out, err = m.forwardRouted(p, x, keep); err != nil {
		return out, err
	}
	if !m.OutBias.IsNil() {
		if err = addRowBias(p, out, m.OutBias); err != nil {
			_ = free(p.B, &out)
			return T{}, wrap(m.Name+" bias", err)
		}
	}
	if m.Shared == nil {
		return out, nil
	}
	ys, err := m.sharedForward(p, x, keep)
	if err == nil && m.sharedScaled() {
		err = wrap(m.Name+" shared experts", p.B.Scale(ys, m.SharedScale))
		if err != nil {
			_ = free(p.B, &ys)
		}
	}
	if err == nil {
		err = wrap(m.Name+" shared experts", p.B.Add(out, out, ys))
		_ = free(p.B, &ys)
	}
	if err != nil {
		_ = free(p.B, &out)
		return T{}, err
	}
	return out, nil
}

// forwardRouted computes the routed experts' output (Forward without the shared experts).
func (m *MoE) forwardRouted(p *Pass, x T, keep bool) (out T, err error) {
	if o, ok := m.deviceOps(p, x); ok {
		m.onDev = true
		return m.deviceForward(p, o, x, keep)
	}
	n := x.Dim(0)
	logits, err := m.Router.Forward(p, x)
	if err != nil {
		return T{}, err
	}
	lv, err := backend.ToFloat32(p.B, logits)
	_ = free(p.B, &logits)
	if err != nil {
		return T{}, wrap(m.Name+" router", err)
	}
	if err = m.route(p, lv, n); err != nil {
		return T{}, err
	}
	if m.Runner != nil {
		return m.Runner.Forward(p, m, x, keep)
	}
	if !m.holdsAll() {
		return T{}, fmt.Errorf("nn: %s: the block holds experts [%d,%d) of %d and has no expert runner to reach the others; build the model with every expert or run it under an expert-parallel plan",
			m.Name, m.FirstExpert, m.FirstExpert+len(m.Experts), m.Routed())
	}
	k := m.TopK
	src := make([]int32, n*k)
	for i := range src {
		src[i] = int32(i / k)
	}
	m.g = ExpertGroup{Name: m.Name, Experts: m.Experts}
	return m.g.Forward(p, x, src, m.r.Sel, m.r.Weights, keep)
}

func (g *ExpertGroup) expertForward(p *Pass, e int, x, out T, keep bool) (err error) {
	ec := &g.c[e]
	mrows := len(ec.tokens)
	if mrows == 0 {
		return nil
	}
	ex := &g.Experts[e]
	name := fmt.Sprintf("%s expert %d", g.Name, g.First+e)
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
	if g.w != nil {
		// The rows are weighted on the device; the unweighted output stays for the weight
		// gradient.
		we := make([]float32, mrows)
		for r, a := range ec.slots {
			we[r] = g.w[a]
		}
		if ec.w, err = backend.FromFloat32(p.B, we, tensor.F32, mrows); err != nil {
			return wrap(name, err)
		}
		if keep {
			if ec.y, err = p.alloc(ye.Shape()...); err != nil {
				return wrap(name, err)
			}
			if err = p.B.Copy(ec.y, ye); err != nil {
				return wrap(name, err)
			}
		}
		if err = p.B.ScaleRows(ye, ec.w); err != nil {
			return wrap(name+" weights", err)
		}
	}
	if err = p.B.EmbeddingBackward(out, ye, ec.ids); err != nil {
		return wrap(name+" combine", err)
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

// Backward takes dy [R,C], adds the experts' parameter gradients, and returns a new dx [R,C]
// and, when the forward had weights, dw [assignments] (d objective / d W[i]). It releases the
// caches.
func (g *ExpertGroup) Backward(p *Pass, dy T) (dx T, dw []float64, err error) {
	if !g.dev || g.c == nil {
		return T{}, nil, fmt.Errorf("nn: %s: expert Backward without a cached Forward", g.Name)
	}
	defer g.Release(p)
	if dx, err = p.alloc(dy.Shape()...); err != nil {
		return T{}, nil, wrap(g.Name, err)
	}
	if g.w != nil {
		dw = make([]float64, g.n)
	}
	for e := range g.Experts {
		if err = g.expertBackward(p, e, dy, dx); err != nil {
			_ = free(p.B, &dx)
			return T{}, nil, err
		}
	}
	if dw != nil {
		// The weight gradients are read back once every expert has been queued.
		for e := range g.c {
			ec := &g.c[e]
			if ec.dw.IsNil() {
				continue
			}
			v, err := backend.ToFloat32(p.B, ec.dw)
			if err != nil {
				_ = free(p.B, &dx)
				return T{}, nil, wrap(fmt.Sprintf("%s expert %d", g.Name, g.First+e), err)
			}
			for r, a := range ec.slots {
				dw[a] += float64(v[r])
			}
		}
	}
	return dx, dw, nil
}

// Backward implements FFN.
func (m *MoE) Backward(p *Pass, dy T) (dx T, err error) {
	if !m.dev {
		return T{}, fmt.Errorf("nn: %s: Backward without a cached Forward", m.Name)
	}
	defer m.Release(p)
	if !m.OutBias.IsNil() && !m.GOutBias.IsNil() {
		if err = rowBiasGrad(p, m.GOutBias, dy); err != nil {
			return T{}, wrap(m.Name+" bias gradient", err)
		}
	}
	if dx, err = m.backwardRouted(p, dy); err != nil || m.Shared == nil {
		return dx, err
	}
	dxs, err := m.sharedBackwardScaled(p, dy)
	if err == nil {
		err = wrap(m.Name+" shared experts", p.B.Add(dx, dx, dxs))
		_ = free(p.B, &dxs)
	}
	if err != nil {
		_ = free(p.B, &dx)
		return T{}, err
	}
	return dx, nil
}

// sharedScaled reports whether SharedScale changes the shared output.
func (m *MoE) sharedScaled() bool { return m.SharedScale != 0 && m.SharedScale != 1 }

// sharedBackwardScaled is sharedBackward for the output gradient dy of the whole block: the
// shared branch sees SharedScale * dy (a scaled copy; dy itself is left as it is).
func (m *MoE) sharedBackwardScaled(p *Pass, dy T) (T, error) {
	if !m.sharedScaled() {
		return m.sharedBackward(p, dy)
	}
	g, err := p.out(dy.Shape()...)
	if err != nil {
		return T{}, wrap(m.Name+" shared experts", err)
	}
	defer func() { _ = free(p.B, &g) }()
	if err = p.B.Copy(g, dy); err == nil {
		err = p.B.Scale(g, m.SharedScale)
	}
	if err != nil {
		return T{}, wrap(m.Name+" shared experts", err)
	}
	return m.sharedBackward(p, g)
}

// backwardRouted is Backward through the router and the routed experts.
func (m *MoE) backwardRouted(p *Pass, dy T) (dx T, err error) {
	// Every path writes the stacked experts' gradients (the composed one through the
	// Experts' views of them): a fresh one is overwritten by the device path's grouped
	// weight gradient and zeroed first for the others, which accumulate.
	if m.onDev {
		o, ok := m.deviceOps(p, m.x)
		if !ok {
			return T{}, fmt.Errorf("nn: %s: the forward ran on the device path, which the backward's backend lacks", m.Name)
		}
		if m.d.sorted == nil {
			m.d.experts.OverwriteGateUp, m.d.experts.OverwriteDown = p.Fresh.Take(m.GateUp.GW), p.Fresh.Take(m.Down.GW)
		} else if err := zeroFresh(p, m.Name, m.GateUp.GW, m.Down.GW); err != nil {
			// Expert parallelism's sorted runner: its owners accumulate.
			return T{}, err
		}
		return m.deviceBackward(p, o, dy)
	}
	if err := zeroFresh(p, m.Name, m.GateUp.GW, m.Down.GW); err != nil {
		return T{}, err
	}
	r := &m.r
	n, k, e := r.N, r.K, r.E
	var dw []float64 // d objective / d weight[n,k]
	if m.Runner != nil {
		dx, dw, err = m.Runner.Backward(p, m, dy)
	} else {
		dx, dw, err = m.g.Backward(p, dy)
	}
	if err != nil {
		return T{}, err
	}
	defer func() {
		if err != nil {
			_ = free(p.B, &dx)
		}
	}()
	if len(dw) != n*k {
		return T{}, fmt.Errorf("nn: %s: the expert runner returned %d weight gradients for %d tokens x %d slots", m.Name, len(dw), n, k)
	}
	// Router: d objective / d p (w = scale * p / D with D the sum of the chosen p when
	// NormTopK), then through the softmax or the sigmoid.
	dz := make([]float32, n*e)
	dp := make([]float64, e)
	scale := float64(m.routing().Scaling())
	sigmoid := m.Score == backend.RouterSigmoid
	for t := 0; t < n; t++ {
		clear(dp)
		pr := r.Probs[t*e : (t+1)*e]
		sel := r.Sel[t*k : (t+1)*k]
		w := r.Weights[t*k : (t+1)*k]
		g := dw[t*k : (t+1)*k]
		switch {
		case m.SparseMixer != nil:
			// Only the aux gradient goes through the probabilities; the weights' own gradient
			// is the sparsemixer's, added below.
		case m.NormTopK:
			s, dot := 0.0, 0.0
			for j, x := range sel {
				s += float64(pr[x])
				dot += g[j] * float64(w[j])
			}
			if sigmoid {
				s += 1e-20
			}
			for j, x := range sel {
				dp[x] += (scale*g[j] - dot) / s
			}
		default:
			for j, x := range sel {
				dp[x] += scale * g[j]
			}
		}
		for j, c := range m.AuxGrad {
			dp[j] += c
		}
		if sigmoid {
			for j, v := range pr {
				pv := float64(v)
				dz[t*e+j] = float32(pv * (1 - pv) * dp[j])
			}
			continue
		}
		dot := 0.0
		for j, v := range pr {
			dot += float64(v) * dp[j]
		}
		for j, v := range pr {
			dz[t*e+j] = float32(float64(v) * (dp[j] - dot))
		}
		if m.SparseMixer != nil {
			m.SparseMixer.grad(dz[t*e:(t+1)*e], m.smLogits[t*e:(t+1)*e], g)
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

func (g *ExpertGroup) expertBackward(p *Pass, e int, dy, dx T) (err error) {
	ec := &g.c[e]
	mrows := len(ec.tokens)
	if mrows == 0 {
		return nil
	}
	ex := &g.Experts[e]
	name := fmt.Sprintf("%s expert %d", g.Name, g.First+e)
	c := dy.Dim(1)
	var dye, da, dxe T
	defer func() { _ = free(p.B, &dye, &da, &dxe) }()
	if dye, err = p.alloc(mrows, c); err != nil {
		return wrap(name, err)
	}
	if err = p.B.Embedding(dye, dy, ec.ids); err != nil {
		return wrap(name+" gather", err)
	}
	if g.w != nil {
		// d objective / d w of each row is its output gradient dotted with the unweighted
		// output; the output gradient then carries the weight into the expert.
		if ec.y.IsNil() || ec.w.IsNil() {
			return fmt.Errorf("nn: %s: weighted expert Backward without the forward's cached output", name)
		}
		if ec.dw, err = p.allocF32(mrows); err != nil {
			return wrap(name, err)
		}
		if err = p.B.RowDot(ec.dw, dye, ec.y); err != nil {
			return wrap(name+" weight gradient", err)
		}
		if err = p.B.ScaleRows(dye, ec.w); err != nil {
			return wrap(name+" weights", err)
		}
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
	_ = free(p.B, &ec.ids, &ec.xe, &ec.g, &ec.u, &ec.a, &ec.w, &ec.y, &ec.dw)
}

// Release drops the caches of a Forward.
func (g *ExpertGroup) Release(p *Pass) {
	for i := range g.c {
		g.c[i].release(p)
	}
	g.c, g.w = nil, nil
	g.dev = false
}

// Release implements FFN. The host-side Routing is kept.
func (m *MoE) Release(p *Pass) {
	if m.Runner != nil {
		m.Runner.Release(p)
	}
	if m.Shared != nil {
		m.Shared.Release(p)
	}
	m.sg.release(p)
	m.g.Release(p)
	m.d.release(p)
	m.x, m.dev, m.onDev = T{}, false, false
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
		if rt.fetched {
			// A device-path forward: the counts of the top-k of p and the sums of p.
			load := rt.load
			if rt.auxLoad != nil {
				load = rt.auxLoad
			}
			for j := range e {
				count[j] += float64(load[j])
				psum[j] += rt.probSum[j]
			}
			rows += rt.N
			continue
		}
		if rt.b != nil {
			return 0, nil, fmt.Errorf("nn: load-balancing loss: layer %d's routing is still on the device; call Routing.Fetch first", li)
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

// onesColumn returns an [rows, 1] tensor of ones of the pass dtype (the caller frees it).
func onesColumn(p *Pass, rows int) (T, error) {
	ones, err := p.out(rows, 1)
	if err != nil {
		return T{}, err
	}
	if err := p.B.Fill(ones, 1); err != nil {
		_ = free(p.B, &ones)
		return T{}, err
	}
	return ones, nil
}

// addRowBias adds b [C] to every row of out [R,C] (a rank-one GEMM update against a column of
// ones).
func addRowBias(p *Pass, out, b T) error {
	ones, err := onesColumn(p, out.Dim(0))
	if err != nil {
		return err
	}
	defer func() { _ = free(p.B, &ones) }()
	br, err := b.Reshape(1, out.Dim(1))
	if err != nil {
		return err
	}
	return p.B.GEMM(backend.GEMMArgs{A: ones, B: br, C: out, Alpha: 1, Beta: 1})
}

// rowBiasGrad adds the column sums of dy [R,C] to gb [C] (the gradient of addRowBias's b).
func rowBiasGrad(p *Pass, gb, dy T) error {
	ones, err := onesColumn(p, dy.Dim(0))
	if err != nil {
		return err
	}
	defer func() { _ = free(p.B, &ones) }()
	g, err := gb.Reshape(1, dy.Dim(1))
	if err != nil {
		return err
	}
	return p.B.GEMM(backend.GEMMArgs{A: ones, B: dy, C: g, TransA: true, Alpha: 1, Beta: 1})
}
