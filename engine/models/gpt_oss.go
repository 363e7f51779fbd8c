package models

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// gpt-oss (gpt_oss; structure: the gpt_oss family of engine/hf/config): Llama's pre-norm
// decoder with q/k/v/o biases, per-head attention sinks and alternating sliding and full
// layers, and in every layer gpt-oss's mixture of experts (nn.OSSMoE): a router with a bias,
// softmax over the top-k logits, experts with biases and the clamped SwiGLU, held in the
// checkpoint's own layout (mlp.experts.gate_up_proj [E,C,2I] with gate and up interleaved,
// gate_up_proj_bias [E,2I], down_proj [E,I,C], down_proj_bias [E,C]).
//
// The Hub checkpoints store the experts' weights in MXFP4 (gate_up_proj_blocks and _scales,
// down_proj_blocks and _scales): Load dequantises them (withMXFP4) and Save writes the plain
// tensors, without the quantization_config.
//
// Layouts: data parallelism and FSDP. Tensor and expert parallelism are refused by
// engine/mesh (rule expert-bias): the transposed experts with biases have no split; context
// parallelism of MoE models is refused there too. output_router_logits (the load-balancing
// loss) is refused by ArchFromConfig for this block.
func init() {
	Register(&Family{
		ModelType: "gpt_oss",
		Caps:      Caps{SlidingWindow: true, TiedEmbeddings: true},
		FFN:       ossFFN{},
		Placements: decoderPlacements([]Placement{
			{Module: "model.layers.*.self_attn", Split: Column}, // sinks [NH], by heads
			{Module: "model.layers.*.mlp.router", Split: Replicated},
			{Module: "model.layers.*.mlp.experts", Split: Replicated},
		}),
	})
}

// The clamped SwiGLU's gain and clamp. transformers' GptOssExperts applies these constants
// and never reads the config's swiglu_alpha or swiglu_limit, so a checkpoint computes here
// what it computes there whatever those keys hold (they are read and written back only).
const (
	ossSwigluAlpha = 1.702
	ossSwigluLimit = 7.0
)

// ossFFN builds nn.OSSMoE in every layer.
type ossFFN struct{}

// Specs implements FFNHooks.
func (ossFFN) Specs(a *Arch, i int) []ParamSpec {
	e, c, in := a.Experts, a.Hidden, a.ExpertIntermediate
	pre := layerName(i, "mlp.")
	// Biases of ndim 2 decay, as every ndim >= 2 parameter does.
	zeros := func(name string, shape ...int) ParamSpec {
		return ParamSpec{Name: name, Shape: shape, Decay: len(shape) >= 2, Init: InitZeros, ZeroRow: -1}
	}
	return []ParamSpec{
		matrix(pre+"router.weight", e, c),
		{Name: pre + "router.bias", Shape: []int{e}, Init: InitNormal, ZeroRow: -1},
		{Name: pre + "experts.gate_up_proj", Shape: []int{e, c, 2 * in}, Decay: true, Init: InitNormal, ZeroRow: -1},
		zeros(pre+"experts.gate_up_proj_bias", e, 2*in),
		{Name: pre + "experts.down_proj", Shape: []int{e, in, c}, Decay: true, Init: InitNormal, ZeroRow: -1},
		zeros(pre+"experts.down_proj_bias", e, c),
	}
}

// Build implements FFNHooks.
func (ossFFN) Build(a *Arch, i int, param, grad func(string) tensor.Tensor) nn.FFN {
	pre := layerName(i, "mlp.")
	return &nn.OSSMoE{
		Name: pre + "experts",
		Router: nn.Linear{Name: pre + "router", W: param(pre + "router.weight"), B: param(pre + "router.bias"),
			GW: grad(pre + "router.weight"), GB: grad(pre + "router.bias")},
		GateUp: param(pre + "experts.gate_up_proj"), GateUpBias: param(pre + "experts.gate_up_proj_bias"),
		Down: param(pre + "experts.down_proj"), DownBias: param(pre + "experts.down_proj_bias"),
		GGateUp: grad(pre + "experts.gate_up_proj"), GGateUpBias: grad(pre + "experts.gate_up_proj_bias"),
		GDown: grad(pre + "experts.down_proj"), GDownBias: grad(pre + "experts.down_proj_bias"),
		TopK: a.TopK, Alpha: ossSwigluAlpha, Limit: ossSwigluLimit,
	}
}

// mxfp4Name matches the MXFP4 halves of a gpt-oss expert tensor.
var mxfp4Name = regexp.MustCompile(`^(model\.layers\.\d+\.mlp\.experts\.(?:gate_up_proj|down_proj))_(blocks|scales)$`)

// fp4Values are the 16 values of an FP4 (E2M1) code.
var fp4Values = [16]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4, -6}

