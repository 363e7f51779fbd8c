package models

// Mistral: the Llama decoder with sliding-window attention (structure: the mistral family of
// engine/hf/config). Tensor parallelism as Llama's.
func init() {
	Register(&Family{
		ModelType:  "mistral",
		Caps:       Caps{SlidingWindow: true, TiedEmbeddings: true},
		Placements: decoderPlacements(denseMLPPlacements("mlp", "gate_proj", "up_proj", "down_proj", Column)),
	})
}
