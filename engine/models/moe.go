package models

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// moeFFN are the feed-forward hooks shared by the mixture-of-experts families: the sparse
// layers are those config.IsMoELayer names (the others keep the dense MLP of
// intermediate_size), and the weights use the Hub checkpoint layout, one tensor per expert:
//
//	model.layers.L.<block>.gate.weight                 [E, C]  router
//	model.layers.L.<block>.experts.X.<gate>.weight     [I, C]
//	model.layers.L.<block>.experts.X.<up>.weight       [I, C]
//	model.layers.L.<block>.experts.X.<down>.weight     [C, I]
//
// In the parameter table (and so in the arenas) a layer lists every expert's gate and up,
// expert by expert, then every expert's down, so that the held experts' weights are also the
// stacked tensors the grouped GEMMs take, without a copy: gate_up [E,2I,C] (expert X's gate
// rows, then its up rows) and down [E,C,I].
type moeFFN struct {
	block          string // "mlp" (qwen3_moe, olmoe) or "block_sparse_moe" (mixtral)
	gate, up, down string // per-expert projection names
	// shared is the module of the shared-expert SwiGLU MLP beside the routed experts
	// ("shared_experts", "shared_expert"; "" for none), sharedGate the [1,C] linear whose
	// sigmoid scales it (qwen2_moe's "shared_expert_gate"; "" for none); moe_shared.go.
	shared, sharedGate string
	// router is the router's module under the block ("" for "gate"; granitemoe's
	// "router.layer").
	router string
	// fused names the tensors under the block that hold every expert of a layer in the
	// family's checkpoints, when they are not one tensor per expert (granitemoe's
	// input_linear [E,2I,C] and output_linear [E,C,I]); the zero value for the Hub layout
	// above. The experts keep their per-expert names in the parameter table; Load splits the
	// fused tensors into them and Save writes them fused (moe_weights.go).
	fused fusedNames
	// inMemory are the names under the block that transformers 5 gives some of the family's
	// tensors in memory where its checkpoints (and Save) use others: a checkpoint written
	// under the in-memory names loads too (moe_weights.go). Each entry renames a prefix.
	inMemory []rename
	// memBlock is the block's module in transformers 5's memory when it differs from block
	// (phimoe: mlp for the checkpoints' block_sparse_moe): names under it load through
	// inMemory's renames, or as they are.
	memBlock string
	// sparseMixer: the router is the sparsemixer (nn.SparseMixer) with router_jitter_noise as
	// its threshold.
	sparseMixer bool
	// outBias names a [C] bias under the block added to its output (JetMoE's "bias"); "" for
	// none.
	outBias string
}

// rename is one name prefix under a MoE block: from (transformers' in-memory name) to (the
// checkpoint's).
type rename struct{ from, to string }

// fusedNames are a family's fused expert tensors under the MoE block: GateUp [E,2I,C] (each
// expert's gate rows, then its up rows) and Down [E,C,I].
type fusedNames struct {
	GateUp, Down string
	// ReadOnly: checkpoints may hold the experts fused (transformers 5's in-memory layout,
	// lfm2_moe), but the family's Hub layout is per expert, which Save writes.
	ReadOnly bool
}

func (f *moeFFN) prefix(i int) string { return layerName(i, f.block) }

// routerName is the router's module under the block.
func (f *moeFFN) routerName() string {
	if f.router == "" {
		return "gate"
	}
	return f.router
}

// experts returns the hooks themselves; families that extend moeFFN by embedding it (sigmoidMoE)
// are found through it.
func (f *moeFFN) experts() *moeFFN { return f }

// expertHooks returns the expert layout of family fam (moeFFN or a type embedding it), or nil
// for dense families.
func expertHooks(fam *Family) *moeFFN {
	if h, ok := fam.FFN.(interface{ experts() *moeFFN }); ok {
		return h.experts()
	}
	return nil
}

