package models

// Mixtral: Mistral attention with a sparse mixture-of-experts block in every layer (structure:
// the mixtral family of engine/hf/config): num_local_experts experts of intermediate_size,
// stored as w1 = gate, w3 = up, w2 = down under block_sparse_moe, whose top-k router
// probabilities are always renormalised. router_jitter_noise is refused by ArchFromConfig.
//
// Tensor parallelism splits attention as Mistral's; the router stays whole. Experts are spread
// over the expert group, and under expert-tensor parallelism each expert's w1/w3 split by
// columns and its w2 by rows.
func init() {
	Register(&Family{
		ModelType:  "mixtral",
		Caps:       Caps{SlidingWindow: true, TiedEmbeddings: true},
		FFN:        &moeFFN{block: "block_sparse_moe", gate: "w1", up: "w3", down: "w2"},
		Placements: decoderPlacements(expertPlacements("block_sparse_moe", "gate", "w1", "w3", "w2")),
	})
}
