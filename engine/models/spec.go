package models

import (
	"fmt"
	"strings"

	"github.com/halo-shell/halo-shell/engine/hf/config"
)

// Init says how InitRandom fills a parameter, following transformers' _init_weights.
type Init uint8

const (
	// InitNormal draws from normal(0, initializer_range) (linear weights, embeddings).
	InitNormal Init = iota
	// InitOnes fills with 1 (RMSNorm weights).
	InitOnes
	// InitZeros fills with 0 (biases).
	InitZeros
	// InitUnit fills with 1 whatever the family's NormOffset (the gated norm and dt_bias of
	// gated delta-net layers, whose RMSNorm has no 1 + w offset).
	InitUnit
	// InitLogUniform draws log(u), u uniform in (0, 16] (A_log of gated delta-net layers).
	InitLogUniform
)

func (i Init) String() string {
	switch i {
	case InitNormal:
		return "normal"
	case InitOnes:
		return "ones"
	case InitZeros:
		return "zeros"
	case InitUnit:
		return "unit"
	case InitLogUniform:
		return "log-uniform"
	}
	return fmt.Sprintf("Init(%d)", uint8(i))
}

// ParamSpec describes one trainable parameter. The model's []ParamSpec is the single source from
// which the parameter arena, the gradient arena, optimizer state and checkpoints are laid out.
type ParamSpec struct {
	// Name is the Hugging Face parameter name (the safetensors key), e.g.
	// "model.layers.0.self_attn.q_proj.weight".
	Name string
	// Shape is the parameter shape in the HF layout (linear weights are [out, in]).
	Shape []int
	// Decay is true when weight decay applies: matrices (ndim >= 2); false for 1-D norm weights
	// and biases.
	Decay bool
	// Init is how InitRandom fills it.
	Init Init
	// ZeroRow, when >= 0, is a row InitRandom zeroes after drawing (the embedding row of
	// pad_token_id, as nn.Embedding(padding_idx) does). -1 when none.
	ZeroRow int
}

// Numel is the number of elements.
func (p ParamSpec) Numel() int {
	n := 1
	for _, d := range p.Shape {
		n *= d
	}
	return n
}

func (p ParamSpec) String() string {
	dims := make([]string, len(p.Shape))
	for i, d := range p.Shape {
		dims[i] = fmt.Sprint(d)
	}
	return fmt.Sprintf("%s [%s] decay=%v init=%s", p.Name, strings.Join(dims, " "), p.Decay, p.Init)
}

func matrix(name string, rows, cols int) ParamSpec {
	return ParamSpec{Name: name, Shape: []int{rows, cols}, Decay: true, Init: InitNormal, ZeroRow: -1}
}

func normWeight(name string, n int) ParamSpec {
	return ParamSpec{Name: name, Shape: []int{n}, Init: InitOnes, ZeroRow: -1}
}

func bias(name string, n int) ParamSpec {
	return ParamSpec{Name: name, Shape: []int{n}, Init: InitZeros, ZeroRow: -1}
}

// Weight names of the Llama-style decoder shared by every dense family.
const (
	nameEmbed     = "model.embed_tokens.weight"
	nameFinalNorm = "model.norm.weight"
	// layerScalarName is Gemma 4's per-layer output scale (under model.layers.<i>.).
	layerScalarName = "layer_scalar"
	nameLMHead      = "lm_head.weight"
	nameLMHeadBias  = "lm_head.bias"
	nameScore       = "score.weight"
)

// layerName returns "model.layers.<i>.<suffix>".
func layerName(i int, suffix string) string {
	return fmt.Sprintf("model.layers.%d.%s", i, suffix)
}

