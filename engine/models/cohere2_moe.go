package models

import (
	"slices"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Cohere2-MoE (cohere2_moe, Command-A Plus; structure: the cohere2_moe family of
// engine/hf/config): Cohere2's parallel layer (nn.Block.Parallel: input_layernorm, a LayerNorm
// without bias unless rms_norm_eps makes it an RMSNorm, feeds both the attention and the
// feed-forward block, and both add to the residual), rotary pairs (2i, 2i+1) on the layers
// config.UsesRoPE names (the sliding ones, and the dense ones under
// prefix_dense_sliding_window_pattern 1; the others attend unrotated), the logits multiplied by
// logit_scale. Dense layers hold a SwiGLU mlp.{gate,up,down}_proj; sparse ones a router
// mlp.gate.weight [E, C] whose top-k logits go through a softmax (renormalised by
// construction) or a sigmoid (renormalised under norm_topk_prob), experts
// mlp.experts.X.{gate,up,down}_proj as the Hub stores them (transformers 5 holds them fused,
// mlp.experts.gate_up_proj and down_proj, which Load reads too), and under num_shared_experts a
// shared mlp.shared_experts.* added to them, or averaged with them (cohereMoE). transformers
// computes no load-balancing loss for the family, and none is computed here.
//
// Layouts: data parallelism, FSDP, tensor parallelism (heads split; routers, dense MLPs and the
// shared expert whole) and expert parallelism. Expert-tensor parallelism is refused by
// engine/mesh for models with shared experts (rule etp), context parallelism of MoE models by
// rule support. Rope types other than default are refused.
func init() {
	Register(&Family{
		ModelType: "cohere2_moe",
		Caps: Caps{SlidingWindow: true, TiedEmbeddings: true, RopeTypes: []string{"default"},
			Reason: "(Cohere2-MoE's scaled rotary types are not implemented with its interleaved pairs)"},
		InterleavedRoPE: true,
		FFN: &cohereMoE{moeFFN{block: "mlp", gate: "gate_proj", up: "up_proj", down: "down_proj",
			shared: "shared_experts"}},
		// The decoder's table less post_attention_layernorm: the layer's one norm is
		// input_layernorm.
		Placements: slices.DeleteFunc(decoderPlacements(
			expertPlacements("mlp", "gate", "gate_proj", "up_proj", "down_proj"),
			denseMLPPlacements("mlp", "gate_proj", "up_proj", "down_proj", Replicated),
			sharedPlacements("shared_experts", "")),
			func(p Placement) bool { return p.Module == "model.layers.*.post_attention_layernorm" }),
	})
}

// cohereMoE are Cohere2-MoE's feed-forward hooks: moeFFN's router, experts and shared expert
// with the family's router (expert_selection_fn) and its combination of the shared output
// (shared_expert_combination_strategy).
type cohereMoE struct{ moeFFN }

// Build implements FFNHooks.
func (f *cohereMoE) Build(a *Arch, i int, param, grad func(string) tensor.Tensor) nn.FFN {
	ffn := f.moeFFN.Build(a, i, param, grad)
	m, ok := ffn.(*nn.MoE)
	if !ok {
		return ffn
	}
	c := a.Config
	if c.ExpertSelectionFn == "sigmoid" {
		m.Score, m.NormTopK = backend.RouterSigmoid, c.NormTopKProb
	} else {
		// transformers takes the softmax of the top-k logits: the renormalised top-k of the
		// softmax over every expert, whatever norm_topk_prob says.
		m.NormTopK = true
	}
	if m.Shared != nil && c.SharedExpertCombinationStrategy == "average" {
		// (routed + shared) / 2
		m.RoutedScaling, m.SharedScale = 0.5, 0.5
	}
	return m
}
