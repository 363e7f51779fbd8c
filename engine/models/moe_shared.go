package models

import (
	"github.com/halo-shell/halo-shell/engine/nn"
)

// What the shared experts add to a mixture-of-experts layer, after the routed experts:
//
//	model.layers.L.mlp.<shared>.{gate,up}_proj.weight [S, C]  shared-expert SwiGLU MLP
//	model.layers.L.mlp.<shared>.down_proj.weight      [C, S]
//	model.layers.L.mlp.<sharedGate>.weight            [1, C]  its sigmoid gate (qwen2_moe)

// scoreBiasName is the correction bias of a sigmoid router (sigmoidMoE).
const scoreBiasName = "e_score_correction_bias"

// extraSpecs lists the shared experts' parameters.
func (f *moeFFN) extraSpecs(a *Arch, pre string) []ParamSpec {
	var out []ParamSpec
	if f.outBias != "" {
		out = append(out, bias(pre+"."+f.outBias, a.Hidden))
	}
	if f.shared == "" || a.SharedExpert <= 0 {
		return out
	}
	sp := pre + "." + f.shared + "."
	s := []ParamSpec{matrix(sp+"gate_proj.weight", a.SharedExpert, a.Hidden),
		matrix(sp+"up_proj.weight", a.SharedExpert, a.Hidden),
		matrix(sp+"down_proj.weight", a.Hidden, a.SharedExpert)}
	if f.sharedGate != "" && a.SharedExpertGate {
		s = append(s, matrix(pre+"."+f.sharedGate+".weight", 1, a.Hidden))
	}
	return append(out, s...)
}

// buildExtra sets the shared experts (and their gate) on block m.
func (f *moeFFN) buildExtra(a *Arch, m *nn.MoE, pre string, lin func(string) nn.Linear) {
	if f.shared == "" || a.SharedExpert <= 0 {
		return
	}
	sp := pre + "." + f.shared
	m.Shared = &nn.MLP{Name: sp, Gate: lin(sp + ".gate_proj"), Up: lin(sp + ".up_proj"), Down: lin(sp + ".down_proj")}
	if f.sharedGate != "" && a.SharedExpertGate {
		g := lin(pre + "." + f.sharedGate)
		m.SharedGate = &g
	}
}

// sharedPlacements places the router's correction bias (with the router, whole) and the shared
// experts: whole on every tensor rank, as the dense MLPs of these families are (their width is
// not narrowed on the ranks); engine/mesh refuses expert-tensor parallelism for models with
// shared experts (rule etp).
func sharedPlacements(shared, sharedGate string) []Placement {
	pre := "model.layers.*.mlp."
	ps := denseMLPPlacements("mlp."+shared, "gate_proj", "up_proj", "down_proj", Replicated)
	if sharedGate != "" {
		ps = append(ps, Placement{Module: pre + sharedGate, Split: Replicated})
	}
	return ps
}

// Qwen2-MoE: Qwen2 attention (q/k/v biases from qkv_bias) with a sparse block in the layers
// decoder_sparse_step and mlp_only_layers pick: softmax top-k over num_experts experts plus a
// shared expert of shared_expert_intermediate_size gated by sigmoid(shared_expert_gate(x)).
// Tensor parallelism splits attention; routers, shared experts and dense MLPs stay whole.
func init() {
	Register(&Family{
		ModelType: "qwen2_moe",
		Caps:      Caps{SlidingWindow: true, TiedEmbeddings: true},
		FFN: &moeFFN{block: "mlp", gate: "gate_proj", up: "up_proj", down: "down_proj",
			shared: "shared_expert", sharedGate: "shared_expert_gate"},
		Placements: decoderPlacements(
			expertPlacements("mlp", "gate", "gate_proj", "up_proj", "down_proj"),
			denseMLPPlacements("mlp", "gate_proj", "up_proj", "down_proj", Replicated),
			sharedPlacements("shared_expert", "shared_expert_gate")),
	})
}

// GLM-4.5 (glm4_moe): GQA attention with q/k/v biases, optional per-head q/k norms
// (use_qk_norm) and partial rotary; dense first_k_dense_replace layers, then sparse layers
// with DeepSeek-V3's mixture of experts (sigmoidMoE: the sigmoid, group-limited router with
// e_score_correction_bias, n_group, topk_group, routed_scaling_factor) and n_shared_experts
// shared experts. The multi-token-prediction layers of num_nextn_predict_layers are not built:
// their checkpoint weights (model.layers.L for L >= num_hidden_layers) are reported unused, and
// Save writes num_nextn_predict_layers 0.
func init() {
	Register(&Family{
		ModelType: "glm4_moe",
		Caps:      Caps{TiedEmbeddings: true, Reason: "(GLM-4.5 attention has no sliding window)"},
		FFN: &sigmoidMoE{moeFFN: moeFFN{block: "mlp", gate: "gate_proj", up: "up_proj", down: "down_proj",
			shared: "shared_experts"}},
		Placements: decoderPlacements(qkNormPlacements(PerHead),
			expertPlacements("mlp", "gate", "gate_proj", "up_proj", "down_proj"),
			denseMLPPlacements("mlp", "gate_proj", "up_proj", "down_proj", Replicated),
			sharedPlacements("shared_experts", "")),
	})
}
