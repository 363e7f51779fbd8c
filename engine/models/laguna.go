package models

// Laguna (laguna; structure: the laguna family of engine/hf/config): attention with per-head
// q/k norms before RoPE, rotary bases and widths per layer type (full layers rotate half of each
// head, sliding layers all of it), sliding windows on the sliding_attention layers and a
// per-head output gate softplus(g_proj(x)) (nn.Attention.HeadGate); dense SwiGLU layers where
// mlp_layer_types says dense, and in the sparse ones DeepSeek's sigmoid router with its
// selection-only correction bias (sigmoidMoE, no expert groups), renormalised and scaled by
// moe_routed_scaling_factor, beside an ungated shared expert. Checkpoint names are the Hub's,
// which transformers 5.17 writes: self_attn.{q,k,v,o}_proj, q_norm, k_norm, g_proj;
// mlp.gate.weight, mlp.experts.e_score_correction_bias (a parameter without gradient),
// mlp.experts.X.* (held fused by transformers, split on load), mlp.shared_expert.*.
// transformers holds the bias as mlp.gate.e_score_correction_bias and the shared expert as
// mlp.shared_experts.* in memory; checkpoints under those names load too.
//
// Layouts: data parallelism, FSDP, tensor parallelism (heads split with their norms and gate
// rows; routers, dense MLPs and the shared expert whole) and expert parallelism. Expert-tensor
// parallelism is refused for models with shared experts (rule etp), context parallelism of MoE
// models by rule support. Rope types other than default are refused.
func init() {
	Register(&Family{
		ModelType: "laguna",
		Caps: Caps{SlidingWindow: true, TiedEmbeddings: true, RopeTypes: []string{"default"},
			Reason: "(Laguna's rope scaling per layer type is not implemented)"},
		FFN: &sigmoidMoE{moeFFN: moeFFN{block: "mlp", gate: "gate_proj", up: "up_proj", down: "down_proj",
			shared:   "shared_expert",
			inMemory: []rename{{"gate." + scoreBiasName, "experts." + scoreBiasName}, {"shared_experts.", "shared_expert."}}},
			bias: "experts"},
		Placements: decoderPlacements(qkNormPlacements(PerHead),
			[]Placement{{Module: "model.layers.*.self_attn.g_proj", Split: Column},
				{Module: "model.layers.*.mlp.experts", Split: Replicated}}, // the correction bias
			expertPlacements("mlp", "gate", "gate_proj", "up_proj", "down_proj"),
			denseMLPPlacements("mlp", "gate_proj", "up_proj", "down_proj", Replicated),
			sharedPlacements("shared_expert", "")),
	})
}
