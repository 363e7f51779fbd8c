package backend

import (
	"fmt"
	"math"
)

// Mixture-of-experts routing, permutation and combine: the argument types of the optional
// capabilities that route tokens to experts, sort them by expert and combine the experts'
// outputs on the device (members MoERoute ... GeGLUPackedBackward of Optional in fused.go).
// Together with GroupedGEMM (moe.go) they run a whole MoE block without reading anything on the
// host inside the layer:
//
//	logits = x · Router^T                       [N,E]   (a GEMM)
//	MoERoute:    probs, sel, weights            [N,E] [N,K] [N,K]
//	MoEPermute:  offsets, order, slot, Xs       [E+1] [S] [N,K] [S,C]
//	GroupedGEMM: GU = Xs · GateUp_e^T           [S,2I]
//	SwiGLUPacked: A = silu(GU[:, :I]) * GU[:, I:]  [S,I]   (GeGLUPacked: gelu_tanh, Gemma 4)
//	GroupedGEMM: Ys = A · Down_e^T              [S,C]
//	MoECombine:  out[n] = sum_k weights[n,k] * Ys[slot[n,k]]   [N,C]
//
// Letters: N tokens, C hidden size, E experts, K top-k, I expert width, S = N*K routed slots.
// Everything is deterministic: sums run in a fixed order, there are no floating-point atomics
// and no scatter-adds; the CPU backend is the reference of each op.

// RouterScore is how MoERoute turns a router logit into a probability.
type RouterScore int

const (
	// RouterSoftmax: probs[n] = softmax(logits[n]) over the E experts (Qwen3-MoE, Mixtral,
	// OLMoE).
	RouterSoftmax RouterScore = iota
	// RouterSigmoid: probs[n,e] = sigmoid(logits[n,e]) (the DeepSeek-V3 and GLM-4 MoE
	// families, usually with a correction bias and group-limited selection).
	RouterSigmoid
)

// String names the score function.
func (s RouterScore) String() string {
	switch s {
	case RouterSoftmax:
		return "softmax"
	case RouterSigmoid:
		return "sigmoid"
	}
	return "RouterScore(?)"
}

// MoERouting are the routing choices shared by MoERoute and MoERouteBackward.
type MoERouting struct {
	Score RouterScore
	// TopK is K, the experts chosen per token, in [1, E].
	TopK int
	// NormTopK divides the chosen probabilities of a token by their sum (plus 1e-20 for
	// RouterSigmoid, as DeepSeek-V3 does, so a token whose scores all underflow stays finite).
	NormTopK bool
	// RoutedScaling multiplies the weights after the normalisation; 0 means 1.
	RoutedScaling float32
	// NGroup and TopKGroup limit the selection to groups (DeepSeek-V3): the E experts form
	// NGroup groups of E/NGroup consecutive experts; a group's score is the sum of its two
	// largest biased scores (its one score when a group holds one expert); the TopKGroup best
	// groups (ties to the lower group) are kept, the experts of the others score 0 (as
	// transformers' masked_fill sets them: they are chosen only where kept experts' biased
	// scores fall below 0) and the top-k is taken over all. NGroup 0 or 1 means no group limit. NGroup must divide E, TopKGroup be in
	// [1, NGroup] and the kept groups hold at least K experts.
	NGroup, TopKGroup int
}

// Scaling is RoutedScaling with 0 read as 1.
func (r MoERouting) Scaling() float32 {
	if r.RoutedScaling == 0 {
		return 1
	}
	return r.RoutedScaling
}

// Grouped reports whether the selection is group-limited.
func (r MoERouting) Grouped() bool { return r.NGroup > 1 }

// Check validates the routing for E experts; the error names the bad field.
func (r MoERouting) Check(op string, e int) error {
	if r.Score != RouterSoftmax && r.Score != RouterSigmoid {
		return opErr(op, "unknown router score %d (use RouterSoftmax or RouterSigmoid)", int(r.Score))
	}
	if r.TopK < 1 || r.TopK > e {
		return opErr(op, "top-k %d must be in [1, %d experts]", r.TopK, e)
	}
	if r.NGroup < 0 {
		return opErr(op, "NGroup %d is negative", r.NGroup)
	}
	if r.Grouped() {
		if e%r.NGroup != 0 {
			return opErr(op, "NGroup %d does not divide the %d experts", r.NGroup, e)
		}
		if r.TopKGroup < 1 || r.TopKGroup > r.NGroup {
			return opErr(op, "TopKGroup %d must be in [1, NGroup %d]", r.TopKGroup, r.NGroup)
		}
		if r.TopKGroup*(e/r.NGroup) < r.TopK {
			return opErr(op, "the %d kept groups of %d experts hold fewer than top-k %d experts", r.TopKGroup, e/r.NGroup, r.TopK)
		}
	}
	return nil
}

