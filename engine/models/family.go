package models

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Family declares what the model code adds to one Hugging Face family: what it supports, its
// tensor-parallel table, and the feed-forward block where it is not the dense SwiGLU MLP. The
// family's structure (which biases and q/k norms exist, which layers are MoE) is declared once,
// by the engine/hf/config family of the same model_type, and reaches the model through
// config.Shape. Each family lives in its own file and registers itself in init.
type Family struct {
	// ModelType is config.json's model_type ("llama", "qwen3", ...); an engine/hf/config
	// family of that name must exist.
	ModelType string
	// Architectures are the HF class names that load this family, set by Register from the
	// engine/hf/config family; the first one is written to config.json by Save.
	Architectures []string
	// Caps lists what the family supports; used to refuse configurations early.
	Caps Caps
	// FFN replaces the dense SwiGLU MLP of some layers (mixture-of-experts families). Nil means
	// every layer is dense.
	FFN FFNHooks
	// InterleavedRoPE: the family rotates the pairs (2i, 2i+1) of each head's rotary dims
	// (GLM's convention) instead of (i, i+R/2).
	InterleavedRoPE bool
	// QKNormAfterRoPE: the query and key norms apply to the rotated queries and keys
	// (HunYuan) instead of before RoPE.
	QKNormAfterRoPE bool
	// QKNormNames are the modules of the query and key norms under self_attn; the zero value
	// is q_norm and k_norm (HunYuan: query_layernorm, key_layernorm).
	QKNormNames [2]string
	// Placements is the family's tensor-parallel table: for each module that holds parameters,
	// how they are laid out over the tensor group and, for routed experts, over the expert
	// group. Every parameter of every model of the family matches exactly one entry (Place);
	// engine/parallel lays the weights out by it and checks it against the weight shapes.
	Placements []Placement
	// LayerNorms names each layer's RMSNorms (under model.layers.<i>.) by where they sit, for
	// a family whose names differ from those layerNormRoles gives its config arrangement
	// (Gemma's sandwich); the zero value keeps those.
	LayerNorms LayerNorms
	// NormOffset is added to every RMSNorm weight before it scales (Gemma: 1, the norm
	// multiplies by 1 + w and its weights start at zero); 0 for the Llama convention.
	NormOffset float32
	// LayerNormEps, when nonzero, is the epsilon of the decoder layers' pre-attention and
	// pre-feed-forward norms in place of the config's rms_norm_eps, which then applies to the
	// final norm only (JetMoE builds its layer norms with the module's default, 1e-6).
	LayerNormEps float32
	// ScaleEmbeddings multiplies the embedding rows by sqrt(hidden_size), rounded to the
	// parameter dtype (Gemma's scaled word embedding).
	ScaleEmbeddings bool
	// GatedDeltaNet is how the family stores the input projections of its gated delta-net
	// (linear attention) layers (qwen3_next.go); GDNNone for families without them.
	GatedDeltaNet GDNLayout
	// Mixer replaces the attention of some layers (gemma4_text's per-layer head widths,
	// lfm2_moe's short convolutions). Nil means the Llama attention everywhere.
	Mixer MixerHooks
	// FinalNorm is the final RMSNorm's module ("model.norm" when empty; lfm2_moe:
	// "model.embedding_norm").
	FinalNorm string
	// LayerScalar: each layer holds a layer_scalar buffer [1] that multiplies its output
	// (gemma4_text). It is a checkpoint tensor without a gradient.
	LayerScalar bool
	// LayerTail lists parameters layer i has after its norms and layer_scalar (Gemma 4's
	// per-layer input stage and MoE block), ModelTail those after the final norm (Gemma 4's
	// per-layer input embeddings); nil for none.
	LayerTail func(a *Arch, i int) []ParamSpec
	ModelTail func(a *Arch) []ParamSpec
	// Extend, when set, finishes the layers after the generic build: it may rewire blocks and
	// set the model's per-layer input stage (Gemma 4).
	Extend func(m *Model, b *binder)
	// Host, when set, runs the family's whole decoder on the host tape (host.go) instead of
	// the device blocks (deepseek_v4).
	Host hostDecoder
}

// MixerHooks let a family give a layer its own token mixer. Both hooks are called for every
// layer; nil specs and a nil block keep the default attention.
type MixerHooks interface {
	// Specs lists layer i's mixer parameters (HF names), or nil for the default attention.
	Specs(a *Arch, i int) []ParamSpec
	// Build makes layer i's mixer from the views b gives (nil: the default attention).
	Build(a *Arch, i int, b *binder) *nn.Attention
}

