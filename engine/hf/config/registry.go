package config

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
)

// ErrUnsupportedModelType is returned (wrapped) for a model_type with no registered Family.
var ErrUnsupportedModelType = errors.New("unsupported model_type")

// Family declares one Hugging Face model family: its names, the config.json keys transformers
// 5.17 has for it, its defaults, its validation rules, and its presets. Each family lives in its
// own file and registers itself in init.
type Family struct {
	// ModelType is config.json's model_type.
	ModelType string
	// Architectures are the transformers model classes of the family; the first is the causal
	// LM class written by presets.
	Architectures []string
	// Keys are the family's own config keys (beyond model_type, architectures, dtype,
	// transformers_version and rope_parameters), which transformers 5.17 always writes.
	Keys []string
	// Optional are keys the family understands but transformers writes only when the source
	// had them or the value differs from the derived default (head_dim where it is not a
	// field).
	Optional []string
	// HeadDimNullWhenDerived: head_dim is a field that transformers leaves null when it equals
	// hidden_size / num_attention_heads and the file did not set it (mixtral).
	HeadDimNullWhenDerived bool
	// SlidingWindowZero: transformers writes an unused sliding_window as 0, not null
	// (qwen2_moe's __post_init__ sets it to 0 without use_sliding_window).
	SlidingWindowZero bool
	// HeadDimFloor: an absent head_dim is hidden_size // num_attention_heads even when the
	// heads do not divide the width (glm4_moe's attention takes getattr(config, "head_dim",
	// hidden_size // num_attention_heads)).
	HeadDimFloor bool
	// Aliases maps accepted input keys to the canonical key in Keys (qwen3_moe reads
	// num_experts as num_local_experts).
	Aliases map[string]string
	// DefaultRopeTheta is the rope_theta used when the file has none.
	DefaultRopeTheta float64
	// Defaults sets the family's defaults on a zero Config (transformers' class defaults).
	Defaults func(*Config)
	// Resolve derives values after the keys are read (transformers' __post_init__): e.g.
	// dropping sliding_window when use_sliding_window is false. May be nil.
	Resolve func(*Config)
	// Validate checks family-specific rules after the common ones. May be nil.
	Validate func(*Config) error
	// MoELayer reports whether layer i is a sparse MoE layer; nil for dense families.
	MoELayer func(c *Config, i int) bool
	// QKVBias and OProjBias say which attention projections carry biases; nil means
	// AttentionBias.
	QKVBias, OProjBias func(*Config) bool
	// QKNorm says whether and how queries and keys are RMS-normalised before RoPE.
	QKNorm QKNorm
	// QKNormOf, when set, decides QKNorm from the config (glm4_moe's use_qk_norm).
	QKNormOf func(*Config) QKNorm
	// Norms is where each layer's RMSNorms sit around attention and feed-forward.
	Norms LayerNorms
	// FusedQKV: q, k and v are one qkv_proj weight; FusedGateUp: the dense MLP's gate and up
	// are one gate_up_proj weight (phi3, glm4).
	FusedQKV, FusedGateUp bool
	// SharedExpert returns the width of the shared-expert SwiGLU MLP beside the routed experts
	// of every MoE layer (0: none) and whether a sigmoid gate scales it; nil means none.
	SharedExpert func(*Config) (width int, gated bool)
	// Sinks: every attention layer has learned per-head sink logits; ExpertBias: the router
	// and the routed experts carry biases (gpt_oss).
	Sinks, ExpertBias bool
	// MoA: every attention layer is JetMoE's mixture of attention heads: a router over the
	// experts, each expert's query and output projections for the key/value heads (one
	// tensor each over the experts), a bias on the output, one kv_proj for keys and values;
	// every MoE block also adds a bias to its output.
	MoA bool
	// RouterBiasParam: every MoE layer's router has a selection-only correction bias that
	// transformers holds as a parameter (ernie4_5_moe's moe_statics).
	RouterBiasParam bool
	// HeadGate: every attention layer scales each head's output by the softplus of its own
	// gate projection g_proj [heads, C] (laguna).
	HeadGate bool
	// RopePerLayerType: rope_parameters holds one set of parameters per layer type
	// ({"full_attention": {...}, "sliding_attention": {...}}; Config.Rope and
	// Config.SlidingRope), as gemma3_text writes it.
	RopePerLayerType bool
	// RopeTypeKeys name rope_parameters' two dictionaries under RopePerLayerType: the one read
	// into Rope, then the one read into SlidingRope; the zero value is full_attention and
	// sliding_attention (deepseek_v4 names them by rope type: compress and main).
	RopeTypeKeys [2]string
	// DefaultSlidingRopeTheta is SlidingRope's rope_theta when the file has none.
	DefaultSlidingRopeTheta float64
	// SlidingRopeThetaKey is the top-level key of 4.x files that holds the sliding layers'
	// rope_theta (gemma3_text: rope_local_base_freq, which transformers consumes); empty when
	// the family has none.
	SlidingRopeThetaKey string
	// WriteExtra, when set, adds the family's derived keys to what Write writes
	// (gemma4_text's per_layer_config).
	WriteExtra func(c *Config, out pyObject)
	// Consumed are keys the family reads that transformers folds into other keys on load and
	// does not write back (gemma4_text's global_head_dim and num_global_key_value_heads, which
	// become per_layer_config).
	Consumed []string
	// Kept are keys transformers keeps as plain attributes that the family's model never reads
	// (smollm3's Hub files carry Qwen2's max_window_layers and pretraining_tp): written back as
	// read, neither refused nor reported as not understood.
	Kept []string
	// LayerTypes are the layer_types values the family's layers take; nil means
	// full_attention and sliding_attention.
	LayerTypes []string
	// RopeKept are rope_parameters keys transformers keeps that the family's model does not
	// read (qwen3_5_moe_text's mrope_section and mrope_interleaved, which text positions make
	// no-ops): written back as read, neither refused nor reported as not understood.
	RopeKept []string
	// AttnOutputGate: q_proj also projects a per-head output gate (its rows alternate a head's
	// queries and its gate), and sigmoid(gate) scales the attention output before o_proj
	// (qwen3_next, qwen3_5_moe_text).
	AttnOutputGate bool
	// FieldTypes are the family's own types of keys that other families type differently
	// (gemma4_text: a nullable num_experts, a string use_bidirectional_attention); nil
	// means the package's field table.
	FieldTypes map[string]field
	// RouterBias, when set, says whether each MoE layer's router has a selection-only bias
	// [E] (a checkpoint buffer); nil means the families with n_group have one.
	RouterBias func(*Config) bool
	// SparseMixer: the MoE router is Phi-3.5-MoE's sparsemixer (two experts, chosen in two
	// stages; router_jitter_noise is its deterministic threshold, not noise).
	SparseMixer bool
	// LayerNorm: every norm is an nn.LayerNorm with a weight and a bias (its eps rms_norm_eps)
	// instead of an RMSNorm (phimoe).
	LayerNorm bool
	// CenterNorm, when set, says whether every norm subtracts its row's mean first: a LayerNorm
	// with a weight and no bias (cohere2_moe without rms_norm_eps). Its epsilon is RMSNormEps.
	CenterNorm func(*Config) bool
	// NormEps, when set, is the epsilon of the model's norms where it is not rms_norm_eps
	// (cohere2_moe: layer_norm_eps for its LayerNorms); see Config.NormEpsilon.
	NormEps func(*Config) float64
	// DenseIntermediate, when set, is the width of the dense layers' MLP where it is not
	// intermediate_size (cohere2_moe's prefix_dense_intermediate_size).
	DenseIntermediate func(*Config) int
	// RoPELayer, when set, says whether layer i rotates its queries and keys (cohere2_moe:
	// the sliding layers, and the dense ones under prefix_dense_sliding_window_pattern 1);
	// nil means every layer does but smollm3's NoPE layers.
	RoPELayer func(c *Config, i int) bool
	// RopeAttentionFactor, when set, is the factor the family's rotary embedding multiplies
	// cos and sin by in place of the rope type's (phimoe's short_mscale and long_mscale).
	RopeAttentionFactor func(*Config) float64
	// RopeShortFactorsOnly: under longrope the family's rotary embedding uses short_factor at
	// every length, never long_factor (phimoe in transformers 5).
	RopeShortFactorsOnly bool
	// Presets maps a preset name to a function that sets its values on a defaulted Config.
	Presets map[string]func(*Config)
}