// attentionSpecs lists the attention parameters of layer i, in transformers' state_dict order.
func attentionSpecs(a *Arch, i int) []ParamSpec {
	q, kv := a.Heads*a.HeadDim, a.KVHeads*a.HeadDim
	qOut := q
	if a.AttnOutputGate {
		qOut = 2 * q // each head's queries, then its output gate
	}
	var s []ParamSpec
	if a.FusedQKV {
		// phi3: one qkv_proj [q+2kv, C], rows q then k then v.
		s = append(s, matrix(layerName(i, "self_attn.qkv_proj.weight"), q+2*kv, a.Hidden))
		if a.QKVBias {
			s = append(s, bias(layerName(i, "self_attn.qkv_proj.bias"), q+2*kv))
		}
	}
	for _, p := range []struct {
		name string
		out  int
	}{{"q_proj", qOut}, {"k_proj", kv}, {"v_proj", kv}} {
		if a.FusedQKV {
			break
		}
		s = append(s, matrix(layerName(i, "self_attn."+p.name+".weight"), p.out, a.Hidden))
		if a.QKVBias {
			s = append(s, bias(layerName(i, "self_attn."+p.name+".bias"), p.out))
		}
	}
	s = append(s, matrix(layerName(i, "self_attn.o_proj.weight"), a.Hidden, q))
	if a.OBias {
		s = append(s, bias(layerName(i, "self_attn.o_proj.bias"), a.Hidden))
	}
	if a.Sinks {
		// Normal like a weight, without decay (1-D).
		s = append(s, ParamSpec{Name: layerName(i, "self_attn.sinks"), Shape: []int{a.Heads}, Init: InitNormal, ZeroRow: -1})
	}
	qn, kn := a.qkNormNames()
	switch a.QKNorm {
	case config.QKNormProjection:
		s = append(s, normWeight(layerName(i, "self_attn."+qn+".weight"), q),
			normWeight(layerName(i, "self_attn."+kn+".weight"), kv))
	case config.QKNormPerHead:
		s = append(s, normWeight(layerName(i, "self_attn."+qn+".weight"), a.HeadDim),
			normWeight(layerName(i, "self_attn."+kn+".weight"), a.HeadDim))
	}
	if a.HeadGate {
		// laguna's per-head output gate, after the norms as transformers lists it.
		s = append(s, matrix(layerName(i, "self_attn.g_proj.weight"), a.Heads, a.Hidden))
	}
	return s
}

// mlpSpecs lists the SwiGLU MLP parameters of layer i.
func mlpSpecs(a *Arch, i int) []ParamSpec {
	if a.FusedGateUp {
		// phi3, glm4: one gate_up_proj [2F, C], gate rows then up rows.
		return []ParamSpec{matrix(layerName(i, "mlp.gate_up_proj.weight"), 2*a.Intermediate, a.Hidden),
			matrix(layerName(i, "mlp.down_proj.weight"), a.Hidden, a.Intermediate)}
	}
	var s []ParamSpec
	for _, p := range []struct {
		name    string
		out, in int
	}{{"gate_proj", a.Intermediate, a.Hidden}, {"up_proj", a.Intermediate, a.Hidden}, {"down_proj", a.Hidden, a.Intermediate}} {
		s = append(s, matrix(layerName(i, "mlp."+p.name+".weight"), p.out, p.in))
		if a.MLPBias {
			s = append(s, bias(layerName(i, "mlp."+p.name+".bias"), p.out))
		}
	}
	return s
}

// layerNormSpecs lists the RMSNorm weights of layer i (layerNormNames).
func layerNormSpecs(f *Family, a *Arch, i int) []ParamSpec {
	var s []ParamSpec
	for _, n := range f.normNames(a.Norms) {
		s = append(s, normSpecs(a, layerName(i, n))...)
	}
	return s
}

// normSpecs lists the parameters of the norm module: its weight, and its bias where the
// family's norms are LayerNorms (config.Family.LayerNorm).
func normSpecs(a *Arch, module string) []ParamSpec {
	s := []ParamSpec{normWeight(module+".weight", a.Hidden)}
	if a.layerNorm() {
		s = append(s, bias(module+".bias", a.Hidden))
	}
	return s
}

// layerNorm reports whether the model's norms are LayerNorms with a bias (phimoe).
func (a *Arch) layerNorm() bool { return a.NormBias }

