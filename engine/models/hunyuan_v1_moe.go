package models

// HunYuan MoE (hunyuan_v1_moe, Hunyuan-A13B; structure: the hunyuan_v1_moe family of
// engine/hf/config): Llama's attention with an RMSNorm over each query and key head applied to
// the rotated queries and keys (self_attn.query_layernorm, key_layernorm), and in every layer a
// mixture of experts (moeFFN: softmax top-k, renormalised) whose router is mlp.gate.wg, beside a
// shared SwiGLU MLP (mlp.shared_mlp) of intermediate_size. transformers 5.17 holds the experts
// fused (mlp.experts.gate_up_proj, down_proj); Load splits them into per-expert names. The
// model has no load-balancing loss in transformers, and none here.
//
// Layouts: data parallelism, FSDP, tensor parallelism (heads split with their per-head norms;
// routers and the shared MLP whole) and expert parallelism. Expert-tensor parallelism is
// refused by engine/mesh for models with shared experts (rule etp), context parallelism of MoE
// models by rule support. Rope types other than default and linear are refused: HunYuan's
// dynamic rope with alpha (an NTK base) is not implemented.
func init() {
	Register(&Family{
		ModelType: "hunyuan_v1_moe",
		Caps: Caps{TiedEmbeddings: true, RopeTypes: []string{"default", "linear"},
			Reason: "(HunYuan attention has no sliding window; its NTK-alpha dynamic rope is not implemented)"},
		FFN: &moeFFN{block: "mlp", router: "gate.wg", gate: "gate_proj", up: "up_proj", down: "down_proj",
			shared: "shared_mlp"},
		QKNormAfterRoPE: true,
		QKNormNames:     [2]string{"query_layernorm", "key_layernorm"},
		Placements: decoderPlacements(
			[]Placement{
				{Module: "model.layers.*.self_attn.query_layernorm", Split: PerHead},
				{Module: "model.layers.*.self_attn.key_layernorm", Split: PerHead},
			},
			expertPlacements("mlp", "gate.wg", "gate_proj", "up_proj", "down_proj"),
			sharedPlacements("shared_mlp", "")),
	})
}
