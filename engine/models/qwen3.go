package models

// Qwen3: the Llama decoder with RMSNorm over each query and key head (q_norm, k_norm, applied
// before RoPE), an explicit head_dim, attention_bias on q/k/v/o when set, and sliding windows on
// the layers that layer_types marks sliding_attention.
func init() {
	Register(&Family{
		ModelType:     "qwen3",
		Architectures: []string{"Qwen3ForCausalLM"},
		Caps:          Caps{SlidingWindow: true, TiedEmbeddings: true},
		Tune: func(a *Arch) error {
			a.QKNorm = true
			a.MLPBias = false
			return nil
		},
	})
}