// MoERouteArgs describe the router's selection, for every token n:
//
//	probs[n]     = softmax(logits[n]) or sigmoid(logits[n])          (fp32)
//	score[n,e]   = probs[n,e] + Bias[e]                              (Bias only chooses)
//	groups       = the TopKGroup best groups by score (when Grouped)
//	sel[n]       = the K experts of largest score (in the kept groups), largest first, ties
//	               to the lower expert index
//	weights[n,j] = probs[n,sel[n,j]], / sum_j probs[n,sel[n,j]] when NormTopK, * Scaling,
//	               * ExpertScale[sel[n,j]] when set
//	counts[e]   += the number of tokens that chose e
//
// A NaN probability is a bad router output: the CPU backend refuses it; a device backend ranks
// NaN below every number.
type MoERouteArgs struct {
	MoERouting
	Logits  T // [N,E] F32 or BF16
	Bias    T // [E] F32, optional: the selection-only correction bias
	Probs   T // [N,E] F32 =
	Sel     T // [N,K] I32 =
	Weights T // [N,K] F32 =
	Counts  T // [E] I32 +=, optional: the expert-load statistic, read once per step
	// ProbSum [E] F32 =, optional: sum over the N tokens of probs[:,e] in a fixed order (the
	// P term of the load-balancing loss).
	ProbSum T
	// ExpertScale [E] F32, optional: a per-expert factor of the weights, applied last (Gemma
	// 4's trainable per_expert_scale); it does not affect the selection.
	ExpertScale T
}

// MoERouteBackwardArgs describe the router's backward: with g[n,j] = d objective /
// d weights[n,j], s = Scaling and a[n,j] = ExpertScale[sel[n,j]] (1 without it),
//
//	dp[n,e]   = AuxGrad[e] + sum over j with sel[n,j] = e of
//	              s*a[n,j]*g[n,j]                   without NormTopK
//	              (s*a[n,j]*g[n,j] - sum_i g[n,i]*weights[n,i]) / D,  D = sum_j probs[n,sel[n,j]] (+1e-20 for sigmoid)
//	dlogits[n] = softmax: probs[n] * (dp[n] - dot(probs[n], dp[n]));
//	             sigmoid: probs[n] * (1 - probs[n]) * dp[n]                     (=)
//	dscale[e]  = sum over the slots (n,j) with sel[n,j] = e of g[n,j] * q[n,j], q[n,j] the
//	             weight before the expert scale: s*probs[n,sel[n,j]] (/ D with NormTopK)  (=)
//
// in fp32 or better, dscale summed in a fixed order; the selection is not differentiated (nor
// is the Bias).
type MoERouteBackwardArgs struct {
	MoERouting
	Probs    T // [N,E] F32, the forward's
	Sel      T // [N,K] I32, the forward's
	Weights  T // [N,K] F32, the forward's
	DWeights T // [N,K] F32
	// AuxGrad [E] F32, optional: a gradient added to every token's dp (the load-balancing
	// loss's d aux / d probs[n,e], the same for every token).
	AuxGrad T
	DLogits T // [N,E] F32 or BF16 =
	// ExpertScale [E] F32, optional: the forward's; Weights include it.
	ExpertScale T
	// DExpertScale [E] F32 =, optional (with ExpertScale): the gradient of ExpertScale.
	DExpertScale T
}

// MoEPermuteArgs describe the sort of the routed slots by expert. Slot i = n*K + j is token n's
// j-th choice; the slots are ordered by expert, then by i (a stable counting sort):
//
//	offsets[e]  = the number of slots choosing an expert below e      [E+1], offsets[E] = S
//	order[p]    = the token of the slot at position p                 [S]
//	slot[n,j]   = the position of slot n*K+j                          [N,K]
//	Xs[p]       = X[order[p]]                                         [S,C]   (all =)
//
// Every sel value must be in [0, E): the CPU backend refuses others; a device backend leaves
// their rows out of the order (undefined results, never an out-of-bounds access).
type MoEPermuteArgs struct {
	E       int
	Sel     T // [N,K] I32
	X       T // [N,C] F32 or BF16
	Offsets T // [E+1] I32 =
	Order   T // [S] I32 =
	Slot    T // [N,K] I32 =
	Xs      T // [S,C] =, X's dtype
}

