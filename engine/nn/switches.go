package nn

import "github.com/halo-shell/halo-shell/internal/switches"

// swMoEPath chooses how MoE blocks run where both paths can.
var swMoEPath = switches.Register(switches.Switch{Name: "HALO_MOE_PATH", Kind: switches.Tuning,
	Default: "device", Values: []string{"device", "composed"},
	Doc: "How MoE blocks (MoE, and Gemma 4's MoE beside the MLP) run where the backend has the MoE ops and grouped GEMM: device (routing, sort, grouped expert GEMMs and combine on the device) or composed (host routing, one GEMM per expert; the reference)."})

// swMoEOutputs chooses whether the device path of a MoE block keeps its experts' outputs for
// the backward.
var swMoEOutputs = switches.Register(switches.Switch{Name: "HALO_MOE_EXPERT_OUTPUTS", Kind: switches.Tuning,
	Default: "recompute", Values: []string{"keep", "recompute"},
	Doc: "What the device path of a MoE block (experts held on the device, no expert parallelism) does with the experts' outputs ys [S,C] for the combine's weight gradient: recompute (not kept, K*C activation elements per token and layer fewer; the backward runs the down projection's input gradient on the unweighted output gradient and takes the weights' gradient as its row dot product with the SwiGLU (Gemma 4: GeGLU) output, five more small ops per layer, no GEMM) or keep (held from the forward; the combine's backward reads them)."})

// swAttnQK chooses whether attention with q/k norms keeps its normed and rotated queries and
// keys for the backward.
var swAttnQK = switches.Register(switches.Switch{Name: "HALO_ATTN_QK", Kind: switches.Tuning,
	Default: "recompute", Values: []string{"recompute", "keep"},
	Doc: "What a training forward of attention with q/k norms (qwen3, qwen3_moe, olmo2, ...) holds for the backward besides the pre-norm queries and keys: recompute (not the normed and rotated ones: the backward makes them again with the norms' forward and RoPE, (heads + kv heads) x head_dim activation elements per token and layer fewer) or keep (both)."})

// AttentionRemakesQK reports whether attention with q/k norms remakes its normed and rotated
// queries and keys in the backward rather than keeping them (HALO_ATTN_QK=recompute).
func AttentionRemakesQK() bool { return swAttnQK.Is("recompute") }

// swDSV4Path chooses where deepseek_v4's decoder runs.
var swDSV4Path = switches.Register(switches.Switch{Name: "HALO_DSV4_PATH", Kind: switches.Tuning,
	Default: "auto", Values: []string{"auto", "host", "device"},
	Doc: "Where deepseek_v4's decoder runs: auto (through the backend's ops, DSV4Device, on a backend other than the CPU that has DeepSeek-V4's ops; on the float64 host tape, DSV4, on the CPU backend), host (the host tape everywhere: parameters downloaded each pass) or device (the backend's ops, the CPU backend's too)."})

// DSV4OnDevice reports whether deepseek_v4's decoder runs through the ops of the backend
// named (DSV4Device) rather than on the host tape, given whether it has DeepSeek-V4's ops.
func DSV4OnDevice(backendName string, hasOps bool) bool {
	switch swDSV4Path.Value() {
	case "host":
		return false
	case "device":
		return hasOps
	}
	return hasOps && backendName != "cpu"
}

// swDSV4Attention chooses how deepseek_v4's device decoder computes its sink attention.
var swDSV4Attention = switches.Register(switches.Switch{Name: "HALO_DSV4_ATTENTION", Kind: switches.Tuning,
	Default: "auto", Values: []string{"auto", "fused", "dense"},
	Doc: "How deepseek_v4's device decoder (HALO_DSV4_PATH) computes sink attention: fused (the SinkAttention op over the visible keys only, no score matrix), dense (the query heads as rows of two matrix products, scale·Q·KVᵀ and P·KV, around the SinkSoftmax op: tensor cores, with an F32 score and a probability matrix of [tokens·heads, keys] for the time of one layer's forward or backward) or auto (dense on a backend other than the CPU, fused on the CPU)."})

// DSV4DenseAttention reports whether deepseek_v4's device decoder composes its sink attention
// from matrix products on the backend named (HALO_DSV4_ATTENTION).
func DSV4DenseAttention(backendName string) bool {
	switch swDSV4Attention.Value() {
	case "fused":
		return false
	case "dense":
		return true
	}
	return backendName != "cpu"
}
