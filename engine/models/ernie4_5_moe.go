package models

import (
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// ERNIE 4.5 MoE (ernie4_5_moe; structure: the ernie4_5_moe family of engine/hf/config): Llama's
// attention with GLM's interleaved rotary pairs, dense SwiGLU layers outside the
// moe_layer_start_index..moe_layer_end_index / moe_layer_interval pattern, and in the sparse
// layers a softmax router whose top-k is chosen with a selection-only correction bias and
// renormalised, beside a shared SwiGLU MLP (ernieMoE). Checkpoint names are transformers':
//
//	mlp.gate.weight                                   [E, C]  router
//	mlp.moe_statics.e_score_correction_bias           [1, E]  selection bias (a parameter
//	                                                          without gradient; transformers
//	                                                          holds it as mlp.gate.moe_statics.*
//	                                                          and writes it under this name)
//	mlp.experts.X.{gate,up,down}_proj (transformers 5.17 holds them fused, mlp.experts.*)
//	mlp.shared_experts.{gate,up,down}_proj
//
// Layouts: data parallelism, FSDP, tensor parallelism (attention split; routers, dense MLPs and
// shared experts whole, as qwen2_moe's) and expert parallelism. Expert-tensor parallelism is refused for
// models with shared experts (rule etp), context parallelism of MoE models by rule support.
func init() {
	Register(&Family{
		ModelType: "ernie4_5_moe",
		Caps:      Caps{TiedEmbeddings: true, Reason: "(ERNIE 4.5 attention has no sliding window)"},
		FFN: &ernieMoE{moeFFN{block: "mlp", gate: "gate_proj", up: "up_proj", down: "down_proj", shared: "shared_experts",
			inMemory: []rename{{"gate.moe_statics.", "moe_statics."}}}},
		InterleavedRoPE: true,
		Placements: decoderPlacements(
			expertPlacements("mlp", "gate", "gate_proj", "up_proj", "down_proj"),
			[]Placement{{Module: "model.layers.*.mlp.moe_statics", Split: Replicated}},
			denseMLPPlacements("mlp", "gate_proj", "up_proj", "down_proj", Replicated),
			sharedPlacements("shared_experts", "")),
	})
}

// ernieStatics is the checkpoint name of ERNIE 4.5's correction bias under the MoE block (the
// Hub's and what transformers writes).
const ernieStatics = ".moe_statics." + scoreBiasName

// ernieMoE are ERNIE 4.5's feed-forward hooks: moeFFN's softmax router, experts and shared
// experts, with the router's selection-only correction bias [1, E] (nn.MoE.ScoreBias), which
// gets no gradient: training leaves it as loaded, as transformers does.
type ernieMoE struct{ moeFFN }

// Specs implements FFNHooks.
func (f *ernieMoE) Specs(a *Arch, i int) []ParamSpec {
	s := f.moeFFN.Specs(a, i)
	if s == nil {
		return nil
	}
	b := ParamSpec{Name: f.prefix(i) + ernieStatics, Shape: []int{1, a.Experts}, Init: InitZeros, ZeroRow: -1}
	// After the router weight, as transformers lists the router's parameters.
	return append([]ParamSpec{s[0], b}, s[1:]...)
}

// Build implements FFNHooks.
func (f *ernieMoE) Build(a *Arch, i int, param, grad func(string) tensor.Tensor) nn.FFN {
	ffn := f.moeFFN.Build(a, i, param, grad)
	m, ok := ffn.(*nn.MoE)
	if !ok {
		return ffn
	}
	if b := param(f.prefix(i) + ernieStatics); !b.IsNil() {
		if v, err := b.Reshape(a.Experts); err == nil {
			m.ScoreBias = v
		}
	}
	return m
}
