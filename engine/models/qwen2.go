package models

// Qwen2 (and Qwen2.5): the Llama decoder with sliding windows on the layers layer_types marks
// sliding_attention (structure, q/k/v biases included: the qwen2 family of engine/hf/config).
// Tensor parallelism as Llama's; the q/k/v biases split with their projections.
func init() {
	Register(&Family{
		ModelType:  "qwen2",
		Caps:       Caps{SlidingWindow: true, TiedEmbeddings: true},
		Placements: decoderPlacements(denseMLPPlacements("mlp", "gate_proj", "up_proj", "down_proj", Column)),
	})
}
