package models

// Granite MoE (granitemoe; structure: the granitemoe family of engine/hf/config): Granite's
// decoder with its four multipliers, applied as for granite, and in every layer a mixture of
// experts whose router weights the top-k experts by the softmax over their logits (moeFFN with
// renormalised top-k). Its checkpoints hold each layer's experts in two tensors:
//
//	model.layers.L.block_sparse_moe.router.layer.weight   [E, C]    router
//	model.layers.L.block_sparse_moe.input_linear.weight   [E, 2I, C] each expert's gate rows,
//	                                                                  then its up rows
//	model.layers.L.block_sparse_moe.output_linear.weight  [E, C, I]
//
// which Load splits into the per-expert parameters block_sparse_moe.experts.X.{gate,up,down}_proj
// (views of the same bytes) and Save writes fused again.
//
// Layouts: data parallelism, FSDP, tensor parallelism (attention as Llama's, experts split by
// their width under expert-tensor parallelism) and expert parallelism, as Mixtral's. Context
// parallelism of MoE models is refused by engine/mesh (rule support). A model holding a subset
// of the experts cannot write a checkpoint of its own: the fused tensors span every expert.
func init() {
	Register(&Family{
		ModelType: "granitemoe",
		Caps:      Caps{TiedEmbeddings: true, Reason: "(Granite MoE attention has no sliding window)"},
		FFN: &moeFFN{block: "block_sparse_moe", router: "router.layer", gate: "gate_proj", up: "up_proj", down: "down_proj",
			fused: fusedNames{GateUp: "input_linear.weight", Down: "output_linear.weight"}},
		Placements: decoderPlacements(expertPlacements("block_sparse_moe", "router.layer", "gate_proj", "up_proj", "down_proj")),
	})
}
