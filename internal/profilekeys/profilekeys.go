// Package profilekeys names the parts of a step's time profile: the op classes that split
// compute time and the collective kinds that split communication time. They are the keys of
// halo.v1.StepProfile's compute_s and comm_s maps, which engine/profile fills and front ends
// (the TUI's breakdown bar, the halo API) read, so both sides take them from here and a
// client links no engine to know them.
//
// It is a leaf: constants and their display order, nothing else. A profile may carry a key
// that a client does not know yet (a newer session); clients show such keys after the known
// ones rather than dropping them.
package profilekeys

// Op classes: every backend op belongs to exactly one.
const (
	ClassMatmul     = "matmul"
	ClassExpertGEMM = "expert_gemm" // the grouped products of mixture-of-experts layers
	// The rest of a mixture-of-experts layer: the router's top-k and its backward, the sort of
	// the tokens by expert with its gather, the weighted combine.
	ClassRouter        = "router"
	ClassPermute       = "permute"
	ClassCombine       = "combine"
	ClassAttention     = "attention"
	ClassNorm          = "norm"
	ClassRoPE          = "rope"
	ClassEmbedding     = "embedding"
	ClassMLPActivation = "mlp_activation"
	ClassLoss          = "loss"
	ClassOptimizer     = "optimizer"
	ClassOther         = "other"
)

// Classes lists the op classes in display order.
var Classes = []string{ClassMatmul, ClassExpertGEMM, ClassRouter, ClassPermute, ClassCombine, ClassAttention, ClassNorm, ClassRoPE, ClassEmbedding, ClassMLPActivation, ClassLoss, ClassOptimizer, ClassOther}

// Collective kinds, for communication spans.
const (
	CommAllToAllDispatch = "all_to_all_dispatch"
	CommAllToAllCombine  = "all_to_all_combine"
	CommAllGather        = "all_gather"
	CommReduceScatter    = "reduce_scatter"
	CommAllReduce        = "all_reduce"
	CommBroadcast        = "broadcast"
	CommP2P              = "p2p"
	CommBarrier          = "barrier"
)

// CommKinds lists the collective kinds in display order.
var CommKinds = []string{CommAllToAllDispatch, CommAllToAllCombine, CommAllGather, CommReduceScatter, CommAllReduce, CommBroadcast, CommP2P, CommBarrier}