// QKNorm is a family's RMSNorm on queries and keys.
type QKNorm int

const (
	// NoQKNorm: queries and keys are not normalised.
	NoQKNorm QKNorm = iota
	// QKNormPerHead: one RMSNorm of width head_dim shared by all heads (qwen3, qwen3_moe).
	QKNormPerHead
	// QKNormProjection: one RMSNorm over the whole q projection (heads*head_dim) and one over
	// the whole k projection (kv_heads*head_dim) (olmoe).
	QKNormProjection
)

// LayerNorms is the arrangement of a decoder layer's RMSNorms.
type LayerNorms int

const (
	// PreNorms: input_layernorm before attention and post_attention_layernorm before the
	// feed-forward block (Llama).
	PreNorms LayerNorms = iota
	// PostNorms: no norm on the blocks' inputs; post_attention_layernorm on the attention
	// output and post_feedforward_layernorm on the feed-forward output, before each residual
	// add (olmo2, olmo3).
	PostNorms
	// SandwichNorms: Llama's two pre-norms plus a norm on the attention output and one on the
	// feed-forward output (glm4: post_self_attn_layernorm and post_mlp_layernorm; gemma3_text:
	// post_attention_layernorm on the attention output, pre_feedforward_layernorm before the
	// MLP and post_feedforward_layernorm after it).
	SandwichNorms
	// ParallelNorm: one input_layernorm whose output feeds both the attention and the
	// feed-forward block, the two branches added to the residual together (cohere2_moe).
	ParallelNorm
)

