package models

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/nn"
)

// dsv4Renames map the names of DeepSeek-V4's own checkpoints (the Hub's release: attn / ffn,
// wq_a / wkv / wo_a, hc_attn_fn, ape, gate.bias ...) to transformers' module names, in the
// order transformers 5.17 applies them (its conversion mapping for deepseek_v4). A name
// already in transformers' form passes through unchanged.
var dsv4Renames = []struct {
	re  *regexp.Regexp
	out string
}{
	{regexp.MustCompile(`^embed\.weight$`), "embed_tokens.weight"},
	{regexp.MustCompile(`^head\.weight$`), "lm_head.weight"},
	{regexp.MustCompile(`^hc_head_(fn|base|scale)$`), "hc_head.hc_$1"},
	{regexp.MustCompile(`^layers\.(\d+)\.attn_norm\.`), "layers.$1.input_layernorm."},
	{regexp.MustCompile(`^layers\.(\d+)\.ffn_norm\.`), "layers.$1.post_attention_layernorm."},
	{regexp.MustCompile(`^layers\.(\d+)\.hc_attn_(fn|base|scale)$`), "layers.$1.attn_hc.$2"},
	{regexp.MustCompile(`^layers\.(\d+)\.hc_ffn_(fn|base|scale)$`), "layers.$1.ffn_hc.$2"},
	{regexp.MustCompile(`^layers\.(\d+)\.attn\.`), "layers.$1.self_attn."},
	{regexp.MustCompile(`^layers\.(\d+)\.ffn\.`), "layers.$1.mlp."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.attn_sink$`), "layers.$1.self_attn.sinks"},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.indexer\.compressor\.norm\.`), "layers.$1.self_attn.compressor.indexer.kv_norm."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.indexer\.compressor\.ape$`), "layers.$1.self_attn.compressor.indexer.position_bias"},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.indexer\.compressor\.`), "layers.$1.self_attn.compressor.indexer."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.indexer\.weights_proj\.`), "layers.$1.self_attn.compressor.indexer.scorer.weights_proj."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.indexer\.`), "layers.$1.self_attn.compressor.indexer."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.compressor\.norm\.`), "layers.$1.self_attn.compressor.kv_norm."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.compressor\.ape$`), "layers.$1.self_attn.compressor.position_bias"},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.(.*?\.)?wq_a\.`), "layers.$1.self_attn.${2}q_a_proj."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.(.*?\.)?wq_b\.`), "layers.$1.self_attn.${2}q_b_proj."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.(.*?\.)?wkv\.`), "layers.$1.self_attn.${2}kv_proj."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.(.*?\.)?wgate\.`), "layers.$1.self_attn.${2}gate_proj."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.(.*?\.)?wo_a\.`), "layers.$1.self_attn.${2}o_a_proj."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.(.*?\.)?wo_b\.`), "layers.$1.self_attn.${2}o_b_proj."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.q_norm\.`), "layers.$1.self_attn.q_a_norm."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.norm\.`), "layers.$1.self_attn.kv_norm."},
	{regexp.MustCompile(`^layers\.(\d+)\.mlp\.gate\.bias$`), "layers.$1.mlp.gate.e_score_correction_bias"},
	{regexp.MustCompile(`^layers\.(\d+)\.mlp\.(shared_experts|experts\.\d+)\.w1\.`), "layers.$1.mlp.$2.gate_proj."},
	{regexp.MustCompile(`^layers\.(\d+)\.mlp\.(shared_experts|experts\.\d+)\.w2\.`), "layers.$1.mlp.$2.down_proj."},
	{regexp.MustCompile(`^layers\.(\d+)\.mlp\.(shared_experts|experts\.\d+)\.w3\.`), "layers.$1.mlp.$2.up_proj."},
}

// dsv4Name returns the transformers name of a DeepSeek-V4 checkpoint tensor (with or
// without the "model." prefix of the base model; lm_head.weight stays outside it).
func dsv4Name(disk string) string {
	n := strings.TrimPrefix(disk, "model.")
	if n == "lm_head.weight" {
		return n
	}
	for _, r := range dsv4Renames {
		n = r.re.ReplaceAllString(n, r.out)
	}
	if n == "lm_head.weight" {
		return n
	}
	return "model." + n
}

