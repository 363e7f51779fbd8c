package models

import (
	"sort"
	"strings"

	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Qwen3-Next (qwen3_next) and Qwen3.5-MoE's text model (qwen3_5_moe_text): layers of gated
// delta-net linear attention (nn.GatedDeltaNet, under model.layers.L.linear_attn) beside full
// attention with a sigmoid output gate in q_proj, per-head q/k norms and partial rotary; every
// RMSNorm but the linear layers' gated one scales by 1 + w; the feed-forward blocks are
// softmax top-k experts with a shared expert gated by sigmoid(shared_expert_gate(x))
// (qwen2_moe's, moeFFN) and, in qwen3_next's mlp_only_layers, a dense MLP. Checkpoint names of
// a linear layer are transformers':
//
//	qwen3_next:        linear_attn.{dt_bias, A_log, conv1d, in_proj_qkvz, in_proj_ba, norm, out_proj}
//	qwen3_5_moe_text:  linear_attn.{dt_bias, A_log, conv1d, norm, out_proj, in_proj_qkv,
//	                   in_proj_z, in_proj_b, in_proj_a}
//
// Layouts: data parallelism, FSDP and expert parallelism. Tensor parallelism is refused by
// engine/mesh (rule tp-linear: the linear layers are not split) and context parallelism too
// (rule cp-linear: their recurrence runs over whole sequences), as is expert-tensor parallelism
// (rule etp: the shared expert is not split). Generation decodes on the host: the linear
// layers carry each row's recurrent state and last conv inputs from step to step
// (nn.LinearState) instead of keys and values.
func init() {
	for _, fam := range []struct {
		modelType string
		layout    GDNLayout
	}{{"qwen3_next", GDNGrouped}, {"qwen3_5_moe_text", GDNSplit}} {
		Register(&Family{
			ModelType:     fam.modelType,
			Caps:          Caps{TiedEmbeddings: true, Reason: "(gated delta-net families have no sliding window)"},
			NormOffset:    1,
			GatedDeltaNet: fam.layout,
			FFN: &moeFFN{block: "mlp", gate: "gate_proj", up: "up_proj", down: "down_proj",
				shared: "shared_expert", sharedGate: "shared_expert_gate"},
			Placements: linearPlacements(fam.layout),
		})
	}
}

// GDNLayout is how a family stores the input projections of its gated delta-net layers.
type GDNLayout uint8

const (
	// GDNNone: the family has no gated delta-net layers.
	GDNNone GDNLayout = iota
	// GDNGrouped: in_proj_qkvz and in_proj_ba, rows grouped per key head (qwen3_next).
	GDNGrouped
	// GDNSplit: in_proj_qkv, in_proj_z, in_proj_b and in_proj_a (qwen3_5_moe_text).
	GDNSplit
)

// linearProjections are the input projections of a gated delta-net layer of layout l with
// their output widths, in transformers' parameter order.
func linearProjections(l GDNLayout, a *Arch) []struct {
	name string
	out  int
} {
	s := a.Linear
	conv, vd := s.ConvDim(), s.ValueHeads*s.ValueDim
	if l == GDNGrouped {
		return []struct {
			name string
			out  int
		}{{"in_proj_qkvz", conv + vd}, {"in_proj_ba", 2 * s.ValueHeads}}
	}
	return []struct {
		name string
		out  int
	}{{"in_proj_qkv", conv}, {"in_proj_z", vd}, {"in_proj_b", s.ValueHeads}, {"in_proj_a", s.ValueHeads}}
}

// linearSpecs lists layer i's gated delta-net parameters in transformers' state_dict order:
// the module's own dt_bias and A_log, then its submodules in construction order.
func linearSpecs(f *Family, a *Arch, i int) []ParamSpec {
	s := a.Linear
	at := func(name string) string { return layerName(i, "linear_attn."+name) }
	layout := GDNGrouped
	if f != nil {
		layout = f.GatedDeltaNet
	}
	out := []ParamSpec{
		{Name: at("dt_bias"), Shape: []int{s.ValueHeads}, Init: InitUnit, ZeroRow: -1},
		{Name: at("A_log"), Shape: []int{s.ValueHeads}, Init: InitLogUniform, ZeroRow: -1},
		{Name: at("conv1d.weight"), Shape: []int{s.ConvDim(), 1, s.Conv}, Decay: true, Init: InitNormal, ZeroRow: -1},
	}
	proj := make([]ParamSpec, 0, 4)
	for _, p := range linearProjections(layout, a) {
		proj = append(proj, matrix(at(p.name+".weight"), p.out, a.Hidden))
	}
	tail := []ParamSpec{
		{Name: at("norm.weight"), Shape: []int{s.ValueDim}, Init: InitUnit, ZeroRow: -1},
		matrix(at("out_proj.weight"), a.Hidden, s.ValueHeads*s.ValueDim),
	}
	if layout == GDNGrouped {
		return append(append(out, proj...), tail...)
	}
	return append(append(out, tail...), proj...)
}

// linearAttention builds layer i's nn.GatedDeltaNet from the parameter views.
func linearAttention(f *Family, a *Arch, i int, lin func(string) nn.Linear, p, g func(string) tensor.Tensor) *nn.GatedDeltaNet {
	s := a.Linear
	pre := layerName(i, "linear_attn.")
	l := &nn.GatedDeltaNet{Name: pre[:len(pre)-1], Grouped: f.GatedDeltaNet == GDNGrouped,
		Out: lin(pre + "out_proj"), KH: s.KeyHeads, VH: s.ValueHeads, KD: s.KeyDim, VD: s.ValueDim, K: s.Conv,
		Eps: a.NormEps, Layer: i,
		Conv: p(pre + "conv1d.weight"), DtBias: p(pre + "dt_bias"), ALog: p(pre + "A_log"), NormW: p(pre + "norm.weight"),
		GConv: g(pre + "conv1d.weight"), GDtBias: g(pre + "dt_bias"), GALog: g(pre + "A_log"), GNormW: g(pre + "norm.weight"),
	}
	if l.Grouped {
		l.QKVZ, l.BA = lin(pre+"in_proj_qkvz"), lin(pre+"in_proj_ba")
	} else {
		l.QKV, l.Z, l.B, l.A = lin(pre+"in_proj_qkv"), lin(pre+"in_proj_z"), lin(pre+"in_proj_b"), lin(pre+"in_proj_a")
	}
	return l
}

// linearPlacements is the tensor-parallel table of the gated delta-net families. Tensor
// parallelism is refused for them (rule tp-linear), so attention, the linear layers, the
// dense MLPs and the shared expert are whole; routed experts spread over the expert group.
func linearPlacements(l GDNLayout) []Placement {
	ps := []Placement{
		{Module: "model.embed_tokens", Split: Replicated},
		{Module: "model.layers.*.input_layernorm", Split: Replicated},
		{Module: "model.layers.*.post_attention_layernorm", Split: Replicated},
		{Module: "model.norm", Split: Replicated},
		{Module: "lm_head", Split: Replicated},
		{Module: "model.layers.*.linear_attn", Split: Replicated}, // dt_bias, A_log
	}
	for _, m := range []string{"q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"} {
		ps = append(ps, Placement{Module: "model.layers.*.self_attn." + m, Split: Replicated})
	}
	mods := []string{"conv1d", "norm", "out_proj", "in_proj_qkvz", "in_proj_ba"}
	if l == GDNSplit {
		mods = []string{"conv1d", "norm", "out_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"}
	}
	for _, m := range mods {
		ps = append(ps, Placement{Module: "model.layers.*.linear_attn." + m, Split: Replicated})
	}
	if l == GDNGrouped {
		// qwen3_next's mlp_only_layers; qwen3_5_moe_text has no dense MLP.
		ps = append(ps, denseMLPPlacements("mlp", "gate_proj", "up_proj", "down_proj", Replicated)...)
	}
	ps = append(ps, sharedPlacements("shared_expert", "shared_expert_gate")...)
	return append(ps, expertPlacements("mlp", "gate", "gate_proj", "up_proj", "down_proj")...)
}

// languageModelPrefix is where Qwen3.5-MoE's vision-language checkpoints hold the text
// model's weights (Qwen3_5MoeForConditionalGeneration's model.language_model).
const languageModelPrefix = "model.language_model."

// lmPrefixed presents a checkpoint's model.language_model.* tensors under model.* (the names
// of Qwen3_5MoeForCausalLM, which loads them so too), where the source has no tensor of that
// name. The vision tower (model.visual.*) and the multi-token-prediction layers stay under
// their names and are reported unused.
type lmPrefixed struct {
	safetensors.Source
	alias map[string]string // model.* name -> the source's name
	names []string
}

// withLanguageModelPrefix wraps src when it holds model.language_model.* tensors; otherwise
// it returns src.
func withLanguageModelPrefix(src safetensors.Source) safetensors.Source {
	w := &lmPrefixed{Source: src, alias: map[string]string{}}
	for _, n := range src.Names() {
		rest, ok := strings.CutPrefix(n, languageModelPrefix)
		if !ok {
			w.names = append(w.names, n)
			continue
		}
		if _, has := src.Tensor("model." + rest); has {
			w.names = append(w.names, n)
			continue
		}
		w.alias["model."+rest] = n
		w.names = append(w.names, "model."+rest)
	}
	if len(w.alias) == 0 {
		return src
	}
	sort.Strings(w.names)
	return w
}

func (w *lmPrefixed) Names() []string { return w.names }

func (w *lmPrefixed) Tensor(name string) (safetensors.TensorInfo, bool) {
	if n, ok := w.alias[name]; ok {
		info, ok := w.Source.Tensor(n)
		info.Name = name
		return info, ok
	}
	return w.Source.Tensor(name)
}
