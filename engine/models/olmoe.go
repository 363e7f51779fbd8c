package models

// OLMoE: a Llama-style decoder whose queries and keys are RMS-normalised over the whole q and
// k projections (q_norm [NH*HD], k_norm [NKV*HD], before RoPE), with a sparse
// mixture-of-experts block of num_experts experts of intermediate_size in every layer; the
// top-k probabilities are renormalised when norm_topk_prob is set.
// clip_qkv is refused by ArchFromConfig.
func init() {
	Register(&Family{
		ModelType:     "olmoe",
		Architectures: []string{"OlmoeForCausalLM"},
		Caps:          Caps{TiedEmbeddings: true, Reason: "(OLMoE attention has no sliding window)"},
		Tune: func(a *Arch) error {
			a.QKNorm, a.QKNormFull = true, true
			a.MLPBias = false
			return validateMoE(a)
		},
		FFN: &moeFFN{block: "mlp", gate: "gate_proj", up: "up_proj", down: "down_proj"},
	})
}
