package models

// Qwen3-MoE: Qwen3 attention (per-head q/k norm) with a sparse mixture-of-experts block in the
// layers the qwen3_moe family of engine/hf/config makes sparse (decoder_sparse_step,
// mlp_only_layers) and the dense MLP in the others. Experts are moe_intermediate_size wide;
// the router's top-k probabilities are renormalised when norm_topk_prob is set.
//
// Tensor parallelism splits attention as Qwen3's; the router and the dense MLPs stay whole.
// Experts are spread over the expert group, and under expert-tensor parallelism each expert's
// gate/up split by columns and its down by rows.
func init() {
	Register(&Family{
		ModelType: "qwen3_moe",
		Caps:      Caps{SlidingWindow: true, TiedEmbeddings: true},
		FFN:       &moeFFN{block: "mlp", gate: "gate_proj", up: "up_proj", down: "down_proj"},
		Placements: decoderPlacements(qkNormPlacements(PerHead),
			expertPlacements("mlp", "gate", "gate_proj", "up_proj", "down_proj"),
			// The dense feed-forward of the layers in mlp_only_layers is whole.
			denseMLPPlacements("mlp", "gate_proj", "up_proj", "down_proj", Replicated)),
	})
}
