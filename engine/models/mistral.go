package models

// Mistral: the Llama decoder without biases, with a sliding attention window on every layer
// when sliding_window is set.
func init() {
	Register(&Family{
		ModelType:     "mistral",
		Architectures: []string{"MistralForCausalLM"},
		Caps:          Caps{SlidingWindow: true, TiedEmbeddings: true},
		Tune: func(a *Arch) error {
			a.QKVBias, a.OBias, a.MLPBias = false, false, false
			return nil
		},
	})
}
