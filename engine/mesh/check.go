package mesh

import (
	"fmt"
	"math"
	"slices"

	"github.com/halo-shell/halo-shell/engine/hf/config"
)

// ModelShape is the structure of the model a layout is checked against: config.Shape, as the
// model's family resolves it from config.json (engine/models embeds the same value in
// models.Arch). The rules read its sizes, which weights exist and the expert layout.
type ModelShape = config.Shape

// Rule names, as they appear in LayoutError.Rule.
const (
	RuleDegrees    = "degrees"     // every degree >= 1, TP·CP divides the devices, DP·TP·CP = devices
	RuleTPHeads    = "tp-heads"    // TP divides heads and KV heads
	RuleTPWidth    = "tp-width"    // TP divides the MLP width
	RuleTPQKNorm   = "tp-qknorm"   // q/k norms over the whole projection are not split
	RuleTPFused    = "tp-fused"    // fused qkv_proj / gate_up_proj weights are not split
	RuleTPLatent   = "tp-latent"   // multi-head latent attention is not split
	RuleTPLinear   = "tp-linear"   // gated delta-net (linear attention) layers are not split
	RuleCPLinear   = "cp-linear"   // gated delta-net layers run over whole sequences
	RuleTPConv     = "tp-conv"     // short-convolution layers (lfm2_moe) are not split
	RuleCPConv     = "cp-conv"     // short-convolution layers read across context chunks
	RuleCPSeq      = "cp-seqlen"   // 2·CP divides the sequence length
	RuleEPExperts  = "ep-experts"  // EP divides the experts and DP·CP
	RuleETP        = "etp"         // ETP is 1 or TP and divides the expert width
	RuleSupport    = "support"     // the combination is outside the support matrix
	RuleExpertBias = "expert-bias" // experts with biases in the checkpoint's layout (gpt_oss) are not split
	RuleAdapters   = "adapters"    // LoRA adapters train under plain data parallelism only
	// RuleGemma4Parts: Gemma 4's per-layer inputs, MoE block and shared KV layers run
	// under data, fsdp and context parallelism only.
	RuleGemma4Parts = "gemma4-parts"
	// RuleHostDecoder: a family with a decoder of its own (deepseek_v4: the host tape or its
	// device decoder) holds whole parameters and whole documents on each rank: data
	// parallelism and fsdp only.
	RuleHostDecoder = "host-decoder"
	// RuleMoA: JetMoE's mixture of attention heads holds each expert's query and output
	// projections whole, and routes each token's queries on its own rank: data parallelism
	// and fsdp only.
	RuleMoA = "moa"
)

// CheckAdapters is the rule for a run that trains LoRA adapters over a frozen base: the
// adapters are replicated with the base on every data-parallel rank and only their gradients
// are all-reduced, so plain data parallelism carries them. FSDP (whose shards are laid out over
// the base's arena), tensor, context and expert parallelism (which would split the adapters
// with their base weights) do not yet; it refuses those, naming the rule and the layout that
// works (the same devices in plain data parallelism).
func CheckAdapters(l Layout, n int) error {
	l = l.Norm(max(n, 1))
	if !l.FSDP && one(l.TP) == 1 && one(l.CP) == 1 && one(l.EP) == 1 && one(l.ETP) == 1 {
		return nil
	}
	return fmt.Errorf("mesh: layout %q on %d devices breaks rule %s: LoRA adapters (use_peft) train under plain data parallelism only: fsdp shards gradients and optimizer state, which the frozen base has none of (plain dp already keeps them for the adapters alone), and tensor, context and expert parallelism would split the adapters with their base weights, which is not implemented; a layout that works: %q",
		l.String(), n, RuleAdapters, Layout{DP: max(n, 1)}.Norm(max(n, 1)).String())
}

// LayoutError is a refused layout: the rule it breaks, what is wrong, and a layout that passes
// every rule on the same devices (Suggest).
type LayoutError struct {
	Rule    string
	Layout  Layout
	Devices int
	Detail  string
	Suggest Layout
}

func (e *LayoutError) Error() string {
	return fmt.Sprintf("mesh: layout %q on %d devices breaks rule %s: %s; a layout that works: %q",
		e.Layout.String(), e.Devices, e.Rule, e.Detail, e.Suggest.String())
}

// Check applies every rule to layout l on n devices for model m trained on sequences of seqLen
// tokens (0: unknown, the CP length rule is then left to CheckSeqLen). It returns nil or a
// *LayoutError whose Suggest passes every rule.
func Check(l Layout, n int, m ModelShape, seqLen int) error {
	l = l.Norm(n)
	rule, detail := firstBroken(l, n, m, seqLen)
	if rule == "" {
		return nil
	}
	return &LayoutError{Rule: rule, Layout: l, Devices: n, Detail: detail, Suggest: Suggest(l, n, m, seqLen)}
}