// MoEPermuteBackwardArgs describe the gather's backward: dX[n] = sum_j dXs[slot[n,j]] in
// increasing j, fp32, rounded once ("+=" onto dX when Accumulate, still one rounding).
type MoEPermuteBackwardArgs struct {
	DXs        T // [S,C] F32 or BF16
	Slot       T // [N,K] I32
	DX         T // [N,C] F32 or BF16
	Accumulate bool
}

// MoECombineArgs describe the weighted combine: out[n] = sum_j weights[n,j] * Ys[slot[n,j]] in
// increasing j, fp32, rounded once ("+=" onto Out when Accumulate, still one rounding).
type MoECombineArgs struct {
	Ys         T // [S,C] F32 or BF16
	Slot       T // [N,K] I32
	Weights    T // [N,K] F32
	Out        T // [N,C] F32 or BF16
	Accumulate bool
}

// MoECombineBackwardArgs describe the combine's backward:
//
//	dYs[slot[n,j]]  = weights[n,j] * dOut[n]          [S,C]  =
//	dWeights[n,j]   = dot(dOut[n], Ys[slot[n,j]])     [N,K] F32 =  (fp32, fixed order)
//
// Every position of dYs is written when slot is a permutation of [0, S) (MoEPermute's).
type MoECombineBackwardArgs struct {
	DOut     T // [N,C] F32 or BF16
	Ys       T // [S,C] the forward's
	Slot     T // [N,K] I32
	Weights  T // [N,K] F32
	DYs      T // [S,C] =
	DWeights T // [N,K] F32 =
}

func opErr(op, format string, a ...any) error {
	return fmt.Errorf("backend: %s: "+format, append([]any{op}, a...)...)
}

// Softmax64 writes softmax(z) into p, accumulating in fp64 and rounding once to fp32: the
// router probabilities of the host composition (engine/nn) and of the CPU oracle, which must
// agree bit for bit.
func Softmax64(p, z []float32) {
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

// Sigmoid64 writes sigmoid(z) into p, computed in fp64 and rounded once to fp32: the sigmoid
// router's probabilities of the host composition (engine/nn) and of the CPU oracle.
func Sigmoid64(p, z []float32) {
	for i, v := range z {
		p[i] = float32(1 / (1 + math.Exp(-float64(v))))
	}
}

// RouteTopK writes the indices of the len(sel) largest scores into sel, largest first; ties go
// to the lower index; experts with keep[e] false (when keep is set) are skipped. Scores must not
// be NaN. It keeps sel sorted while scanning, O(E*K) at worst. The host composition (engine/nn)
// and the CPU oracle select with it.
func RouteTopK(sel []int32, score []float64, keep []bool) {
	k, n := len(sel), 0
	for i, s := range score {
		if keep != nil && !keep[i] {
			continue
		}
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

// KeepGroups marks in keep [E] the experts of the len(gsel) best of len(gscore) groups of
// consecutive experts, a group scored by the sum of its two largest scores (its one score when
// it holds one expert), ties to the lower group, and sets the score of every other expert to 0
// (transformers' masked_fill): MoERouting's group-limited selection, whose top-k is then taken
// over all the scores. gscore and gsel are scratch of NGroup and TopKGroup entries.
func KeepGroups(keep []bool, score []float64, gscore []float64, gsel []int32) {
	ngroup := len(gscore)
	per := len(score) / ngroup
	for g := range ngroup {
		a, b := math.Inf(-1), math.Inf(-1)
		for _, s := range score[g*per : (g+1)*per] {
			if s > a {
				a, b = s, a
			} else if s > b {
				b = s
			}
		}
		if per == 1 {
			b = 0
		}
		gscore[g] = a + b
	}
	RouteTopK(gsel, gscore, nil)
	clear(keep)
	for _, g := range gsel {
		for e := int(g) * per; e < int(g+1)*per; e++ {
			keep[e] = true
		}
	}
	for e, k := range keep {
		if !k {
			score[e] = 0
		}
	}
}