// lmHeadBias reports whether lm_head carries a bias (lm_head_bias).
func (a *Arch) lmHeadBias() bool { return a.HeadBias && a.NumLabels == 0 }

// layerNormRoles names the modules of a layer's RMSNorms: the pre-attention norm, the
// pre-feed-forward norm, the attention output norm and the feed-forward output norm, where
// they exist ("" where not), in that order.
func layerNormRoles(n config.LayerNorms) (preAttn, preFFN, postAttn, postFFN string) {
	switch n {
	case config.PostNorms:
		return "", "", "post_attention_layernorm", "post_feedforward_layernorm"
	case config.SandwichNorms:
		return "input_layernorm", "post_attention_layernorm", "post_self_attn_layernorm", "post_mlp_layernorm"
	case config.ParallelNorm:
		// One norm feeds both branches (cohere2_moe).
		return "input_layernorm", "", "", ""
	}
	return "input_layernorm", "post_attention_layernorm", "", ""
}

// layerNormNames lists the norms layerNormRoles names, in transformers' state_dict order.
func layerNormNames(n config.LayerNorms) []string {
	var out []string
	pa, pf, qa, qf := layerNormRoles(n)
	for _, s := range []string{pa, pf, qa, qf} {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// specsFor is the parameter table of family f (nil: dense), in transformers' state_dict order
// (also the arena order and the order tensors are written to a checkpoint): dense, with
// feed-forward blocks replaced where the family's FFN hooks say so. Mixture-of-experts layers
// list their experts' gate and up weights before all their down weights (moeFFN), so that the
// arena holds them as the stacked tensors of the grouped GEMMs.
func specsFor(f *Family, a *Arch) []ParamSpec {
	if f != nil && f.Host != nil {
		return f.Host.specs(a)
	}
	emb := matrix(nameEmbed, a.Vocab, a.Hidden)
	if a.PadID >= 0 && a.PadID < a.Vocab {
		emb.ZeroRow = a.PadID
	}
	s := []ParamSpec{emb}
	for i := 0; i < a.Layers; i++ {
		var mix []ParamSpec
		if f != nil && f.Mixer != nil {
			mix = f.Mixer.Specs(a, i)
		}
		switch {
		case mix != nil:
			s = append(s, mix...)
		case a.Latent.KVRank > 0:
			s = append(s, latentSpecs(a, i)...)
		case a.IsLinear(i):
			s = append(s, linearSpecs(f, a, i)...)
		default:
			s = append(s, attentionSpecs(a, i)...)
		}
		var ffn []ParamSpec
		if f != nil && f.FFN != nil {
			ffn = f.FFN.Specs(a, i)
		}
		if ffn == nil {
			ffn = mlpSpecs(a, i)
		}
		s = append(s, ffn...)
		s = append(s, layerNormSpecs(f, a, i)...)
		if f != nil && f.LayerScalar {
			// A buffer of ones in transformers: no decay, and no gradient ever reaches it.
			s = append(s, ParamSpec{Name: layerName(i, layerScalarName), Shape: []int{1}, Init: InitOnes, ZeroRow: -1})
		}
		if f != nil && f.LayerTail != nil {
			s = append(s, f.LayerTail(a, i)...)
		}
	}
	s = append(s, normSpecs(a, f.finalNorm())...)
	if f != nil && f.ModelTail != nil {
		s = append(s, f.ModelTail(a)...)
	}
	switch {
	case a.NumLabels > 0:
		s = append(s, matrix(nameScore, a.NumLabels, a.Hidden))
	case !a.Tied:
		s = append(s, matrix(nameLMHead, a.Vocab, a.Hidden))
	}
	if a.lmHeadBias() {
		s = append(s, bias(nameLMHeadBias, a.Vocab))
	}
	if f != nil && f.NormOffset != 0 {
		// The norms multiply by NormOffset + w: transformers starts w at zero (Gemma).
		for i := range s {
			if s[i].Init == InitOnes {
				s[i].Init = InitZeros
			}
		}
	}
	return s
}
