package models

import "github.com/halo-shell/halo-shell/engine/hf/config"

// variantPlacements is the tensor-parallel table of a dense decoder whose layer norms sit as
// norms says (engine/hf/config.LayerNorms) and whose q/k/v and gate/up may be fused: the
// embeddings, every layer norm, the final norm and the LM head whole; q, k, v by heads and
// o_proj by input features, as decoderPlacements; gate/up by MLP width and down_proj by input
// features. A fused qkv_proj or gate_up_proj holds its parts one after the other, which a cut
// of its rows into equal parts would mix, so it is whole; engine/mesh refuses tensor
// parallelism for such a model (rule tp-fused). own are the family's other entries (q/k
// norms).
func variantPlacements(norms config.LayerNorms, fusedQKV, fusedGateUp bool, own ...[]Placement) []Placement {
	ps := []Placement{{Module: "model.embed_tokens", Split: Replicated}}
	for _, n := range layerNormNames(norms) {
		ps = append(ps, Placement{Module: "model.layers.*." + n, Split: Replicated})
	}
	if fusedQKV {
		ps = append(ps, Placement{Module: "model.layers.*.self_attn.qkv_proj", Split: Replicated})
	} else {
		ps = append(ps, Placement{Module: "model.layers.*.self_attn.q_proj", Split: Column},
			Placement{Module: "model.layers.*.self_attn.k_proj", Split: Column},
			Placement{Module: "model.layers.*.self_attn.v_proj", Split: Column})
	}
	ps = append(ps, Placement{Module: "model.layers.*.self_attn.o_proj", Split: Row})
	if fusedGateUp {
		ps = append(ps, Placement{Module: "model.layers.*.mlp.gate_up_proj", Split: Replicated},
			Placement{Module: "model.layers.*.mlp.down_proj", Split: Row})
	} else {
		ps = append(ps, denseMLPPlacements("mlp", "gate_proj", "up_proj", "down_proj", Column)...)
	}
	ps = append(ps, Placement{Module: "model.norm", Split: Replicated}, Placement{Module: "lm_head", Split: Replicated})
	for _, o := range own {
		ps = append(ps, o...)
	}
	return ps
}

// OLMo 2: RMSNorms on the attention and MLP outputs instead of their inputs, and q and k
// RMS-normalised over the whole projection (structure: the olmo2 family of engine/hf/config).
// The projection-wide q/k norms span every head, so engine/mesh refuses tensor parallelism
// (rule tp-qknorm), as for OLMoE.
func init() {
	Register(&Family{
		ModelType: "olmo2",
		Caps:      Caps{TiedEmbeddings: true, Reason: "(OLMo 2 attention has no sliding window)"},
		Placements: variantPlacements(config.PostNorms, false, false,
			qkNormPlacements(Replicated)),
	})
}

// OLMo 3: OLMo 2 with sliding-window attention on the layers layer_types marks
// sliding_attention. Rope scaling is refused (Caps.RopeTypes).
func init() {
	Register(&Family{
		ModelType: "olmo3",
		Caps: Caps{SlidingWindow: true, TiedEmbeddings: true, RopeTypes: []string{"default"},
			Reason: "(transformers applies OLMo 3's rope scaling to its full-attention layers only, which is not implemented)"},
		Placements: variantPlacements(config.PostNorms, false, false,
			qkNormPlacements(Replicated)),
	})
}

// Phi-3: fused qkv_proj and gate_up_proj, run as row views of the fused weights (the parts
// share its memory and gradient); longrope from config.json; an optional sliding window on
// every layer. Tensor parallelism is refused (rule tp-fused); LoRA is refused (AttachLoRA).
func init() {
	Register(&Family{
		ModelType:  "phi3",
		Caps:       Caps{SlidingWindow: true, TiedEmbeddings: true},
		Placements: variantPlacements(config.PreNorms, true, true),
	})
}

// Granite: the Llama decoder with its four multipliers (embedding, residual, attention score
// scale, logits), applied by nn.Embedding, nn.Block, nn.Attention and nn.Head. Tensor
// parallelism as Llama's.
func init() {
	Register(&Family{
		ModelType:  "granite",
		Caps:       Caps{TiedEmbeddings: true, Reason: "(Granite attention has no sliding window)"},
		Placements: variantPlacements(config.PreNorms, false, false),
	})
}

// SmolLM3: the Llama decoder with NoPE layers (no_rope_layers) and sliding windows on the
// layers layer_types marks. Tensor parallelism as Llama's.
func init() {
	Register(&Family{
		ModelType:  "smollm3",
		Caps:       Caps{SlidingWindow: true, TiedEmbeddings: true},
		Placements: variantPlacements(config.PreNorms, false, false),
	})
}

// GLM-4: four norms per layer (config.SandwichNorms), q/k/v biases, a fused gate_up_proj and
// an interleaved partial rotary embedding. Tensor parallelism is refused (rule tp-fused, for
// gate_up_proj); LoRA is refused (AttachLoRA).
func init() {
	Register(&Family{
		ModelType:       "glm4",
		Caps:            Caps{TiedEmbeddings: true, Reason: "(GLM-4 attention has no sliding window)"},
		InterleavedRoPE: true,
		Placements:      variantPlacements(config.SandwichNorms, false, true),
	})
}
