package models

// Llama: the reference dense decoder. attention_bias puts a bias on q/k/v/o, mlp_bias on the
// MLP projections; rope scaling (linear, dynamic, llama3, yarn) comes from config.json.
func init() {
	Register(&Family{
		ModelType:     "llama",
		Architectures: []string{"LlamaForCausalLM"},
		Caps:          Caps{TiedEmbeddings: true},
	})
}
