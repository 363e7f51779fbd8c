package models

import (
	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// MiniMax-M2 (minimax_m2; structure: the minimax_m2 family of engine/hf/config): Mixtral's
// decoder with q and k RMS-normalised over the whole projections, and in every layer a mixture
// of experts whose router chooses by sigmoid plus a selection-only correction bias and weights
// by the renormalised sigmoids (minimaxMoE). Checkpoint names are the Hub's, as Mixtral's:
//
//	block_sparse_moe.gate.weight                       [E, C]  router
//	block_sparse_moe.e_score_correction_bias           [E]     selection bias (a buffer; it
//	                                                           gets no gradient)
//	block_sparse_moe.experts.X.{w1,w3,w2}.weight               gate, up, down
//
// transformers 5.17 holds them as mlp.gate, mlp.e_score_correction_bias and the fused
// mlp.experts.*, which Load reads too.
//
// Layouts: data parallelism, FSDP and expert parallelism. The projection-wide q/k norms span
// every head, so engine/mesh refuses tensor parallelism (rule tp-qknorm) and with it
// expert-tensor parallelism; context parallelism of MoE models is refused by rule support.
func init() {
	Register(&Family{
		ModelType: "minimax_m2",
		Caps:      Caps{TiedEmbeddings: true, Reason: "(MiniMax-M2 attention has no sliding window)"},
		FFN:       &minimaxMoE{moeFFN{block: "block_sparse_moe", gate: "w1", up: "w3", down: "w2"}},
		Placements: decoderPlacements(qkNormPlacements(Replicated),
			expertPlacements("block_sparse_moe", "gate", "w1", "w3", "w2"),
			[]Placement{{Module: "model.layers.*.block_sparse_moe", Split: Replicated}}),
	})
}

// minimaxMoE are MiniMax-M2's feed-forward hooks: moeFFN's router and experts with the
// router's sigmoid scores, renormalised, and the block's correction bias
// <block>.e_score_correction_bias [E] (nn.MoE.ScoreBias) for the choice only.
type minimaxMoE struct{ moeFFN }

// Specs implements FFNHooks.
func (f *minimaxMoE) Specs(a *Arch, i int) []ParamSpec {
	s := f.moeFFN.Specs(a, i)
	if s == nil {
		return nil
	}
	// transformers registers the buffer on the block after its router and experts.
	return append(s, bias(f.prefix(i)+"."+scoreBiasName, a.Experts))
}

// Build implements FFNHooks.
func (f *minimaxMoE) Build(a *Arch, i int, param, grad func(string) tensor.Tensor) nn.FFN {
	ffn := f.moeFFN.Build(a, i, param, grad)
	m, ok := ffn.(*nn.MoE)
	if !ok {
		return ffn
	}
	m.Score = backend.RouterSigmoid
	m.ScoreBias = param(f.prefix(i) + "." + scoreBiasName)
	return m
}