// DeepSeek-V4 (structure: the deepseek_v4 family of engine/hf/config) runs a decoder of its
// own: hyper-connection residual streams, shared-key-value attention with sinks and compressed
// entries, the lightning indexer, grouped output projection and hash- or score-routed
// clamped-SwiGLU experts are not Blocks. It runs through the backend's ops where the backend
// has DeepSeek-V4's (nn.DSV4Device, host_device.go), or on the float64 host tape (nn.DSV4), as
// HALO_DSV4_PATH says. Parameters live in the model's arenas as for every family
// (transformers' names: self_attn.q_a_proj, q_a_norm, q_b_proj, kv_proj, kv_norm, o_a_proj,
// o_b_proj, sinks, compressor.*, compressor.indexer.*; mlp.gate, mlp.experts.X.{gate,up,down}_proj,
// mlp.shared_experts.*; attn_hc and ffn_hc; model.hc_head); checkpoints are read and written
// with DeepSeek's own names, as transformers saves them, and each hash layer's tid2eid table is
// a buffer kept beside the arenas. Generation re-runs each row's sequence per new token (no
// KV cache; host_generate.go).
//
// Refused: backends without DeepSeek-V4's ops other than the CPU, more than 8
// hyper-connection streams off the CPU, the length-dependent rope types (dynamic, longrope),
// LoRA, 4-bit bases and sequence classification; engine/mesh refuses every parallel layout
// but data parallelism and fsdp (rule host-decoder).
func init() {
	Register(&Family{
		ModelType:  "deepseek_v4",
		Caps:       Caps{SlidingWindow: true, TiedEmbeddings: true, RopeTypes: []string{"default", "linear", "llama3", "yarn"}, Reason: "(the host DeepSeek-V4 decoder tracks no sequence length for the length-dependent rope types)"},
		Host:       dsv4Decoder{},
		Placements: dsv4Placements(),
	})
}

// dsv4Placements places every weight whole: the host decoder has no tensor-parallel split.
func dsv4Placements() []Placement {
	ps := []Placement{
		{Module: "model.embed_tokens", Split: Replicated},
		{Module: "model.norm", Split: Replicated},
		{Module: "model.hc_head", Split: Replicated},
		{Module: "lm_head", Split: Replicated},
		{Module: "model.layers.*.self_attn", Split: Replicated}, // sinks
		{Module: "model.layers.*.attn_hc", Split: Replicated},
		{Module: "model.layers.*.ffn_hc", Split: Replicated},
		{Module: "model.layers.*.input_layernorm", Split: Replicated},
		{Module: "model.layers.*.post_attention_layernorm", Split: Replicated},
		{Module: "model.layers.*.mlp.gate", Split: Replicated},
		{Module: "model.layers.*.mlp.experts.*.gate_proj", Split: Replicated},
		{Module: "model.layers.*.mlp.experts.*.up_proj", Split: Replicated},
		{Module: "model.layers.*.mlp.experts.*.down_proj", Split: Replicated},
		{Module: "model.layers.*.mlp.shared_experts.gate_proj", Split: Replicated},
		{Module: "model.layers.*.mlp.shared_experts.up_proj", Split: Replicated},
		{Module: "model.layers.*.mlp.shared_experts.down_proj", Split: Replicated},
		{Module: "model.layers.*.self_attn.compressor", Split: Replicated}, // position_bias
		{Module: "model.layers.*.self_attn.compressor.indexer", Split: Replicated},
	}
	for _, m := range []string{"q_a_proj", "q_a_norm", "q_b_proj", "kv_proj", "kv_norm", "o_a_proj", "o_b_proj",
		"compressor.kv_proj", "compressor.gate_proj", "compressor.kv_norm",
		"compressor.indexer.kv_proj", "compressor.indexer.gate_proj", "compressor.indexer.kv_norm",
		"compressor.indexer.q_b_proj", "compressor.indexer.scorer.weights_proj"} {
		ps = append(ps, Placement{Module: "model.layers.*.self_attn." + m, Split: Replicated})
	}
	return ps
}