// CheckSeqLen applies the context-parallel length rule to one sequence (or packed row) length.
func CheckSeqLen(l Layout, seqLen int) error {
	cp := one(l.CP)
	if cp > 1 && seqLen%(2*cp) != 0 {
		return fmt.Errorf("mesh: rule %s: context_parallel_size %d splits each sequence into %d equal chunks, so the length must be a multiple of %d; got %d tokens (pad or pack to a multiple of %d)",
			RuleCPSeq, cp, 2*cp, 2*cp, seqLen, 2*cp)
	}
	return nil
}

func firstBroken(l Layout, n int, m ModelShape, seqLen int) (rule, detail string) {
	if n < 1 {
		return RuleDegrees, fmt.Sprintf("there are %d devices", n)
	}
	for _, d := range []struct {
		name string
		v    int
	}{{"tensor_parallel_size", l.TP}, {"context_parallel_size", l.CP},
		{"expert_parallel_size", l.EP}, {"expert_tensor_parallel_size", l.ETP}} {
		if d.v < 1 {
			return RuleDegrees, fmt.Sprintf("%s is %d; every degree must be at least 1", d.name, d.v)
		}
	}
	if n%(l.TP*l.CP) != 0 {
		return RuleDegrees, fmt.Sprintf("tensor_parallel_size %d × context_parallel_size %d = %d does not divide the %d devices", l.TP, l.CP, l.TP*l.CP, n)
	}
	if l.DP*l.TP*l.CP != n {
		return RuleDegrees, fmt.Sprintf("dp %d × tp %d × cp %d = %d, but there are %d devices (leave dp out to fill the devices)", l.DP, l.TP, l.CP, l.DP*l.TP*l.CP, n)
	}
	if m.V4.HC > 0 && (l.TP > 1 || l.CP > 1 || l.EP > 1 || l.ETP > 1) {
		return RuleHostDecoder, fmt.Sprintf("this model (deepseek_v4) runs a decoder of its own (the host tape or its device decoder) over whole parameters and whole documents; tensor_parallel_size %d, context_parallel_size %d, expert_parallel_size %d and expert_tensor_parallel_size %d are not implemented for it: use data parallelism or fsdp", l.TP, l.CP, l.EP, l.ETP)
	}
	if m.MoA && (l.TP > 1 || l.CP > 1 || l.EP > 1 || l.ETP > 1) {
		return RuleMoA, fmt.Sprintf("this model's attention (jetmoe) is a mixture of attention heads whose experts' query and output projections are held whole; tensor_parallel_size %d, context_parallel_size %d, expert_parallel_size %d and expert_tensor_parallel_size %d are not implemented for it: use data parallelism or fsdp", l.TP, l.CP, l.EP, l.ETP)
	}
	if m.ExpertBias && (l.TP > 1 || l.EP > 1) {
		return RuleExpertBias, fmt.Sprintf("this model's experts (gpt_oss) are held in the checkpoint's layout with biases, whose split over tensor_parallel_size %d or expert_parallel_size %d is not implemented; use data parallelism or fsdp", l.TP, l.EP)
	}
	if g := m.Global; (l.TP > 1 || l.EP > 1) && (g.PerLayerInput > 0 || g.BesideExperts > 0 || slices.ContainsFunc(g.SharedFrom, func(j int) bool { return j >= 0 })) {
		return RuleGemma4Parts, fmt.Sprintf("this model's per-layer input embeddings, MoE block beside the MLP or shared KV layers (gemma4_text) run whole on each rank, and their split over tensor_parallel_size %d or expert_parallel_size %d is not implemented; use data parallelism, fsdp or context parallelism", l.TP, l.EP)
	}
	if l.TP > 1 {
		if m.Heads%l.TP != 0 || m.KVHeads%l.TP != 0 {
			return RuleTPHeads, fmt.Sprintf("tensor_parallel_size %d must divide the %d attention heads and the %d key/value heads", l.TP, m.Heads, m.KVHeads)
		}
		if m.Global.Full != nil && m.Global.KVHeads%l.TP != 0 {
			return RuleTPHeads, fmt.Sprintf("tensor_parallel_size %d must divide the %d key/value heads of the full-attention layers (num_global_key_value_heads)", l.TP, m.Global.KVHeads)
		}
		if m.Conv.Layers != nil {
			return RuleTPConv, fmt.Sprintf("this model's short-convolution layers (lfm2_moe) hold B, C and x in one in_proj weight, whose parts tensor_parallel_size %d would have to split separately, which is not implemented; use tensor_parallel_size 1 (data, fsdp and expert parallelism work)", l.TP)
		}
		if !m.MoE() && m.Intermediate > 0 && m.Intermediate%l.TP != 0 {
			return RuleTPWidth, fmt.Sprintf("tensor_parallel_size %d must divide the MLP width (intermediate_size %d)", l.TP, m.Intermediate)
		}
		if m.FusedQKV || m.FusedGateUp {
			return RuleTPFused, fmt.Sprintf("this model fuses q/k/v into qkv_proj or gate and up into gate_up_proj, whose parts tensor_parallel_size %d would have to split separately, which is not implemented; use tensor_parallel_size 1", l.TP)
		}
		if m.Latent.KVRank > 0 {
			return RuleTPLatent, fmt.Sprintf("this model's latent attention (deepseek_v3, glm4_moe_lite) projects every head from shared low-rank q and kv projections and one rotary key whose gradient sums over all heads; its split over tensor_parallel_size %d is not implemented: use tensor_parallel_size 1 (data, fsdp and expert parallelism work)", l.TP)
		}
		if m.Linear.Layers > 0 {
			return RuleTPLinear, fmt.Sprintf("this model's gated delta-net (linear attention) layers (qwen3_next, qwen3_5_moe_text) run their conv, recurrence and gated norm whole, and their split over tensor_parallel_size %d is not implemented: use tensor_parallel_size 1 (data, fsdp and expert parallelism work)", l.TP)
		}
		if m.QKNorm == config.QKNormProjection {
			return RuleTPQKNorm, fmt.Sprintf("this model normalises q and k over the whole projection (not per head), which tensor_parallel_size %d would split; use tensor_parallel_size 1", l.TP)
		}
	}
	if l.CP > 1 && m.Linear.Layers > 0 {
		return RuleCPLinear, fmt.Sprintf("context_parallel_size %d would split sequences, but this model's gated delta-net layers carry a recurrent state from each token to the next over the whole sequence, which is not passed between ranks: use context_parallel_size 1", l.CP)
	}
	if l.CP > 1 && slices.Contains(m.Conv.Layers, true) {
		return RuleCPConv, fmt.Sprintf("this model's short-convolution layers (lfm2_moe) read the tokens just before each one, across the boundaries of the %d context chunks, which is not implemented; use context_parallel_size 1", 2*l.CP)
	}
	if l.CP > 1 && seqLen > 0 && seqLen%(2*l.CP) != 0 {
		return RuleCPSeq, fmt.Sprintf("context_parallel_size %d splits each sequence into %d equal chunks, so the sequence length %d must be a multiple of %d", l.CP, 2*l.CP, seqLen, 2*l.CP)
	}
	if l.EP > 1 {
		if !m.MoE() {
			return RuleEPExperts, fmt.Sprintf("expert_parallel_size %d needs a mixture-of-experts model; this one has no experts", l.EP)
		}
		if m.Experts%l.EP != 0 {
			return RuleEPExperts, fmt.Sprintf("expert_parallel_size %d must divide the %d experts", l.EP, m.Experts)
		}
		if (l.DP*l.CP)%l.EP != 0 {
			return RuleEPExperts, fmt.Sprintf("expert_parallel_size %d must divide dp × cp = %d (experts are spread over the data ranks)", l.EP, l.DP*l.CP)
		}
	}
	if l.ETP > 1 {
		if !m.MoE() {
			return RuleETP, fmt.Sprintf("expert_tensor_parallel_size %d needs a mixture-of-experts model", l.ETP)
		}
		if l.ETP != l.TP {
			return RuleETP, fmt.Sprintf("expert_tensor_parallel_size %d must be 1 or equal tensor_parallel_size %d", l.ETP, l.TP)
		}
		if m.SharedExpert > 0 {
			return RuleETP, fmt.Sprintf("expert_tensor_parallel_size %d would split the routed experts but not this model's shared experts, which is not implemented; use expert_tensor_parallel_size 1", l.ETP)
		}
		if m.ExpertIntermediate%l.ETP != 0 {
			return RuleETP, fmt.Sprintf("expert_tensor_parallel_size %d must divide the expert width %d (moe_intermediate_size)", l.ETP, m.ExpertIntermediate)
		}
	}
	return supported(l, m)
}