// PerLayer is the number of hidden-width RMSNorm weights a layer has.
func (n LayerNorms) PerLayer() int {
	switch n {
	case SandwichNorms:
		return 4
	case ParallelNorm:
		return 1
	}
	return 2
}

var (
	registryMu sync.RWMutex
	registry   = map[string]*Family{}
)

// Register adds a family. It panics on a missing ModelType, a missing Defaults or a duplicate,
// which are programming errors in init functions.
func Register(f Family) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if f.ModelType == "" || f.Defaults == nil || len(f.Architectures) == 0 {
		panic("config: Register: a family needs ModelType, Architectures and Defaults")
	}
	if _, dup := registry[f.ModelType]; dup {
		panic("config: Register: duplicate model_type " + f.ModelType)
	}
	for _, k := range append(append(append([]string{}, f.Keys...), f.Optional...), f.Consumed...) {
		if _, ok := f.field(k); !ok {
			panic(fmt.Sprintf("config: Register %s: key %q has no field", f.ModelType, k))
		}
	}
	registry[f.ModelType] = &f
}

// Lookup returns the family registered for modelType, or an error wrapping
// ErrUnsupportedModelType that lists the supported ones.
func Lookup(modelType string) (*Family, error) {
	registryMu.RLock()
	f, ok := registry[modelType]
	registryMu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w %q; supported: %s", ErrUnsupportedModelType, modelType,
			strings.Join(Families(), ", "))
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

// familyForArchitecture finds the family whose Architectures contain arch.
func familyForArchitecture(arch string) *Family {
	registryMu.RLock()
	defer registryMu.RUnlock()
	for _, f := range registry {
		for _, a := range f.Architectures {
			if a == arch {
				return f
			}
		}
	}
	return nil
}

// knows reports whether key is one of the family's keys (canonical or alias).
func (f *Family) knows(key string) (canonical string, ok bool) {
	if c, ok := f.Aliases[key]; ok {
		return c, true
	}
	for _, k := range f.Keys {
		if k == key {
			return k, true
		}
	}
	for _, k := range f.Optional {
		if k == key {
			return k, true
		}
	}
	for _, k := range f.Consumed {
		if k == key {
			return k, true
		}
	}
	return "", false
}