// dsv4Decoder is deepseek_v4's hostDecoder.
type dsv4Decoder struct{}

func (dsv4Decoder) specs(a *Arch) []ParamSpec {
	v, h, hc := a.V4, a.Hidden, a.V4.HC
	heads, hd, q := a.Heads, a.HeadDim, v.QRank
	emb := matrix(nameEmbed, a.Vocab, h)
	if a.PadID >= 0 && a.PadID < a.Vocab {
		emb.ZeroRow = a.PadID
	}
	s := []ParamSpec{emb}
	mix := (2 + hc) * hc
	for i := 0; i < a.Layers; i++ {
		sa := layerName(i, "self_attn.")
		s = append(s, bias(sa+"sinks", heads),
			matrix(sa+"q_a_proj.weight", q, h), normWeight(sa+"q_a_norm.weight", q),
			matrix(sa+"q_b_proj.weight", heads*hd, q),
			matrix(sa+"kv_proj.weight", hd, h), normWeight(sa+"kv_norm.weight", hd),
			matrix(sa+"o_a_proj.weight", v.OGroups*v.ORank, heads*hd/v.OGroups),
			matrix(sa+"o_b_proj.weight", h, v.OGroups*v.ORank))
		compressor := func(pre string, d, m int, overlap bool) {
			w := d
			if overlap {
				w = 2 * d
			}
			pb := matrix(pre+"position_bias", m, w)
			pb.Init = InitZeros
			s = append(s, pb, matrix(pre+"kv_proj.weight", w, h), matrix(pre+"gate_proj.weight", w, h),
				normWeight(pre+"kv_norm.weight", d))
		}
		switch v.LayerTypes[i] {
		case config.DSV4HCA:
			compressor(sa+"compressor.", hd, v.Rates[i], false)
		case config.DSV4CSA:
			compressor(sa+"compressor.", hd, v.Rates[i], true)
			ix := sa + "compressor.indexer."
			compressor(ix, v.IndexDim, v.Rates[i], true)
			s = append(s, matrix(ix+"q_b_proj.weight", v.IndexHeads*v.IndexDim, q),
				matrix(ix+"scorer.weights_proj.weight", v.IndexHeads, h))
		}
		mlp := layerName(i, "mlp.")
		s = append(s, matrix(mlp+"gate.weight", a.Experts, h))
		if !v.Hash[i] {
			s = append(s, bias(mlp+"gate."+scoreBiasName, a.Experts))
		}
		for x := a.HeldExperts.Lo; x < a.HeldExperts.Hi; x++ {
			ex := fmt.Sprintf("%sexperts.%d.", mlp, x)
			s = append(s, matrix(ex+"gate_proj.weight", a.ExpertIntermediate, h),
				matrix(ex+"up_proj.weight", a.ExpertIntermediate, h),
				matrix(ex+"down_proj.weight", h, a.ExpertIntermediate))
		}
		se := mlp + "shared_experts."
		for _, p := range []struct {
			name      string
			out, from int
		}{{"gate_proj", a.SharedExpert, h}, {"up_proj", a.SharedExpert, h}, {"down_proj", h, a.SharedExpert}} {
			s = append(s, matrix(se+p.name+".weight", p.out, p.from))
			if a.MLPBias {
				s = append(s, bias(se+p.name+".bias", p.out))
			}
		}
		s = append(s, normWeight(layerName(i, "input_layernorm.weight"), h), normWeight(layerName(i, "post_attention_layernorm.weight"), h))
		for _, hcName := range []string{"attn_hc", "ffn_hc"} {
			pre := layerName(i, hcName+".")
			s = append(s, matrix(pre+"fn", mix, hc*h), bias(pre+"base", mix), normWeight(pre+"scale", 3))
		}
	}
	s = append(s, normWeight(nameFinalNorm, h), matrix("model.hc_head.hc_fn", hc, hc*h),
		bias("model.hc_head.hc_base", hc), normWeight("model.hc_head.hc_scale", 1))
	switch {
	case a.NumLabels > 0:
		s = append(s, matrix(nameScore, a.NumLabels, h))
	case !a.Tied:
		s = append(s, matrix(nameLMHead, a.Vocab, h))
	}
	return s
}

