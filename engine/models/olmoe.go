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
		Placements: []Placement{
			{Module: "model.embed_tokens", Split: Replicated},
			{Module: "model.layers.*.input_layernorm", Split: Replicated},
			{Module: "model.layers.*.self_attn.q_proj", Split: Column},
			{Module: "model.layers.*.self_attn.k_proj", Split: Column},
			{Module: "model.layers.*.self_attn.v_proj", Split: Column},
			{Module: "model.layers.*.self_attn.o_proj", Split: Row},
			{Module: "model.layers.*.self_attn.q_norm", Split: Replicated},
			{Module: "model.layers.*.self_attn.k_norm", Split: Replicated},
			{Module: "model.layers.*.post_attention_layernorm", Split: Replicated},
			{Module: "model.layers.*.mlp.gate", Split: Replicated},
			{Module: "model.layers.*.mlp.experts.*.gate_proj", Split: Column, Expert: true},
			{Module: "model.layers.*.mlp.experts.*.up_proj", Split: Column, Expert: true},
			{Module: "model.layers.*.mlp.experts.*.down_proj", Split: Row, Expert: true},
			{Module: "model.norm", Split: Replicated},
			{Module: "lm_head", Split: Replicated},
		},
	})
}
