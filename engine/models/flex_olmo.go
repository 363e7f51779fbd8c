package models

// FlexOlmo (flex_olmo): OLMo 2's decoder — RMSNorms on the attention and feed-forward outputs,
// q and k RMS-normalised over the whole projections — with OLMoE's mixture of experts in every
// layer (structure: the flex_olmo family of engine/hf/config). transformers 5.17 holds the
// experts fused (mlp.experts.gate_up_proj, mlp.experts.down_proj); Load splits them into the
// per-expert names below.
//
// Layouts: data parallelism, FSDP and expert parallelism. The projection-wide q/k norms span
// every head, so engine/mesh refuses tensor parallelism (rule tp-qknorm), and with it
// expert-tensor parallelism; context parallelism of MoE layers is refused by rule support.
func init() {
	Register(&Family{
		ModelType: "flex_olmo",
		Caps:      Caps{TiedEmbeddings: true, Reason: "(FlexOlmo attention has no sliding window)"},
		FFN:       &moeFFN{block: "mlp", gate: "gate_proj", up: "up_proj", down: "down_proj"},
		Placements: []Placement{
			{Module: "model.embed_tokens", Split: Replicated},
			{Module: "model.layers.*.self_attn.q_proj", Split: Column},
			{Module: "model.layers.*.self_attn.k_proj", Split: Column},
			{Module: "model.layers.*.self_attn.v_proj", Split: Column},
			{Module: "model.layers.*.self_attn.o_proj", Split: Row},
			{Module: "model.layers.*.self_attn.q_norm", Split: Replicated},
			{Module: "model.layers.*.self_attn.k_norm", Split: Replicated},
			{Module: "model.layers.*.post_attention_layernorm", Split: Replicated},
			{Module: "model.layers.*.post_feedforward_layernorm", Split: Replicated},
			{Module: "model.layers.*.mlp.gate", Split: Replicated},
			{Module: "model.layers.*.mlp.experts.*.gate_proj", Split: Column, Expert: true},
			{Module: "model.layers.*.mlp.experts.*.up_proj", Split: Column, Expert: true},
			{Module: "model.layers.*.mlp.experts.*.down_proj", Split: Row, Expert: true},
			{Module: "model.norm", Split: Replicated},
			{Module: "lm_head", Split: Replicated},
		},
	})
}
