package models

// Phi-3.5-MoE (structure: the phimoe family of engine/hf/config): Mixtral's layers with
// LayerNorms (weight and bias) in place of the RMSNorms, q/k/v/o biases (attention_bias), an
// lm_head bias (lm_head_bias) and the sparsemixer router (nn.SparseMixer, deterministic: the
// routing transformers computes outside training, and its exact gradient). Checkpoints store
// the block as block_sparse_moe with gate and experts.<e>.w1/w3/w2; transformers 5 holds it as
// mlp with router and fused experts, which load too. Longrope rotates with short_factor at
// every length, as transformers 5 does (backend.RoPEConfig.ShortFactorsOnly), its cos and sin
// scaled by the mscale.
//
// Tensor parallelism splits attention as Mixtral's (the biases with their projections); the
// norms, the router and the head stay whole. Experts are spread over the expert group, and
// under expert-tensor parallelism each expert's w1/w3 split by columns and its w2 by rows.
func init() {
	Register(&Family{
		ModelType: "phimoe",
		Caps:      Caps{SlidingWindow: true, TiedEmbeddings: true, RopeTypes: []string{"default", "longrope"}},
		FFN: &moeFFN{block: "block_sparse_moe", gate: "w1", up: "w3", down: "w2", memBlock: "mlp",
			inMemory: []rename{{"router.", "gate."}}, sparseMixer: true},
		Placements: decoderPlacements(expertPlacements("block_sparse_moe", "gate", "w1", "w3", "w2")),
	})
}