// Specs implements FFNHooks.
func (f *moeFFN) Specs(a *Arch, i int) []ParamSpec {
	c := a.Config
	if c == nil || !c.IsMoELayer(i) {
		return nil
	}
	e, in := a.Experts, a.ExpertIntermediate
	pre := f.prefix(i)
	s := []ParamSpec{matrix(pre+"."+f.routerName()+".weight", e, a.Hidden)}
	for x := a.HeldExperts.Lo; x < a.HeldExperts.Hi; x++ {
		ep := fmt.Sprintf("%s.experts.%d.", pre, x)
		s = append(s, matrix(ep+f.gate+".weight", in, a.Hidden), matrix(ep+f.up+".weight", in, a.Hidden))
	}
	for x := a.HeldExperts.Lo; x < a.HeldExperts.Hi; x++ {
		s = append(s, matrix(fmt.Sprintf("%s.experts.%d.%s.weight", pre, x, f.down), a.Hidden, in))
	}
	return append(s, f.extraSpecs(a, pre)...)
}

// Build implements FFNHooks.
func (f *moeFFN) Build(a *Arch, i int, param, grad func(string) tensor.Tensor) nn.FFN {
	c := a.Config
	if c == nil || !c.IsMoELayer(i) {
		return nil
	}
	pre := f.prefix(i)
	lin := func(name string) nn.Linear {
		return nn.Linear{Name: name, W: param(name + ".weight"), GW: grad(name + ".weight")}
	}
	held := a.HeldExperts
	m := &nn.MoE{Name: pre, Router: lin(pre + "." + f.routerName()), TopK: a.TopK,
		NormTopK: c.NormTopKProb, Experts: make([]nn.Expert, held.Len()),
		NumExperts: a.Experts, FirstExpert: held.Lo}
	for j := range m.Experts {
		x := held.Lo + j
		ep := fmt.Sprintf("%s.experts.%d.", pre, x)
		m.Experts[j] = nn.Expert{Gate: lin(ep + f.gate), Up: lin(ep + f.up), Down: lin(ep + f.down)}
	}
	m.GateUp, m.Down = stackExperts(m)
	if f.sparseMixer {
		m.SparseMixer = &nn.SparseMixer{Eps: c.RouterJitterNoise}
	}
	f.buildExtra(a, m, pre, lin)
	if f.outBias != "" {
		m.OutBias, m.GOutBias = param(pre+"."+f.outBias), grad(pre+"."+f.outBias)
	}
	return m
}

// stackExperts returns the block's expert weights (and gradients) as the stacked gate_up
// [E,2I,C] and down [E,C,I] tensors of the device path, views of the memory the experts'
// Linear views cover, or zero Linears when they are not laid out contiguously (a weight is
// missing, or the views are not consecutive in one buffer).
func stackExperts(m *nn.MoE) (gateUp, down nn.Linear) {
	if len(m.Experts) == 0 {
		return nn.Linear{}, nn.Linear{}
	}
	var gu, gug, dn, dng []tensor.Tensor
	for _, ex := range m.Experts {
		gu, gug = append(gu, ex.Gate.W, ex.Up.W), append(gug, ex.Gate.GW, ex.Up.GW)
		dn, dng = append(dn, ex.Down.W), append(dng, ex.Down.GW)
	}
	e := len(m.Experts)
	g0, d0 := m.Experts[0].Gate.W, m.Experts[0].Down.W
	if g0.Rank() != 2 || d0.Rank() != 2 {
		return nn.Linear{}, nn.Linear{}
	}
	in, c := g0.Dim(0), g0.Dim(1)
	guW, ok1 := stacked(gu, e, 2*in, c)
	dnW, ok2 := stacked(dn, e, c, in)
	if !ok1 || !ok2 {
		return nn.Linear{}, nn.Linear{}
	}
	gateUp = nn.Linear{Name: m.Name + ".experts.gate_up_proj", W: guW}
	down = nn.Linear{Name: m.Name + ".experts.down_proj", W: dnW}
	if g, ok := stacked(gug, e, 2*in, c); ok {
		gateUp.GW = g
	}
	if g, ok := stacked(dng, e, c, in); ok {
		down.GW = g
	}
	if gateUp.GW.IsNil() != down.GW.IsNil() {
		gateUp.GW, down.GW = tensor.Tensor{}, tensor.Tensor{}
	}
	return gateUp, down
}

