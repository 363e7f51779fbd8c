package models

// Qwen2 (and Qwen2.5): the Llama decoder with a bias on q/k/v (not on o_proj), and sliding
// windows on the layers that layer_types marks sliding_attention.
func init() {
	Register(&Family{
		ModelType:     "qwen2",
		Architectures: []string{"Qwen2ForCausalLM"},
		Caps:          Caps{SlidingWindow: true, TiedEmbeddings: true},
		Tune: func(a *Arch) error {
			a.QKVBias, a.OBias, a.MLPBias = true, false, false
			return nil
		},
	})
}
