package models

import (
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// DeepSeek-V3: multi-head latent attention (nn.MLA; structure: the deepseek_v3 family of
// engine/hf/config) in every layer, a dense SwiGLU MLP in the first first_k_dense_replace
// layers and, in the others, routed experts under DeepSeek's router plus shared experts
// (sigmoidMoE). Checkpoint names are transformers':
//
//	self_attn.q_a_proj, q_a_layernorm, q_b_proj (or q_proj), kv_a_proj_with_mqa,
//	kv_a_layernorm, kv_b_proj, o_proj
//	mlp.gate.weight, mlp.gate.e_score_correction_bias, mlp.experts.X.{gate,up,down}_proj,
//	mlp.shared_experts.{gate,up,down}_proj
//
// Layouts: data parallelism, FSDP and expert parallelism. Tensor parallelism is refused by
// engine/mesh (rule tp-latent): the latent projections q_a_proj and kv_a_proj_with_mqa feed
// every head, and the table below places the per-head projections whole. Context
// parallelism of the MoE layers is refused by the general rule (support).
func init() {
	Register(&Family{
		ModelType:  "deepseek_v3",
		Caps:       Caps{TiedEmbeddings: true, Reason: "(DeepSeek-V3 attention has no sliding window)"},
		FFN:        &sigmoidMoE{moeFFN: moeFFN{block: "mlp", gate: "gate_proj", up: "up_proj", down: "down_proj", shared: "shared_experts"}},
		Placements: latentPlacements(),
	})
}

// latentPlacements is the tensor-parallel table of the latent-attention families: every
// attention and dense weight whole (tensor parallelism is refused for them), routed experts
// spread over the expert group (split under expert-tensor parallelism, which needs tensor
// parallelism and so is refused too).
func latentPlacements() []Placement {
	ps := []Placement{
		{Module: "model.embed_tokens", Split: Replicated},
		{Module: "model.layers.*.input_layernorm", Split: Replicated},
		{Module: "model.layers.*.post_attention_layernorm", Split: Replicated},
		{Module: "model.norm", Split: Replicated},
		{Module: "lm_head", Split: Replicated},
	}
	for _, m := range []string{"q_proj", "q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj"} {
		ps = append(ps, Placement{Module: "model.layers.*.self_attn." + m, Split: Replicated})
	}
	ps = append(ps, denseMLPPlacements("mlp", "gate_proj", "up_proj", "down_proj", Replicated)...)
	ps = append(ps, denseMLPPlacements("mlp.shared_experts", "gate_proj", "up_proj", "down_proj", Replicated)...)
	return append(ps, expertPlacements("mlp", "gate", "gate_proj", "up_proj", "down_proj")...)
}

// latentSpecs lists layer i's latent-attention parameters in transformers' state_dict order.
// Biases: q_a_proj and kv_a_proj_with_mqa carry them with attention_bias (QKVBias), o_proj
// with OBias; q_proj, q_b_proj and kv_b_proj never do.
func latentSpecs(a *Arch, i int) []ParamSpec {
	l := a.Latent
	qk, c := l.QKHead(), a.Hidden
	at := func(name string) string { return layerName(i, "self_attn."+name) }
	var s []ParamSpec
	lin := func(name string, out, in int, b bool) {
		s = append(s, matrix(at(name+".weight"), out, in))
		if b {
			s = append(s, bias(at(name+".bias"), out))
		}
	}
	if l.QRank > 0 {
		lin("q_a_proj", l.QRank, c, a.QKVBias)
		s = append(s, normWeight(at("q_a_layernorm.weight"), l.QRank))
		lin("q_b_proj", a.Heads*qk, l.QRank, false)
	} else {
		lin("q_proj", a.Heads*qk, c, false)
	}
	lin("kv_a_proj_with_mqa", l.KVRank+l.Rope, c, a.QKVBias)
	s = append(s, normWeight(at("kv_a_layernorm.weight"), l.KVRank))
	lin("kv_b_proj", a.Heads*(l.Nope+l.V), l.KVRank, false)
	lin("o_proj", c, a.Heads*l.V, a.OBias)
	return s
}

// latentScale is the softmax scale of latent attention as transformers computes it:
// qk_head_dim^-0.5, times mscale^2 with mscale = 0.1 * mscale_all_dim * ln(factor) + 1 when
// the rope type is not "default", mscale_all_dim is set and factor > 1.
func latentScale(c *config.Config) float32 {
	s := 1 / math.Sqrt(float64(c.QKNopeHeadDim+c.QKRopeHeadDim))
	r := c.Rope
	if r.Type != "" && r.Type != "default" && r.MScaleAllDim != 0 && r.Factor > 1 {
		m := 0.1*r.MScaleAllDim*math.Log(r.Factor) + 1
		s *= m * m
	}
	return float32(s)
}

// latentNormEps is the epsilon of q_a_layernorm and kv_a_layernorm: DeepseekV3Attention and
// Glm4MoeLiteAttention construct them without rms_norm_eps, so they keep the RMSNorm default
// (GLM-4.7-Flash's rms_norm_eps is 1e-5; these two norms use 1e-6).
const latentNormEps = 1e-6

// latentAttention builds layer i's nn.MLA from the parameter views.
func latentAttention(a *Arch, i int, lin func(string) nn.Linear, norm func(string) nn.RMSNorm) *nn.MLA {
	l := a.Latent
	pre := layerName(i, "self_attn.")
	m := &nn.MLA{Name: pre + "mla", NH: a.Heads, Nope: l.Nope, Rope: l.Rope, V: l.V, KVRank: l.KVRank, QRank: l.QRank,
		KVA: lin(pre + "kv_a_proj_with_mqa"), KVANorm: norm(pre + "kv_a_layernorm"), KVB: lin(pre + "kv_b_proj"),
		O: lin(pre + "o_proj"), Layer: i}
	if l.QRank > 0 {
		m.QA, m.QANorm, m.QB = lin(pre+"q_a_proj"), norm(pre+"q_a_layernorm"), lin(pre+"q_b_proj")
	} else {
		m.Q = lin(pre + "q_proj")
	}
	// transformers builds the latent norms with RMSNorm's default epsilon, not rms_norm_eps.
	m.QANorm.Eps, m.KVANorm.Eps = latentNormEps, latentNormEps
	if c := a.Config; c != nil {
		m.Interleaved, m.Scale = c.RopeInterleave, latentScale(c)
	}
	return m
}

// sigmoidMoE are the feed-forward hooks of DeepSeek-V3's mixture-of-experts layers, which
// GLM-4.7-Flash (glm4_moe_lite) shares: moeFFN's router and experts, with
//
//	<block>.gate.e_score_correction_bias   [E]   selection-only bias (a checkpoint buffer; it
//	                                             gets no gradient, so training leaves it as
//	                                             loaded)
//	<block>.shared_experts.{gate,up,down}_proj   one SwiGLU MLP of the shared width
//
// and the router's sigmoid scores, expert groups, renormalisation and scaling from config.json.
// The shared experts are moeFFN's (shared: "shared_experts"). bias is the correction bias's
// module under the block when it is not the router's ("" for "gate"; Laguna's "experts").
type sigmoidMoE struct {
	moeFFN
	bias string
}

// biasName is the correction bias of layer i.
func (f *sigmoidMoE) biasName(i int) string {
	m := f.bias
	if m == "" {
		m = "gate"
	}
	return f.prefix(i) + "." + m + "." + scoreBiasName
}

// Specs implements FFNHooks.
func (f *sigmoidMoE) Specs(a *Arch, i int) []ParamSpec {
	s := f.moeFFN.Specs(a, i)
	if s == nil {
		return nil
	}
	// After the router weight: the correction bias, then the experts and the shared MLP.
	return append([]ParamSpec{s[0], bias(f.biasName(i), a.Experts)}, s[1:]...)
}

// Build implements FFNHooks.
func (f *sigmoidMoE) Build(a *Arch, i int, param, grad func(string) tensor.Tensor) nn.FFN {
	ffn := f.moeFFN.Build(a, i, param, grad)
	m, ok := ffn.(*nn.MoE)
	if !ok {
		return ffn
	}
	c := a.Config
	m.Score, m.NGroup, m.TopKGroup = backend.RouterSigmoid, c.NGroup, c.TopKGroup
	m.RoutedScaling = float32(c.RoutedScalingFactor)
	m.ScoreBias = param(f.biasName(i))
	return m
}
