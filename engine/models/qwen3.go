package models

// Qwen3: the Llama decoder with an RMSNorm over each query and key head before RoPE (q_norm,
// k_norm) and sliding windows on the layers layer_types marks sliding_attention (structure:
// the qwen3 family of engine/hf/config).
//
// Tensor parallelism as Llama's; the per-head q/k norms are whole on every tensor rank, which
// applies them to its own heads, so their gradients are summed over the tensor group.
func init() {
	Register(&Family{
		ModelType: "qwen3",
		Caps:      Caps{SlidingWindow: true, TiedEmbeddings: true},
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
			{Module: "model.layers.*.mlp.gate_proj", Split: Column},
			{Module: "model.layers.*.mlp.up_proj", Split: Column},
			{Module: "model.layers.*.mlp.down_proj", Split: Row},
			{Module: "model.norm", Split: Replicated},
			{Module: "lm_head", Split: Replicated},
		},
	})
}
