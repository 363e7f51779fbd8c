package models

// Llama: the reference dense decoder (structure: the llama family of engine/hf/config, whose
// attention_bias and mlp_bias put biases on the attention and MLP projections; rope scaling
// from config.json).
//
// Tensor parallelism is Megatron's: q/k/v and gate/up split by output features (heads, MLP
// width), o_proj and down_proj by input features, everything else whole.
func init() {
	Register(&Family{
		ModelType: "llama",
		Caps:      Caps{TiedEmbeddings: true},
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