// buffers are the hash layers' token-to-experts tables, tid2eid [V, TopK] (int64 in
// checkpoints; zeros until loaded, as transformers initialises them).
func (dsv4Decoder) buffers(a *Arch) []hostBuffer {
	var out []hostBuffer
	for i, hash := range a.V4.Hash {
		if hash {
			out = append(out, hostBuffer{name: layerName(i, "mlp.gate.tid2eid"), shape: []int{a.Vocab, a.TopK}})
		}
	}
	return out
}

func (dsv4Decoder) loadName(disk string) string { return dsv4Name(disk) }

// saveName is the inverse of dsv4Name: the name transformers 5.17's save_pretrained writes for
// a parameter (DeepSeek's own, under the base model's "model." prefix; head.weight for the LM
// head).
func (dsv4Decoder) saveName(name string) string { return dsv4DiskName(name) }

func (dsv4Decoder) check(a *Arch, b backend.Backend) error {
	if b.Name() != "cpu" && b.Optional().DSV4 == nil {
		return fmt.Errorf("models: deepseek_v4 needs DeepSeek-V4's ops (hyper-connections, compressors, the indexer, sink attention), which the %s backend does not have; use the CPU or CUDA backend", b.Name())
	}
	if b.Name() != "cpu" && a.V4.HC > 8 {
		return fmt.Errorf("models: deepseek_v4: hc_mult %d: the %s backend's DeepSeek-V4 ops take at most 8 hyper-connection streams (the CPU backend's host tape takes any)", a.V4.HC, b.Name())
	}
	if a.SlidingRope == nil {
		return errors.New("models: deepseek_v4: rope_parameters needs its main dictionary")
	}
	for _, r := range []struct {
		name string
		r    backend.RoPEConfig
	}{{"main", *a.SlidingRope}, {"compress", a.Rope}} {
		if r.r.DependsOnLength() {
			return fmt.Errorf("models: deepseek_v4: rope_parameters.%s.rope_type %q depends on the sequence length, which the host decoder does not track; use default, linear, llama3 or yarn", r.name, r.r.Type)
		}
		if _, _, err := dsv4Rope(r.r); err != nil {
			return fmt.Errorf("models: deepseek_v4: rope_parameters.%s: %w", r.name, err)
		}
	}
	return nil
}

// decoder builds the host decoder of m over the parameter leaves.
func (dsv4Decoder) decoder(m *Model, param func(string) *nn.HVar) (*nn.DSV4, error) {
	c := m.Arch.Config
	if c == nil {
		return nil, errors.New("models: deepseek_v4: the model was not built from a config.json")
	}
	v := m.Arch.V4
	cfg := nn.DSV4Config{Vocab: m.Arch.Vocab, Hidden: m.Arch.Hidden, Heads: m.Arch.Heads, HeadDim: m.Arch.HeadDim,
		QRank: v.QRank, OGroups: v.OGroups, ORank: v.ORank, Window: c.SlidingWindow,
		LayerTypes: v.LayerTypes, Rates: v.Rates, Experts: m.Arch.Experts, TopK: m.Arch.TopK,
		ExpertDim: m.Arch.ExpertIntermediate, SharedBias: m.Arch.MLPBias, RoutedScale: c.RoutedScalingFactor, SwigluLimit: c.SwigluLimit,
		HC: v.HC, HCIters: c.HCSinkhornIters, HCEps: c.HCEps, Eps: c.RMSNormEps,
		IndexHeads: v.IndexHeads, IndexDim: v.IndexDim, IndexTopK: c.IndexTopK,
	}
	var err error
	if cfg.MainInvFreq, cfg.MainScale, err = dsv4Rope(*m.Arch.SlidingRope); err != nil {
		return nil, fmt.Errorf("models: deepseek_v4: rope_parameters.main: %w", err)
	}
	if cfg.CompressInvFreq, cfg.CompressScale, err = dsv4Rope(m.Arch.Rope); err != nil {
		return nil, fmt.Errorf("models: deepseek_v4: rope_parameters.compress: %w", err)
	}
	for _, hash := range v.Hash {
		t := nn.DSV4RoutedMoE
		if hash {
			t = nn.DSV4HashMoE
		}
		cfg.MLPTypes = append(cfg.MLPTypes, t)
	}
	tid := make([][]int, len(v.Hash))
	for i, hash := range v.Hash {
		if !hash {
			continue
		}
		t := m.hostBufs[layerName(i, "mlp.gate.tid2eid")]
		tid[i] = make([]int, len(t))
		for j, e := range t {
			if e < 0 || int(e) >= m.Arch.Experts {
				return nil, fmt.Errorf("models: deepseek_v4: layer %d's tid2eid sends a token to expert %d of %d", i, e, m.Arch.Experts)
			}
			tid[i][j] = int(e)
		}
	}
	return &nn.DSV4{Cfg: cfg, Param: param, Tid2Eid: tid}, nil
}