// DequantMXFP4 turns an MXFP4 tensor into its values, as transformers' mxfp4 integration
// does for gpt-oss: blocks [..., R, G, 16] bytes hold two FP4 codes each (low nibble first,
// 32 values per group of G), scales [..., R, G] the groups' power-of-two exponents biased by
// 127. The values [..., R, G*32] are returned transposed in their last two dimensions, [...,
// G*32, R] (gpt-oss stores the experts [in, out]), in float32 (exact: FP4 values times powers
// of two).
func DequantMXFP4(blocks []byte, blockShape []int, scales []byte, scaleShape []int) ([]float32, []int, error) {
	nd := len(blockShape)
	if nd < 3 || blockShape[nd-1] != 16 || !slices.Equal(blockShape[:nd-1], scaleShape) {
		return nil, nil, fmt.Errorf("models: MXFP4 blocks %v and scales %v: want blocks [..., R, G, 16] and scales [..., R, G]", blockShape, scaleShape)
	}
	r, g := blockShape[nd-3], blockShape[nd-2]
	outer := 1
	for _, d := range blockShape[:nd-3] {
		outer *= d
	}
	cols := g * 32
	if len(blocks) != outer*r*g*16 || len(scales) != outer*r*g {
		return nil, nil, fmt.Errorf("models: MXFP4 blocks hold %d bytes and scales %d for shape %v", len(blocks), len(scales), blockShape)
	}
	out := make([]float32, outer*r*cols)
	for o := 0; o < outer; o++ {
		for row := 0; row < r; row++ {
			for gi := 0; gi < g; gi++ {
				sc := float32(math.Ldexp(1, int(scales[(o*r+row)*g+gi])-127))
				blk := blocks[((o*r+row)*g+gi)*16:][:16]
				for b, v := range blk {
					col := gi*32 + 2*b
					// transposed: element (col, row) of the [cols, r] matrix o
					out[o*cols*r+col*r+row] = fp4Values[v&0x0f] * sc
					out[o*cols*r+(col+1)*r+row] = fp4Values[v>>4] * sc
				}
			}
		}
	}
	shape := append(slices.Clone(blockShape[:nd-3]), cols, r)
	return out, shape, nil
}

// mxfp4Source presents the MXFP4 expert tensors of a Hub gpt-oss checkpoint under their
// plain names, dequantised to bf16 when Tensor asks for them (one at a time: the loader
// uploads each before asking for the next).
type mxfp4Source struct {
	safetensors.Source
	names  []string
	plain  map[string]bool
	hidden map[string]bool
}

// withMXFP4 wraps src when it holds MXFP4 expert tensors; otherwise it returns src.
func withMXFP4(src safetensors.Source) safetensors.Source {
	ms := &mxfp4Source{Source: src, plain: map[string]bool{}, hidden: map[string]bool{}}
	for _, n := range src.Names() {
		if sm := mxfp4Name.FindStringSubmatch(n); sm != nil {
			if _, ok := src.Tensor(sm[1] + "_blocks"); !ok {
				continue
			}
			if _, ok := src.Tensor(sm[1] + "_scales"); !ok {
				continue
			}
			ms.plain[sm[1]], ms.hidden[n] = true, true
		}
	}
	if len(ms.plain) == 0 {
		return src
	}
	for _, n := range src.Names() {
		if !ms.hidden[n] {
			ms.names = append(ms.names, n)
		}
	}
	for n := range ms.plain {
		ms.names = append(ms.names, n)
	}
	slices.Sort(ms.names)
	return ms
}

// Names implements safetensors.Source.
func (ms *mxfp4Source) Names() []string { return slices.Clone(ms.names) }

// Tensor implements safetensors.Source.
func (ms *mxfp4Source) Tensor(name string) (safetensors.TensorInfo, bool) {
	if !ms.plain[name] {
		if ms.hidden[name] {
			return safetensors.TensorInfo{}, false
		}
		return ms.Source.Tensor(name)
	}
	b, _ := ms.Source.Tensor(name + "_blocks")
	s, _ := ms.Source.Tensor(name + "_scales")
	if b.DType != safetensors.U8 || s.DType != safetensors.U8 {
		return safetensors.TensorInfo{}, false
	}
	vals, shape, err := DequantMXFP4(b.Data, b.Shape, s.Data, s.Shape)
	if err != nil {
		return safetensors.TensorInfo{}, false
	}
	raw, err := tensor.EncodeFloat32(tensor.BF16, vals)
	if err != nil {
		return safetensors.TensorInfo{}, false
	}
	return safetensors.TensorInfo{Name: name, DType: safetensors.BF16, Shape: shape, Data: raw, File: b.File}, true
}

// ossConfigCheck refuses what the gpt_oss model does not implement.
func ossConfigCheck(c *config.Config) error {
	if c.ModelType != "gpt_oss" {
		return nil
	}
	if c.OutputRouterLogits {
		return fmt.Errorf("models: gpt_oss: output_router_logits (the load-balancing loss) is not implemented for its expert block; set it to false")
	}
	if raw, ok := c.Extra("quantization_config"); ok && !strings.Contains(string(raw), `"mxfp4"`) {
		return fmt.Errorf("models: gpt_oss: quantization_config %s is not supported (MXFP4 checkpoints are dequantised on load)", raw)
	}
	return nil
}
