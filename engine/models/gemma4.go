package models

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/nn"
)

// Gemma 4 (gemma4_text; structure: the gemma4_text family of engine/hf/config): Gemma 3's
// decoder — four RMSNorms per layer, embeddings scaled by sqrt(hidden_size) in the parameter
// dtype, per-head q/k norms, GeGLU, sliding and full layers with their own RoPE — with
//
//   - norms that multiply by w (weights start at one), not 1 + w;
//   - full-attention layers with heads of global_head_dim (up to 512) and, under
//     attention_k_eq_v, num_global_key_value_heads key/value heads and no v_proj: the values
//     are the k_proj output (nn.Attention.KEqV);
//   - a v_norm on every value head (an RMSNorm without weights) and unscaled scores
//     (scaling 1.0: the q/k norms bound them);
//   - proportional RoPE on the full layers (backend "proportional": the first
//     partial_rotary_factor of each head's pairs rotate at base^(-2i/head_dim));
//   - each layer's output multiplied by its layer_scalar buffer (nn.Block.OutScale).
//
// Checkpoint names are transformers': self_attn.{q_proj, q_norm, k_norm, k_proj, v_proj,
// o_proj}, mlp.{gate,up,down}_proj, the four layer norms and layer_scalar.
//
// The optional parts (gemma4_ext.go): per-layer input embeddings (hidden_size_per_layer_input,
// on by default in transformers), shared KV layers (num_kv_shared_layers, with
// use_double_wide_mlp) and the MoE block beside the MLP (enable_moe_block). ArchFromConfig
// refuses bidirectional attention of every token (use_bidirectional_attention "all"; "vision"
// concerns image tokens only and leaves text causal) and combinations of the optional parts
// that cannot be built, naming the key.
//
// Layouts: data parallelism, FSDP, tensor parallelism (q, k, v by heads of each layer's
// width, o by input features, q/k norms per head; the degree must divide the key/value heads
// of both layer kinds, rule tp-heads) and context parallelism; with any optional part, tensor
// and expert parallelism are refused (rule gemma4-parts).
func init() {
	Register(&Family{
		ModelType: "gemma4_text",
		Caps:      Caps{SlidingWindow: true, TiedEmbeddings: true},
		Placements: decoderPlacements(qkNormPlacements(PerHead),
			denseMLPPlacements("mlp", "gate_proj", "up_proj", "down_proj", Column),
			[]Placement{
				{Module: "model.layers.*.pre_feedforward_layernorm", Split: Replicated},
				{Module: "model.layers.*.post_feedforward_layernorm", Split: Replicated},
				{Module: "model.layers.*", Split: Replicated}, // layer_scalar
				// Per-layer inputs and the MoE block: whole on every tensor rank
				// (gemma4CheckLayout refuses the layouts that would split them).
				{Module: "model.embed_tokens_per_layer", Split: Replicated},
				{Module: "model.per_layer_model_projection", Split: Replicated},
				{Module: "model.per_layer_projection_norm", Split: Replicated},
				{Module: "model.layers.*.per_layer_input_gate", Split: Replicated},
				{Module: "model.layers.*.per_layer_projection", Split: Replicated},
				{Module: "model.layers.*.post_per_layer_input_norm", Split: Replicated},
				{Module: "model.layers.*.router", Split: Replicated},
				{Module: "model.layers.*.router.proj", Split: Replicated},
				{Module: "model.layers.*.experts", Split: Replicated},
				{Module: "model.layers.*.post_feedforward_layernorm_1", Split: Replicated},
				{Module: "model.layers.*.post_feedforward_layernorm_2", Split: Replicated},
				{Module: "model.layers.*.pre_feedforward_layernorm_2", Split: Replicated},
			}),
		LayerNorms:      gemmaNorms,
		ScaleEmbeddings: true,
		Mixer:           gemma4Attention{},
		FFN:             gemma4FFN{},
		LayerScalar:     true,
		LayerTail:       gemma4LayerTail,
		ModelTail:       gemma4ModelTail,
		Extend:          gemma4Extend,
	})
}

// gemma4Check refuses the parts of Gemma 4's decoder the model does not build.
func gemma4Check(c *config.Config) error {
	if c.ModelType != "gemma4_text" {
		return nil
	}
	// "vision" makes only image tokens attend both ways: text stays causal.
	if c.Bidirectional == "all" {
		return fmt.Errorf("models: gemma4_text: use_bidirectional_attention %q is not supported: attention is causal; set it to null (or \"vision\", which leaves text causal)", c.Bidirectional)
	}
	return gemma4CheckParts(c)
}

// gemma4Attention are Gemma 4's attention hooks: every layer at its own head width.
type gemma4Attention struct{}

// keqv reports whether layer i shares its key projection with the values.
func gemma4KEqV(a *Arch, i int) bool {
	return a.Global.KEqV && i < len(a.Global.Full) && a.Global.Full[i]
}

// Specs implements MixerHooks, in transformers' order (q_proj, q_norm, k_norm, k_proj, v_proj,
// o_proj).
func (gemma4Attention) Specs(a *Arch, i int) []ParamSpec {
	hd, kvh := a.LayerHeads(i)
	q, kv := a.Heads*hd, kvh*hd
	at := func(name string) string { return layerName(i, "self_attn."+name) }
	var s []ParamSpec
	lin := func(name string, out, in int, b bool) {
		s = append(s, matrix(at(name+".weight"), out, in))
		if b {
			s = append(s, bias(at(name+".bias"), out))
		}
	}
	lin("q_proj", q, a.Hidden, a.QKVBias)
	if gemma4PartsOf(a).sharedSource(a, i) >= 0 {
		// A shared KV layer projects only its queries.
		s = append(s, normWeight(at("q_norm.weight"), hd))
		lin("o_proj", a.Hidden, q, a.OBias)
		return s
	}
	s = append(s, normWeight(at("q_norm.weight"), hd), normWeight(at("k_norm.weight"), hd))
	lin("k_proj", kv, a.Hidden, a.QKVBias)
	if !gemma4KEqV(a, i) {
		lin("v_proj", kv, a.Hidden, a.QKVBias)
	}
	lin("o_proj", a.Hidden, q, a.OBias)
	return s
}

// Build implements MixerHooks.
func (gemma4Attention) Build(a *Arch, i int, b *binder) *nn.Attention {
	hd, kvh := a.LayerHeads(i)
	pre := layerName(i, "self_attn.")
	at := &nn.Attention{
		Name: pre[:len(pre)-1], Q: b.lin(pre + "q_proj"), K: b.lin(pre + "k_proj"), O: b.lin(pre + "o_proj"),
		NH: a.Heads, NKV: kvh, HD: hd, Window: a.Windows[i], Layer: i, Scale: 1, KEqV: gemma4KEqV(a, i),
	}
	qn := b.norm(pre + "q_norm")
	at.QNorm = &qn
	if gemma4PartsOf(a).sharedSource(a, i) >= 0 {
		// Keys and values come from an earlier layer (gemma4Extend sets KVIn).
		at.K, at.KEqV = nn.Linear{}, false
	} else {
		if !at.KEqV {
			at.V = b.lin(pre + "v_proj")
		}
		kn := b.norm(pre + "k_norm")
		at.KNorm = &kn
		at.VNorm = &nn.RMSNorm{Name: pre + "v_norm", W: b.ones(hd), Eps: a.NormEps}
	}
	if a.SlidingRope != nil && a.LocalRope[i] {
		at.LocalRope, at.RotaryDim = true, a.SlidingRope.RotaryDim()
	} else {
		at.RotaryDim = a.Rope.RotaryDim()
	}
	return at
}
