package models

import (
	"github.com/halo-shell/halo-shell/engine/nn"
)

// JetMoE (jetmoe; structure: the jetmoe family of engine/hf/config): every layer's attention
// is a mixture of attention heads (nn.MoA) and its feed-forward block a mixture of GLU experts,
// both routed by the softmax over each token's top-k router logits. Checkpoint names, per layer:
//
//	self_attention.experts.router.layer.weight   [E, C]          the attention's router
//	self_attention.experts.input_linear.weight   [E, NKV·HD, C]  each expert's query projection
//	self_attention.experts.output_linear.weight  [E, C, NKV·HD]  each expert's output projection
//	self_attention.experts.bias                  [C]             added to the attention output
//	self_attention.kv_proj.weight                [2·NKV·HD, C]   keys, then values
//	mlp.router.layer.weight                      [E, C]
//	mlp.input_linear.weight                      [E, 2I, C]      each expert's gate rows, then up rows
//	mlp.output_linear.weight                     [E, C, I]
//	mlp.bias                                     [C]             added to the experts' sum
//
// The attention's query heads are the top-k slots' key/value heads (num_attention_heads =
// top-k · NKV); head i·NKV + j attends with key/value head j. The feed-forward experts load
// and save as granitemoe's (split into per-expert parameters, written fused); the attention's
// expert tensors stay whole. The decoder layers' RMSNorms use epsilon 1e-6 whatever
// rms_norm_eps says (transformers builds them with the module's default), the final norm
// rms_norm_eps.
//
// Layouts: data parallelism and FSDP; tensor, context and expert parallelism are refused by
// engine/mesh (rule moa).
func init() {
	Register(&Family{
		ModelType: "jetmoe",
		Caps:      Caps{TiedEmbeddings: true, Reason: "(JetMoE attention has no sliding window)"},
		FFN: &moeFFN{block: "mlp", router: "router.layer", gate: "gate_proj", up: "up_proj", down: "down_proj",
			fused: fusedNames{GateUp: "input_linear.weight", Down: "output_linear.weight"}, outBias: "bias"},
		Mixer:        jetmoeMixer{},
		LayerNormEps: 1e-6,
		Placements:   jetmoePlacements(),
	})
}

// jetmoePlacements places every weight whole (tensor parallelism is refused, rule moa; the
// feed-forward experts are still placed per expert for the table's completeness).
func jetmoePlacements() []Placement {
	ps := []Placement{
		{Module: "model.embed_tokens", Split: Replicated},
		{Module: "model.norm", Split: Replicated},
		{Module: "lm_head", Split: Replicated},
		{Module: "model.layers.*.input_layernorm", Split: Replicated},
		{Module: "model.layers.*.post_attention_layernorm", Split: Replicated},
		{Module: "model.layers.*.self_attention.experts", Split: Replicated},
		{Module: "model.layers.*.self_attention.experts.router.layer", Split: Replicated},
		{Module: "model.layers.*.self_attention.experts.input_linear", Split: Replicated},
		{Module: "model.layers.*.self_attention.experts.output_linear", Split: Replicated},
		{Module: "model.layers.*.self_attention.kv_proj", Split: Replicated},
		{Module: "model.layers.*.mlp", Split: Replicated}, // bias
	}
	return append(ps, expertPlacements("mlp", "router.layer", "gate_proj", "up_proj", "down_proj")...)
}

// jetmoeMixer are JetMoE's attention hooks: the mixture of attention heads in every layer.
type jetmoeMixer struct{}

// Specs implements MixerHooks, in transformers' order.
func (jetmoeMixer) Specs(a *Arch, i int) []ParamSpec {
	at := func(n string) string { return layerName(i, "self_attention."+n) }
	kv, c, e := a.KVHeads*a.HeadDim, a.Hidden, a.Experts
	return []ParamSpec{
		bias(at("experts.bias"), c),
		{Name: at("experts.input_linear.weight"), Shape: []int{e, kv, c}, Decay: true, Init: InitNormal, ZeroRow: -1},
		{Name: at("experts.output_linear.weight"), Shape: []int{e, c, kv}, Decay: true, Init: InitNormal, ZeroRow: -1},
		matrix(at("experts.router.layer.weight"), e, c),
		matrix(at("kv_proj.weight"), 2*kv, c),
	}
}

// Build implements MixerHooks.
func (jetmoeMixer) Build(a *Arch, i int, b *binder) *nn.Attention {
	pre := layerName(i, "self_attention.")
	ex := pre + "experts."
	return &nn.Attention{Name: pre[:len(pre)-1], Layer: i, NH: a.Heads, NKV: a.KVHeads, HD: a.HeadDim, MoA: &nn.MoA{
		Name: pre[:len(pre)-1], Router: b.lin(ex + "router.layer"), KV: b.lin(pre + "kv_proj"),
		WQ: b.param(ex + "input_linear.weight"), GWQ: b.grad(ex + "input_linear.weight"),
		WO: b.param(ex + "output_linear.weight"), GWO: b.grad(ex + "output_linear.weight"),
		Bias: b.param(ex + "bias"), GBias: b.grad(ex + "bias"),
		E: a.Experts, TopK: a.TopK, NKV: a.KVHeads, HD: a.HeadDim, Layer: i,
	}}
}