// stacked returns one tensor of shape over the consecutive views ts, or false when they are
// not consecutive in one buffer with one dtype.
func stacked(ts []tensor.Tensor, shape ...int) (tensor.Tensor, bool) {
	if len(ts) == 0 || ts[0].IsNil() {
		return tensor.Tensor{}, false
	}
	off := ts[0].Offset()
	for _, t := range ts {
		if t.IsNil() || t.Buffer() != ts[0].Buffer() || t.DType() != ts[0].DType() || t.Offset() != off {
			return tensor.Tensor{}, false
		}
		off += t.Bytes()
	}
	out, err := tensor.New(ts[0].Buffer(), ts[0].Offset(), ts[0].DType(), shape...)
	if err != nil || out.Bytes() != off-ts[0].Offset() {
		return tensor.Tensor{}, false
	}
	return out, true
}

// expertOf returns the expert id of a routed expert's parameter name under this family's
// layout ("model.layers.L.<block>.experts.X.<proj>.weight").
func (f *moeFFN) expertOf(name string) (int, bool) {
	_, rest, ok := strings.Cut(name, "."+f.block+".experts.")
	if !ok || !strings.HasPrefix(name, "model.layers.") {
		return 0, false
	}
	num, _, ok := strings.Cut(rest, ".")
	if !ok {
		return 0, false
	}
	x, err := strconv.Atoi(num)
	return x, err == nil
}

// ExpertOf returns the global expert id of a routed expert's parameter (by its HF name) and
// true, or false for every other parameter (routers included) and for dense families.
func (m *Model) ExpertOf(name string) (int, bool) {
	f := expertHooks(m.Family)
	if f == nil {
		return 0, false
	}
	return f.expertOf(name)
}

// moeState is the model-level state of the mixture-of-experts layers.
type moeState struct {
	layers   []*nn.MoE // the sparse blocks, in layer order
	index    []int     // index[j] is the decoder layer of layers[j]
	auxScale float64   // weight of the aux loss in ForwardBackward's gradient
	auxLoss  float64   // aux loss of the latest forward
	rate     float64   // aux-loss-free balancing rate; 0 = off
	bias     [][]float32
	pending  [][]int // loads accumulated by training forwards since the last TakeExpertLoad or BalanceExperts
}

// IsMoE reports whether any layer routes tokens to experts.
func (m *Model) IsMoE() bool { return len(m.moe.layers) > 0 }

// AuxLoss is the load-balancing loss of the latest forward, unweighted, as transformers'
// load_balancing_loss_func computes it over every MoE layer (0 for dense models).
func (m *Model) AuxLoss() float64 { return m.moe.auxLoss }

// AuxLossScale is the weight of the aux loss in the gradient ForwardBackward accumulates. It
// starts at router_aux_loss_coef when config.json sets output_router_logits (as transformers
// adds the aux loss to the loss only then), else 0.
func (m *Model) AuxLossScale() float64 { return m.moe.auxScale }

// SetAuxLossScale sets the weight of the aux loss in ForwardBackward's gradient: with k
// micro-batches per optimizer step, router_aux_loss_coef/k gives the mean objective.
func (m *Model) SetAuxLossScale(s float64) { m.moe.auxScale = s }

// SetExpertBalancing turns on aux-loss-free load balancing (rate > 0) or off (rate 0): each
// MoE layer adds a per-expert bias to the router probabilities when choosing the top-k experts
// (the routing weights are unchanged), and BalanceExperts moves each bias by rate towards an
// even load. Turning it off drops the biases.
func (m *Model) SetExpertBalancing(rate float64) error {
	if rate < 0 || math.IsNaN(rate) || math.IsInf(rate, 0) {
		return fmt.Errorf("models: expert balancing rate must be a finite number >= 0, got %v", rate)
	}
	m.moe.rate = rate
	if rate == 0 {
		m.moe.bias = nil
	} else if m.moe.bias == nil {
		m.moe.bias = make([][]float32, len(m.moe.layers))
		for j, l := range m.moe.layers {
			m.moe.bias[j] = make([]float32, l.Routed())
		}
	}
	for j, l := range m.moe.layers {
		l.Bias = nil
		if m.moe.bias != nil {
			l.Bias = m.moe.bias[j]
		}
	}
	return nil
}

// ExpertBias returns a copy of the balancing bias of each MoE layer (nil when balancing is off).
func (m *Model) ExpertBias() [][]float32 {
	if m.moe.bias == nil {
		return nil
	}
	out := make([][]float32, len(m.moe.bias))
	for j, b := range m.moe.bias {
		out[j] = append([]float32(nil), b...)
	}
	return out
}

// ExpertBalancing returns the aux-loss-free balancing rate (0 when off).
func (m *Model) ExpertBalancing() float64 { return m.moe.rate }

