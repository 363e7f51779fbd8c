package models

// Mistral: the Llama decoder with sliding-window attention (structure: the mistral family of
// engine/hf/config). Tensor parallelism as Llama's.
func init() {
	Register(&Family{
		ModelType: "mistral",
		Caps:      Caps{SlidingWindow: true, TiedEmbeddings: true},
		Placements: []Placement{
			{Module: "model.embed_tokens", Split: Replicated},
			{Module: "model.layers.*.input_layernorm", Split: Replicated},
			{Module: "model.layers.*.self_attn.q_proj", Split: Column},
			{Module: "model.layers.*.self_attn.k_proj", Split: Column},
			{Module: "model.layers.*.self_attn.v_proj", Split: Column},
			{Module: "model.layers.*.self_attn.o_proj", Split: Row},
			{Module: "model.layers.*.post_attention_layernorm", Split: Replicated},
			{Module: "model.layers.*.mlp.gate_proj", Split: Column},
			{Module: "model.layers.*.mlp.up_proj", Split: Column},
			{Module: "model.layers.*.mlp.down_proj", Split: Row},
			{Module: "model.norm", Split: Replicated},
			{Module: "lm_head", Split: Replicated},
		},
	})
}
