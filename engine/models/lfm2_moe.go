package models

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// LFM2-MoE (lfm2_moe; structure: the lfm2_moe family of engine/hf/config): layers whose
// layer_types entry is "conv" run LFM2's gated short convolution (nn.ShortConv) in place of
// attention, the "full_attention" ones GQA attention with per-head q/k norms; every layer has
// operator_norm before its operator and ffn_norm before its feed-forward block, a SwiGLU MLP
// (w1 gate, w3 up, w2 down) in the first num_dense_layers layers and a mixture of experts
// after them, routed as transformers' Lfm2MoeSparseMoeBlock: sigmoid scores, the top-k chosen
// on scores plus the expert_bias buffer (use_expert_bias; it gets no gradient), their
// unbiased scores renormalised (norm_topk_prob) and scaled by routed_scaling_factor. The final
// norm is model.embedding_norm. Checkpoint names:
//
//	conv.in_proj, conv.conv (weight [C, 1, L]), conv.out_proj (biases with conv_bias)
//	self_attn.{q_proj, k_proj, v_proj, out_proj, q_layernorm, k_layernorm}
//	feed_forward.{w1, w3, w2}; feed_forward.gate, feed_forward.experts.X.{w1, w3, w2},
//	feed_forward.expert_bias
//
// The renormalisation divides by the sum plus 1e-20 (nn.MoE's sigmoid router), where
// transformers adds 1e-6: the weights differ by a relative 1e-6 at most.
//
// Layouts: data parallelism, FSDP and expert parallelism. Tensor parallelism is refused by
// engine/mesh (rule tp-conv: in_proj holds B, C and x one after the other, which a cut of its
// rows would mix) and context parallelism too (rule cp-conv: a conv layer reads the tokens
// before it, across the chunk boundaries).
func init() {
	Register(&Family{
		ModelType: "lfm2_moe",
		Caps:      Caps{TiedEmbeddings: true, Reason: "(LFM2-MoE attention has no sliding window)"},
		FFN: &lfm2FFN{moeFFN{block: "feed_forward", gate: "w1", up: "w3", down: "w2",
			// transformers 5's in-memory layout, which a checkpoint it wrote may hold.
			fused: fusedNames{GateUp: "experts.gate_up_proj", Down: "experts.down_proj", ReadOnly: true}}},
		Mixer:      lfm2Mixer{},
		LayerNorms: LayerNorms{Input: "operator_norm", PreFFN: "ffn_norm"},
		FinalNorm:  "model.embedding_norm",
		Placements: lfm2Placements(),
	})
}

// lfm2Placements is LFM2-MoE's tensor-parallel table (tensor parallelism itself is refused,
// rule tp-conv; the table still places every parameter for the expert-parallel layout).
func lfm2Placements() []Placement {
	ps := []Placement{
		{Module: "model.embed_tokens", Split: Replicated},
		{Module: "model.layers.*.operator_norm", Split: Replicated},
		{Module: "model.layers.*.ffn_norm", Split: Replicated},
		{Module: "model.layers.*.self_attn.q_proj", Split: Column},
		{Module: "model.layers.*.self_attn.k_proj", Split: Column},
		{Module: "model.layers.*.self_attn.v_proj", Split: Column},
		{Module: "model.layers.*.self_attn.out_proj", Split: Row},
		{Module: "model.layers.*.self_attn.q_layernorm", Split: PerHead},
		{Module: "model.layers.*.self_attn.k_layernorm", Split: PerHead},
		{Module: "model.layers.*.conv.in_proj", Split: Replicated},
		{Module: "model.layers.*.conv.conv", Split: Replicated},
		{Module: "model.layers.*.conv.out_proj", Split: Replicated},
		{Module: "model.layers.*.feed_forward", Split: Replicated}, // expert_bias
		{Module: "model.embedding_norm", Split: Replicated},
		{Module: "lm_head", Split: Replicated},
	}
	ps = append(ps, denseMLPPlacements("feed_forward", "w1", "w3", "w2", Column)...)
	return append(ps, expertPlacements("feed_forward", "gate", "w1", "w3", "w2")...)
}

// lfm2Check refuses an lfm2_moe config without layer_types (transformers builds no layer
// without it).
func lfm2Check(c *config.Config) error {
	if c.ModelType == "lfm2_moe" && len(c.LayerTypes) < c.NumHiddenLayers {
		return fmt.Errorf("models: lfm2_moe: layer_types must name each of the %d layers (\"conv\" or \"full_attention\"); transformers builds no layer without it", c.NumHiddenLayers)
	}
	return nil
}

// lfm2Mixer are LFM2's operator hooks: a short convolution or attention per layer.
type lfm2Mixer struct{}