// binder hands a family's hooks the parameter and gradient views of a model being built.
type binder struct {
	// lin is the nn.Linear of a module (weight, optional bias and their gradients).
	lin func(module string) nn.Linear
	// norm is the RMSNorm of a module, with the family's offset and the model's epsilon.
	norm func(module string) nn.RMSNorm
	// param and grad look up a parameter and its gradient by HF name (the zero tensor when
	// absent).
	param, grad func(name string) tensor.Tensor
	// ones is a vector of n ones in the model dtype (not a parameter): the gain of a norm
	// without weights.
	ones func(n int) tensor.Tensor
}

// finalNorm is the final norm's module.
func (f *Family) finalNorm() string {
	if f != nil && f.FinalNorm != "" {
		return f.FinalNorm
	}
	return "model.norm"
}

// FFNHooks let a family give a layer its own feed-forward block. Both hooks are called for
// every layer; returning nil specs (Specs) and a nil block (Build) keeps the dense MLP.
type FFNHooks interface {
	// Specs lists layer i's feed-forward parameters (HF names), or nil for the dense MLP.
	Specs(a *Arch, i int) []ParamSpec
	// Build makes layer i's block from parameter and gradient views looked up by HF name
	// (a gradient lookup yields the zero tensor before gradients exist).
	Build(a *Arch, i int, param, grad func(name string) tensor.Tensor) nn.FFN
}

// Caps are the capabilities of a family. A false capability makes New refuse a config that
// needs it, with Reason naming why.
type Caps struct {
	// SlidingWindow: the family honours sliding_window / layer_types.
	SlidingWindow bool
	// TiedEmbeddings: lm_head may share the embedding matrix.
	TiedEmbeddings bool
	// RopeTypes, when set, are the only rope_type values the family's model implements.
	RopeTypes []string
	// Reason explains the family's limits in refusals (optional).
	Reason string
}

var (
	registryMu sync.RWMutex
	registry   = map[string]*Family{}
)

// Register adds a family. It panics on a duplicate model_type, a model_type engine/hf/config
// does not know, Architectures set by hand, or a malformed Placements table: programming
// errors in this package's init functions.
func Register(f *Family) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if f.ModelType == "" {
		panic("models: Register: family needs ModelType")
	}
	if _, dup := registry[f.ModelType]; dup {
		panic("models: Register: duplicate model_type " + f.ModelType)
	}
	cf, err := config.Lookup(f.ModelType)
	if err != nil {
		panic("models: Register: " + err.Error())
	}
	if f.Architectures != nil {
		panic("models: Register " + f.ModelType + ": Architectures come from the engine/hf/config family; do not set them")
	}
	f.Architectures = slices.Clone(cf.Architectures)
	checkPlacements(f.ModelType, f.Placements)
	registry[f.ModelType] = f
}

// Lookup returns the family registered for model_type, or an error listing the supported ones.
func Lookup(modelType string) (*Family, error) {
	registryMu.RLock()
	f, ok := registry[modelType]
	registryMu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("models: model_type %q is not supported; supported: %s",
			modelType, strings.Join(Families(), ", "))
	}
	return f, nil
}

// Families lists the registered model_type names, sorted.
func Families() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// LayerNorms are the names of a layer's RMSNorms by position: Input before attention, PostAttn
// on the attention output, PreFFN before the feed-forward block and PostFFN on its output. An
// empty name is a norm the layer does not have. The names are listed in the checkpoint in
// this order.
type LayerNorms struct {
	Input, PostAttn, PreFFN, PostFFN string
}

// gemmaNorms are Gemma's four: post_attention_layernorm normalises the attention output.
var gemmaNorms = LayerNorms{Input: "input_layernorm", PostAttn: "post_attention_layernorm",
	PreFFN: "pre_feedforward_layernorm", PostFFN: "post_feedforward_layernorm"}

// normRoles names the modules of a layer's RMSNorms (pre-attention, pre-feed-forward,
// attention output, feed-forward output; "" where absent): f's own LayerNorms when it has
// them, else the names layerNormRoles gives the config's arrangement n.
func (f *Family) normRoles(n config.LayerNorms) (preAttn, preFFN, postAttn, postFFN string) {
	if f != nil && f.LayerNorms != (LayerNorms{}) {
		l := f.LayerNorms
		return l.Input, l.PreFFN, l.PostAttn, l.PostFFN
	}
	return layerNormRoles(n)
}

// normNames lists a layer's norms in transformers' state_dict order.
func (f *Family) normNames(n config.LayerNorms) []string {
	if f == nil || f.LayerNorms == (LayerNorms{}) {
		return layerNormNames(n)
	}
	var out []string
	for _, s := range []string{f.LayerNorms.Input, f.LayerNorms.PostAttn, f.LayerNorms.PreFFN, f.LayerNorms.PostFFN} {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// layerNorm applies the family's LayerNormEps to a decoder layer's norm.
func (f *Family) layerNorm(n nn.RMSNorm) nn.RMSNorm {
	if f != nil && f.LayerNormEps != 0 {
		n.Eps = f.LayerNormEps
	}
	return n
}