// Synonyms returns the other config.json keys of family f that set the same field as key (its
// canonical name and its aliases), or nil when key is not one of the family's keys.
func (f *Family) Synonyms(key string) []string {
	canon, ok := f.knows(key)
	if !ok {
		return nil
	}
	var out []string
	if canon != key {
		out = append(out, canon)
	}
	for a, c := range f.Aliases {
		if c == canon && a != key {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	return out
}

// commonKeys are the keys this package reads for every family besides its Keys, Optional
// and Aliases.
var commonKeys = []string{"model_type", "architectures", "dtype", "torch_dtype", "transformers_version",
	"rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor"}

// Understands reports whether key is a config.json key that changes the model of family f:
// one of its Keys, Optional keys or Aliases, a key every family reads (model_type, dtype,
// rope_theta, ...) or one of transformers' PreTrainedConfig attributes. Other keys are kept
// in a config.json as transformers keeps them, but nothing reads them: a misspelt key is one.
func (f *Family) Understands(key string) bool {
	if _, ok := f.knows(key); ok || slices.Contains(commonKeys, key) {
		return true
	}
	if (f.SlidingRopeThetaKey != "" && key == f.SlidingRopeThetaKey) || slices.Contains(f.Kept, key) {
		return true
	}
	_, ok := baseDefaults[key]
	return ok
}

// KnownKeys lists the keys Understands accepts, sorted.
func (f *Family) KnownKeys() []string {
	keys := append(append(append(append([]string{}, f.Keys...), f.Optional...), f.Kept...), commonKeys...)
	for k := range f.Aliases {
		keys = append(keys, k)
	}
	for k := range baseDefaults {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// New returns the default configuration of modelType, as transformers' config class built with
// no arguments (XConfig()).
func New(modelType string) (*Config, error) {
	f, err := Lookup(modelType)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c := newDefaults(f)
	if err := c.resolve(); err != nil {
		return nil, fmt.Errorf("config: %s defaults: %w", modelType, err)
	}
	return c, nil
}

func newDefaults(f *Family) *Config {
	c := &Config{ModelType: f.ModelType, family: f, src: map[string]bool{}, intLit: map[string]bool{}}
	c.UseCache = true
	c.HiddenAct = "silu"
	c.InitializerRange = 0.02
	c.RMSNormEps = 1e-6
	f.Defaults(c)
	if c.Rope.Type == "" {
		c.Rope.Type = "default" // gemma4_text's default is "proportional"
	}
	c.Rope.Theta = f.DefaultRopeTheta
	if f.RopePerLayerType {
		c.SlidingRope.Type = "default"
		c.SlidingRope.Theta = f.DefaultSlidingRopeTheta
	}
	return c
}

// Presets lists the preset names of modelType, sorted.
func Presets(modelType string) ([]string, error) {
	f, err := Lookup(modelType)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	names := make([]string, 0, len(f.Presets))
	for n := range f.Presets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

// TinyVocab is the vocabulary size of the tiny presets; set VocabSize to your tokenizer's size.
const TinyVocab = 256

// Preset returns a named configuration of a family: "tiny" (every family: hidden 64, 2 layers,
// 4 heads, 2 KV heads, head_dim 16, vocabulary TinyVocab; MoE families 8 experts, top-2) for
// tests and debugging, or a real model's shape such as "qwen3-0.6b", "llama-3.2-1b" and
// "qwen3-moe-30b-a3b" (values from the models' Hub config.json). Callers may change fields
// (VocabSize, NumHiddenLayers) and call Validate.
func Preset(modelType, name string) (*Config, error) {
	f, err := Lookup(modelType)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	set, ok := f.Presets[name]
	if !ok {
		names, _ := Presets(modelType)
		return nil, fmt.Errorf("config: %s has no preset %q; presets: %s", modelType, name, strings.Join(names, ", "))
	}
	c := newDefaults(f)
	c.Architectures = []string{f.Architectures[0]}
	set(c)
	if err := c.resolve(); err != nil {
		return nil, fmt.Errorf("config: preset %s/%s: %w", modelType, name, err)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("config: preset %s/%s: %w", modelType, name, err)
	}
	return c, nil
}

// ropeKeys returns the names of the per-layer-type rope dictionaries (RopeTypeKeys).
func (f *Family) ropeKeys() (full, sliding string) {
	if f != nil && f.RopeTypeKeys != [2]string{} {
		return f.RopeTypeKeys[0], f.RopeTypeKeys[1]
	}
	return FullAttention, SlidingAttention
}

// field returns the field of key in family f: its own type (FieldTypes) or the package's.
func (f *Family) field(key string) (field, bool) {
	if f != nil {
		if fl, ok := f.FieldTypes[key]; ok {
			return fl, true
		}
	}
	fl, ok := fields[key]
	return fl, ok
}