// supported is the support matrix (see the package doc).
func supported(l Layout, m ModelShape) (rule, detail string) {
	if m.MoE() && l.CP > 1 {
		return RuleSupport, "context parallelism of mixture-of-experts models is not supported: the router's load-balancing loss is defined over whole sequences"
	}
	return "", ""
}

// Suggest returns the valid layout on n devices closest to l: same FSDP choice, degrees as near
// as possible to the requested ones (in factors of two). Pure data parallelism (dp=n) always
// qualifies, so a suggestion always exists.
func Suggest(l Layout, n int, m ModelShape, seqLen int) Layout {
	l = l.Norm(n)
	best := Layout{DP: max(n, 1), FSDP: l.FSDP, TP: 1, CP: 1, EP: 1, ETP: 1}
	bestD := math.Inf(1)
	dist := func(a, b int) float64 { return math.Abs(math.Log2(float64(one(a))) - math.Log2(float64(one(b)))) }
	for tp := 1; tp <= n; tp++ {
		for cp := 1; tp*cp <= n; cp++ {
			if n%(tp*cp) != 0 {
				continue
			}
			for _, etp := range []int{1, tp} {
				for ep := 1; ep <= n; ep++ {
					c := Layout{DP: n / (tp * cp), FSDP: l.FSDP, TP: tp, CP: cp, EP: ep, ETP: etp}
					if r, _ := firstBroken(c, n, m, seqLen); r != "" {
						continue
					}
					d := 2*dist(c.TP, l.TP) + 2*dist(c.CP, l.CP) + dist(c.EP, l.EP) + dist(c.ETP, l.ETP)
					if d < bestD {
						best, bestD = c, d
					}
				}
			}
		}
	}
	return best
}