// dsv4Rope is a rotary table as transformers' rope functions compute it: the default type in
// float32 as torch does, the others by backend.RoPEConfig.Compute; with the attention scaling
// that multiplies cos and sin.
func dsv4Rope(r backend.RoPEConfig) ([]float64, float64, error) {
	if r.Type == "" || r.Type == "default" {
		return nn.RopeInvFreq(r.Theta, r.RotaryDim()), 1, nil
	}
	inv, scale, err := r.Compute(0)
	if err != nil {
		return nil, 0, err
	}
	out := make([]float64, len(inv))
	for i, v := range inv {
		out[i] = float64(v)
	}
	return out, float64(scale), nil
}

// dsv4DiskLeaves are transformers' module names and DeepSeek's, for saveName: applied in
// order to a name without its "model." prefix.
var dsv4DiskLeaves = []struct{ from, to string }{
	{".self_attn.compressor.indexer.scorer.weights_proj.", ".attn.indexer.weights_proj."},
	{".self_attn.compressor.indexer.kv_norm.", ".attn.indexer.compressor.norm."},
	{".self_attn.compressor.indexer.position_bias", ".attn.indexer.compressor.ape"},
	{".self_attn.compressor.indexer.q_b_proj.", ".attn.indexer.wq_b."},
	{".self_attn.compressor.indexer.kv_proj.", ".attn.indexer.compressor.wkv."},
	{".self_attn.compressor.indexer.gate_proj.", ".attn.indexer.compressor.wgate."},
	{".self_attn.compressor.kv_norm.", ".attn.compressor.norm."},
	{".self_attn.compressor.position_bias", ".attn.compressor.ape"},
	{".self_attn.compressor.kv_proj.", ".attn.compressor.wkv."},
	{".self_attn.compressor.gate_proj.", ".attn.compressor.wgate."},
	{".self_attn.sinks", ".attn.attn_sink"},
	{".self_attn.q_a_norm.", ".attn.q_norm."},
	{".self_attn.kv_norm.", ".attn.norm."},
	{".self_attn.q_a_proj.", ".attn.wq_a."},
	{".self_attn.q_b_proj.", ".attn.wq_b."},
	{".self_attn.kv_proj.", ".attn.wkv."},
	{".self_attn.o_a_proj.", ".attn.wo_a."},
	{".self_attn.o_b_proj.", ".attn.wo_b."},
	{".input_layernorm.", ".attn_norm."},
	{".post_attention_layernorm.", ".ffn_norm."},
	{".attn_hc.", ".hc_attn_"},
	{".ffn_hc.", ".hc_ffn_"},
	{".mlp.gate." + scoreBiasName, ".ffn.gate.bias"},
	{".gate_proj.", ".w1."},
	{".down_proj.", ".w2."},
	{".up_proj.", ".w3."},
	{".mlp.", ".ffn."},
}

// dsv4DiskName is dsv4Decoder.saveName.
func dsv4DiskName(name string) string {
	if name == nameLMHead {
		return "head.weight"
	}
	n := name
	for _, r := range dsv4DiskLeaves {
		if i := strings.Index(n, r.from); i >= 0 {
			n = n[:i] + r.to + n[i+len(r.from):]
		}
	}
	return n
}
