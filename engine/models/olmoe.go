package models

// OLMoE: a Llama-style decoder whose queries and keys are RMS-normalised over the whole q and
// k projections, with a sparse mixture-of-experts block in every layer (structure: the olmoe
// family of engine/hf/config); the top-k probabilities are renormalised when norm_topk_prob is
// set. clip_qkv is refused by ArchFromConfig.
//
// The q/k norms span every head, so they cannot follow a split of the heads: they are whole,
// and engine/mesh refuses tensor parallelism for this family (rule tp-qknorm). Experts are
// spread over the expert group as in the other MoE families.
func init() {
	Register(&Family{
		ModelType: "olmoe",
		Caps:      Caps{TiedEmbeddings: true, Reason: "(OLMoE attention has no sliding window)"},
		FFN:       &moeFFN{block: "mlp", gate: "gate_proj", up: "up_proj", down: "down_proj"},
		Placements: decoderPlacements(qkNormPlacements(Replicated),
			expertPlacements("mlp", "gate", "gate_proj", "up_proj", "down_proj")),
	})
}
