package models

import "fmt"

// Mixtral: Mistral attention (no biases, optional sliding window) with a sparse
// mixture-of-experts block in every layer: num_local_experts experts of intermediate_size
// (w1 = gate, w3 = up, w2 = down in the checkpoint, under block_sparse_moe), whose top-k router
// probabilities are always renormalised. router_jitter_noise (multiplicative noise on the
// router input during training) is not implemented, so a config that sets it is refused.
func init() {
	Register(&Family{
		ModelType:     "mixtral",
		Architectures: []string{"MixtralForCausalLM"},
		Caps:          Caps{SlidingWindow: true, TiedEmbeddings: true},
		Tune: func(a *Arch) error {
			a.QKVBias, a.OBias, a.MLPBias = false, false, false
			if c := a.Config; c != nil && c.RouterJitterNoise != 0 {
				return fmt.Errorf("router_jitter_noise %v is not supported (training would not match transformers); set it to 0 in config.json", c.RouterJitterNoise)
			}
			return validateMoE(a)
		},
		FFN: &moeFFN{block: "block_sparse_moe", gate: "w1", up: "w3", down: "w2"},
	})
}