// Specs implements MixerHooks, in transformers' order.
func (lfm2Mixer) Specs(a *Arch, i int) []ParamSpec {
	c := a.Hidden
	if a.IsConv(i) {
		at := func(name string) string { return layerName(i, "conv."+name) }
		s := []ParamSpec{matrix(at("in_proj.weight"), 3*c, c)}
		if a.Conv.Bias {
			s = append(s, bias(at("in_proj.bias"), 3*c))
		}
		// nn.Conv1d's depthwise filter [C, 1, L]: a weight (decayed, drawn normal).
		s = append(s, ParamSpec{Name: at("conv.weight"), Shape: []int{c, 1, a.Conv.Taps}, Decay: true, Init: InitNormal, ZeroRow: -1})
		if a.Conv.Bias {
			s = append(s, bias(at("conv.bias"), c))
		}
		s = append(s, matrix(at("out_proj.weight"), c, c))
		if a.Conv.Bias {
			s = append(s, bias(at("out_proj.bias"), c))
		}
		return s
	}
	q, kv := a.Heads*a.HeadDim, a.KVHeads*a.HeadDim
	at := func(name string) string { return layerName(i, "self_attn."+name) }
	return []ParamSpec{
		matrix(at("q_proj.weight"), q, c), matrix(at("k_proj.weight"), kv, c), matrix(at("v_proj.weight"), kv, c),
		matrix(at("out_proj.weight"), c, q),
		normWeight(at("q_layernorm.weight"), a.HeadDim), normWeight(at("k_layernorm.weight"), a.HeadDim),
	}
}

// Build implements MixerHooks.
func (lfm2Mixer) Build(a *Arch, i int, b *binder) *nn.Attention {
	if a.IsConv(i) {
		pre := layerName(i, "conv.")
		return &nn.Attention{Name: pre + "conv", Layer: i, Conv: &nn.ShortConv{
			Name: pre[:len(pre)-1], InProj: b.lin(pre + "in_proj"), OutProj: b.lin(pre + "out_proj"),
			W: b.param(pre + "conv.weight"), Bias: b.param(pre + "conv.bias"),
			GW: b.grad(pre + "conv.weight"), GBias: b.grad(pre + "conv.bias"), C: a.Hidden, L: a.Conv.Taps, Layer: i,
		}}
	}
	pre := layerName(i, "self_attn.")
	qn, kn := b.norm(pre+"q_layernorm"), b.norm(pre+"k_layernorm")
	return &nn.Attention{
		Name: pre[:len(pre)-1], Q: b.lin(pre + "q_proj"), K: b.lin(pre + "k_proj"), V: b.lin(pre + "v_proj"),
		O: b.lin(pre + "out_proj"), QNorm: &qn, KNorm: &kn,
		NH: a.Heads, NKV: a.KVHeads, HD: a.HeadDim, RotaryDim: a.Rope.RotaryDim(), Window: a.Windows[i], Layer: i,
	}
}

// expertBiasName is LFM2-MoE's selection-only router bias, under model.layers.<i>.feed_forward.
const expertBiasName = "expert_bias"

// lfm2FFN are LFM2-MoE's feed-forward hooks: its dense SwiGLU MLP under feed_forward (w1, w3,
// w2) in the first num_dense_layers layers, moeFFN's router and experts after them with the
// sigmoid router and the expert_bias buffer.
type lfm2FFN struct{ moeFFN }

// Specs implements FFNHooks.
func (f *lfm2FFN) Specs(a *Arch, i int) []ParamSpec {
	pre := f.prefix(i)
	if a.Config == nil || !a.Config.IsMoELayer(i) {
		return []ParamSpec{matrix(pre+".w1.weight", a.Intermediate, a.Hidden), matrix(pre+".w3.weight", a.Intermediate, a.Hidden),
			matrix(pre+".w2.weight", a.Hidden, a.Intermediate)}
	}
	s := f.moeFFN.Specs(a, i)
	if a.RouterBias {
		// A float32 buffer of zeros in transformers; no gradient reaches it.
		s = append(s, bias(pre+"."+expertBiasName, a.Experts))
	}
	return s
}

// Build implements FFNHooks.
func (f *lfm2FFN) Build(a *Arch, i int, param, grad func(string) tensor.Tensor) nn.FFN {
	pre := f.prefix(i)
	if a.Config == nil || !a.Config.IsMoELayer(i) {
		lin := func(name string) nn.Linear {
			return nn.Linear{Name: name, W: param(name + ".weight"), GW: grad(name + ".weight")}
		}
		return &nn.MLP{Name: pre, Gate: lin(pre + ".w1"), Up: lin(pre + ".w3"), Down: lin(pre + ".w2"), Act: nn.SiLU}
	}
	ffn := f.moeFFN.Build(a, i, param, grad)
	m, ok := ffn.(*nn.MoE)
	if !ok {
		return ffn
	}
	m.Score = backend.RouterSigmoid
	m.RoutedScaling = float32(a.Config.RoutedScalingFactor)
	if a.RouterBias {
		m.ScoreBias = param(pre + "." + expertBiasName)
	}
	return m
}
