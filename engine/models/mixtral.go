package models

// Mixtral: Mistral attention (no biases, optional sliding window) with a sparse
// mixture-of-experts block in every layer: num_local_experts experts of intermediate_size
// (w1 = gate, w3 = up, w2 = down in the checkpoint, under block_sparse_moe), whose top-k router
// probabilities are always renormalised.
func init() {
	Register(&Family{
		ModelType:     "mixtral",
		Architectures: []string{"MixtralForCausalLM"},
		Caps:          Caps{SlidingWindow: true, TiedEmbeddings: true},
		Tune: func(a *Arch) error {
			a.QKVBias, a.OBias, a.MLPBias = false, false, false
			return validateMoE(a)
		},
		FFN: &moeFFN{block: "block_sparse_moe", gate: "w1", up: "w3", down: "w2"},
	})
}