// SetExpertBias replaces the balancing bias of every MoE layer (as ExpertBias returns it, e.g.
// from a checkpoint or another rank). Balancing must be on; the shape must match the model.
func (m *Model) SetExpertBias(bias [][]float32) error {
	if m.moe.rate == 0 {
		return errors.New("models: expert balancing is off; turn it on (SetExpertBalancing) before setting its bias")
	}
	if len(bias) != len(m.moe.layers) {
		return fmt.Errorf("models: expert bias for %d MoE layers, the model has %d", len(bias), len(m.moe.layers))
	}
	for j, l := range m.moe.layers {
		if len(bias[j]) != l.Routed() {
			return fmt.Errorf("models: expert bias of layer %d has %d entries for %d experts", m.moe.index[j], len(bias[j]), l.Routed())
		}
		for e, v := range bias[j] {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return fmt.Errorf("models: expert bias of layer %d expert %d is %v, want a finite number", m.moe.index[j], e, v)
			}
		}
	}
	for j := range m.moe.layers {
		copy(m.moe.bias[j], bias[j])
	}
	return nil
}

// TakeExpertLoad returns the tokens routed to each expert of each MoE layer (in layer order,
// as MoELayers) by the training forwards since the previous call, and starts counting again
// (nil for dense models). Each token counts once per expert among its top-k.
func (m *Model) TakeExpertLoad() [][]int {
	if len(m.moe.layers) == 0 {
		return nil
	}
	out := m.moe.pending
	if out == nil {
		out = make([][]int, len(m.moe.layers))
		for j, l := range m.moe.layers {
			out[j] = make([]int, l.Routed())
		}
	}
	m.moe.pending = nil
	return out
}

// BalanceExperts applies one aux-loss-free balancing update from the loads of the training
// forwards since the previous call (TakeExpertLoad). Call it after each optimizer step; it
// only resets the count when balancing is off.
func (m *Model) BalanceExperts() {
	_ = m.BalanceExpertsWith(m.TakeExpertLoad())
}

// BalanceExpertsWith applies one aux-loss-free balancing update from loads (tokens per expert
// of each MoE layer, as TakeExpertLoad returns them, e.g. summed over micro-batches and
// ranks): bias[e] += rate * sign(mean load - load[e]). It does nothing when balancing is off.
func (m *Model) BalanceExpertsWith(loads [][]int) error {
	if m.moe.rate == 0 {
		return nil
	}
	if len(loads) != len(m.moe.bias) {
		return fmt.Errorf("models: expert loads for %d MoE layers, the model has %d", len(loads), len(m.moe.bias))
	}
	for j, load := range loads {
		if len(load) != len(m.moe.bias[j]) {
			return fmt.Errorf("models: expert load of layer %d has %d entries for %d experts", m.moe.index[j], len(load), len(m.moe.bias[j]))
		}
	}
	for j, load := range loads {
		mean := 0.0
		for _, v := range load {
			mean += float64(v)
		}
		mean /= float64(len(load))
		for e, v := range load {
			switch d := mean - float64(v); {
			case d > 0:
				m.moe.bias[j][e] += float32(m.moe.rate)
			case d < 0:
				m.moe.bias[j][e] -= float32(m.moe.rate)
			}
		}
	}
	return nil
}

// ExpertLoadStats summarises per-layer token counts (tokens[j] for MoE layer j, in layer
// order as TakeExpertLoad returns them) into load metrics.
func (m *Model) ExpertLoadStats(tokens [][]int) []ExpertLoad {
	if len(tokens) == 0 {
		return nil
	}
	out := make([]ExpertLoad, 0, len(tokens))
	for j, t := range tokens {
		layer := j
		if j < len(m.moe.index) {
			layer = m.moe.index[j]
		}
		out = append(out, loadStats(layer, t))
	}
	return out
}

// ExpertLoad is the routing load of one MoE layer in the latest forward.
type ExpertLoad struct {
	// Layer is the decoder layer index.
	Layer int `json:"layer"`
	// Tokens[e] is the number of tokens routed to expert e (each token counts once per expert
	// among its top-k).
	Tokens []int `json:"tokens"`
	// Max and Min are the largest and smallest entries of Tokens.
	Max int `json:"max"`
	Min int `json:"min"`
	// CV is the coefficient of variation of Tokens (population std / mean; 0 when no tokens).
	CV float64 `json:"cv"`
	// Dead is the number of experts that received no token.
	Dead int `json:"dead"`
}

