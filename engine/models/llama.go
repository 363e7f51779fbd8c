package models

// Llama: the reference dense decoder (structure: the llama family of engine/hf/config, whose
// attention_bias and mlp_bias put biases on the attention and MLP projections; rope scaling
// from config.json).
//
// Tensor parallelism is Megatron's: q/k/v and gate/up split by output features (heads, MLP
// width), o_proj and down_proj by input features, everything else whole.
func init() {
	Register(&Family{
		ModelType:  "llama",
		Caps:       Caps{TiedEmbeddings: true},
		Placements: decoderPlacements(denseMLPPlacements("mlp", "gate_proj", "up_proj", "down_proj", Column)),
	})
}
