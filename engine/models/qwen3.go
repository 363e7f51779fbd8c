package models

// Qwen3: the Llama decoder with an RMSNorm over each query and key head before RoPE (q_norm,
// k_norm) and sliding windows on the layers layer_types marks sliding_attention (structure:
// the qwen3 family of engine/hf/config).
//
// Tensor parallelism as Llama's; the per-head q/k norms are whole on every tensor rank, which
// applies them to its own heads, so their gradients are summed over the tensor group.
func init() {
	Register(&Family{
		ModelType: "qwen3",
		Caps:      Caps{SlidingWindow: true, TiedEmbeddings: true},
		Placements: decoderPlacements(qkNormPlacements(PerHead),
			denseMLPPlacements("mlp", "gate_proj", "up_proj", "down_proj", Column)),
	})
}