// ExpertLoad returns the per-layer expert load of the latest forward (nil for dense models);
// TakeExpertLoad and ExpertLoadStats give the load summed over several forwards.
func (m *Model) ExpertLoad() []ExpertLoad {
	out := make([]ExpertLoad, 0, len(m.moe.layers))
	for j, l := range m.moe.layers {
		out = append(out, loadStats(m.moe.index[j], l.Routing().Load()))
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func loadStats(layer int, tokens []int) ExpertLoad {
	s := ExpertLoad{Layer: layer, Tokens: tokens}
	if len(tokens) == 0 {
		return s
	}
	s.Min = tokens[0]
	sum := 0.0
	for _, v := range tokens {
		s.Max, s.Min = max(s.Max, v), min(s.Min, v)
		if v == 0 {
			s.Dead++
		}
		sum += float64(v)
	}
	mean := sum / float64(len(tokens))
	if mean > 0 {
		ss := 0.0
		for _, v := range tokens {
			ss += (float64(v) - mean) * (float64(v) - mean)
		}
		s.CV = math.Sqrt(ss/float64(len(tokens))) / mean
	}
	return s
}

// moeAfterForward runs after every block's forward: it computes the aux loss over all MoE
// layers and, for a training forward, hands each layer the aux gradient and records its load
// for balancing.
func (m *Model) moeAfterForward(train bool) error {
	if len(m.moe.layers) == 0 {
		return nil
	}
	if err := m.moeFetch(); err != nil {
		return err
	}
	rs := make([]*nn.Routing, len(m.moe.layers))
	for j, l := range m.moe.layers {
		rs[j] = l.Routing()
	}
	aux, c, err := nn.LoadBalancingLoss(rs, m.moe.auxScale)
	if err != nil {
		return fmt.Errorf("models: %s: %w", m.Arch.ModelType, err)
	}
	m.moe.auxLoss = aux
	for j, l := range m.moe.layers {
		l.AuxGrad = nil
		if train && m.moe.auxScale != 0 {
			l.AuxGrad = c
		}
		if train {
			if m.moe.pending == nil {
				m.moe.pending = make([][]int, len(m.moe.layers))
			}
			if m.moe.pending[j] == nil {
				m.moe.pending[j] = make([]int, l.Routed())
			}
			for e, v := range rs[j].Load() {
				m.moe.pending[j][e] += v
			}
		}
	}
	return nil
}

// moeFetch reads the routing statistics that device-path layers keep on the device, all
// layers' with one download (once per forward; nothing for host-path layers or statistics
// already read).
func (m *Model) moeFetch() error {
	rs := make([]*nn.Routing, len(m.moe.layers))
	for j, l := range m.moe.layers {
		rs[j] = l.Routing()
	}
	if err := nn.FetchRoutings(rs); err != nil {
		return fmt.Errorf("models: %s: %w", m.Arch.ModelType, err)
	}
	return nil
}

// clearAuxGrad drops the aux gradient of every MoE layer (a training pass without the aux loss).
func (m *Model) clearAuxGrad() {
	for _, l := range m.moe.layers {
		l.AuxGrad = nil
	}
}

// bindMoE collects the MoE blocks after (re)building the layers and restores their biases.
func (m *Model) bindMoE() {
	m.moe.layers, m.moe.index = m.moe.layers[:0], m.moe.index[:0]
	for i, b := range m.blocks {
		if l, ok := b.FFN.(*nn.MoE); ok {
			m.moe.layers = append(m.moe.layers, l)
			m.moe.index = append(m.moe.index, i)
		}
	}
	for j, l := range m.moe.layers {
		if m.moe.bias != nil {
			l.Bias = m.moe.bias[j]
		}
	}
}

// MoELayers returns the mixture-of-experts blocks in layer order (nil for dense models). A
// parallel plan sets their Runner to compute the experts where they live; the blocks are
// rebuilt (and the runners dropped) when the model's layers are rebuilt.
func (m *Model) MoELayers() []*nn.MoE {
	if len(m.moe.layers) == 0 {
		return nil
	}
	return append([]*nn.MoE(nil), m.moe.layers...)
}
