package models

// Qwen3-MoE: Qwen3 attention (per-head q/k norm) with a sparse mixture-of-experts block in the
// layers the qwen3_moe family of engine/hf/config makes sparse (decoder_sparse_step,
// mlp_only_layers) and the dense MLP in the others. Experts are moe_intermediate_size wide;
// the router's top-k probabilities are renormalised when norm_topk_prob is set.
//
// Tensor parallelism splits attention as Qwen3's; the router and the dense MLPs stay whole.
// Experts are spread over the expert group, and under expert-tensor parallelism each expert's
// gate/up split by columns and its down by rows.
func init() {
	Register(&Family{
		ModelType: "qwen3_moe",
		Caps:      Caps{SlidingWindow: true, TiedEmbeddings: true},
		FFN:       &moeFFN{block: "mlp", gate: "gate_proj", up: "up_proj", down: "down_proj"},
		Placements: []Placement{
			{Module: "model.embed_tokens", Split: Replicated},
			{Module: "model.layers.*.input_layernorm", Split: Replicated},
			{Module: "model.layers.*.self_attn.q_proj", Split: Column},
			{Module: "model.layers.*.self_attn.k_proj", Split: Column},
			{Module: "model.layers.*.self_attn.v_proj", Split: Column},
			{Module: "model.layers.*.self_attn.o_proj", Split: Row},
			{Module: "model.layers.*.self_attn.q_norm", Split: PerHead},
			{Module: "model.layers.*.self_attn.k_norm", Split: PerHead},
			{Module: "model.layers.*.post_attention_layernorm", Split: Replicated},
			{Module: "model.layers.*.mlp.gate", Split: Replicated},
			{Module: "model.layers.*.mlp.experts.*.gate_proj", Split: Column, Expert: true},
			{Module: "model.layers.*.mlp.experts.*.up_proj", Split: Column, Expert: true},
			{Module: "model.layers.*.mlp.experts.*.down_proj", Split: Row, Expert: true},
			{Module: "model.layers.*.mlp.gate_proj", Split: Replicated},
			{Module: "model.layers.*.mlp.up_proj", Split: Replicated},
			{Module: "model.layers.*.mlp.down_proj", Split: Replicated},
			{Module: "model.norm", Split: Replicated},
			{Module: "lm_head", Split: Replicated},
		},
	})
}
