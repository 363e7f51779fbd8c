package models

// GLM-4.7-Flash (glm4_moe_lite): DeepSeek-V3's decoder — multi-head latent attention, the
// sigmoid router with its correction bias and expert groups, shared experts — with the dense
// and sparse layers of config.json's mlp_layer_types (structure: the glm4_moe_lite family of
// engine/hf/config). The Hub checkpoints hold a multi-token-prediction layer after the last
// decoder layer, which transformers does not build; Load reports its tensors unused.
//
// Layouts as DeepSeek-V3's: data parallelism, FSDP and expert parallelism; tensor parallelism
// refused (rule tp-latent).
func init() {
	Register(&Family{
		ModelType:  "glm4_moe_lite",
		Caps:       Caps{TiedEmbeddings: true, Reason: "(GLM-4.7-Flash attention has no sliding window)"},
		FFN:        &sigmoidMoE{moeFFN: moeFFN{block: "mlp", gate: "gate_proj", up: "up_proj", down: "down_proj", shared: "shared_experts"}},
		Placements: latentPlacements(),
	})
}
