package models

// Gemma 3 (gemma3_text; structure: the gemma3_text family of engine/hf/config): the Llama
// decoder with four RMSNorms per layer (the attention and feed-forward outputs are normalised
// again before their residual adds), every norm multiplying by 1 + w (weights starting at
// zero), per-head q/k norms, embeddings scaled by sqrt(hidden_size) in the parameter dtype,
// scores scaled by query_pre_attn_scalar^-0.5, a GeGLU MLP (gelu_pytorch_tanh), sliding and
// full layers with their own RoPE bases, and tanh-capped logits when final_logit_softcapping
// is set. attn_logit_softcapping and use_bidirectional_attention are refused by
// ArchFromConfig.
//
// Tensor parallelism as Qwen3's: projections split by heads and MLP width, the per-head q/k
// norms whole on every rank (gradients summed over the tensor group), the four layer norms
// whole. Context parallelism, FSDP and data parallelism need nothing of the family.
func init() {
	Register(&Family{
		ModelType: "gemma3_text",
		Caps:      Caps{SlidingWindow: true, TiedEmbeddings: true},
		Placements: decoderPlacements(qkNormPlacements(PerHead),
			denseMLPPlacements("mlp", "gate_proj", "up_proj", "down_proj", Column),
			[]Placement{
				{Module: "model.layers.*.pre_feedforward_layernorm", Split: Replicated},
				{Module: "model.layers.*.post_feedforward_layernorm", Split: Replicated},
			}),
		LayerNorms:      gemmaNorms,
		NormOffset:      1,
		ScaleEmbeddings: true,
	})
}
