package models

// Qwen3-MoE: Qwen3 attention (per-head q/k norm) with a sparse mixture-of-experts block in the
// layers config.IsMoELayer names (decoder_sparse_step, mlp_only_layers) and the dense MLP of
// intermediate_size in the others. Experts are moe_intermediate_size wide; the router's top-k
// probabilities are renormalised when norm_topk_prob is set.
func init() {
	Register(&Family{
		ModelType:     "qwen3_moe",
		Architectures: []string{"Qwen3MoeForCausalLM"},
		Caps:          Caps{SlidingWindow: true, TiedEmbeddings: true},
		Tune: func(a *Arch) error {
			a.QKNorm = true
			a.MLPBias = false
			return validateMoE(a)
		},
		FFN: &moeFFN{block: "mlp", gate: "gate_proj", up: "up_proj", down: "down_proj"},
	})
}
