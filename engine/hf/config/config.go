package config

import (
	"encoding/json"
	"slices"
)

// WriterVersion is the transformers_version written into config.json: the files this package
// writes are the ones transformers 5.17 writes, and it is tested against that release.
const WriterVersion = "5.17.0"

// Layer types of LayerTypes (transformers' layer_types values this package supports).
const (
	FullAttention    = "full_attention"
	SlidingAttention = "sliding_attention"
)

// Config is a decoder-only model's config.json, typed. After Parse, Load, New or Preset every
// field holds its resolved value: absent keys carry Hugging Face's default for the family (each
// field's comment gives the defaults, which differ per family) and derived values (head_dim,
// num_key_value_heads, layer_types) are filled in. Fields a family does not have keep their zero
// value and are not written.
//
// Sizes are counts of elements (not bytes); token ids index the vocabulary.
type Config struct {
	// ModelType is config.json's model_type: llama, mistral, qwen2, qwen3, qwen3_moe, mixtral,
	// olmoe. It selects the Family.
	ModelType string
	// Architectures are the transformers model classes, e.g. ["Qwen3ForCausalLM"]; nil when
	// absent (transformers writes the key only when set).
	Architectures []string
	// TransformersVersion is the transformers_version read from the file (informational; files
	// are written with WriterVersion).
	TransformersVersion string
	// DType is the checkpoint's parameter dtype ("bfloat16", "float32", ...): dtype in 5.x,
	// torch_dtype in 4.x; empty when absent.
	DType string

	// VocabSize is the number of tokens (rows of the embedding matrix). Default: llama, mistral,
	// mixtral 32000; qwen2, qwen3, qwen3_moe 151936; olmoe 50304.
	VocabSize int
	// HiddenSize is the model width d. Default: llama, mistral, mixtral, qwen2, qwen3 4096;
	// qwen3_moe, olmoe 2048.
	HiddenSize int
	// IntermediateSize is the dense SwiGLU MLP width; for mixtral and olmoe it is also each
	// expert's width. Default: llama 11008; mistral, mixtral 14336; qwen2, qwen3 22016;
	// qwen3_moe 6144; olmoe 2048.
	IntermediateSize int
	// NumHiddenLayers is the number of decoder blocks L. Default: 32; qwen3_moe 24; olmoe 16.
	NumHiddenLayers int
	// NumAttentionHeads is the number of query heads. Default: 32; olmoe 16.
	NumAttentionHeads int
	// NumKeyValueHeads is the number of key/value heads (GQA); absent or null means
	// NumAttentionHeads. Default: llama, qwen2, qwen3, olmoe = heads; mistral, mixtral 8;
	// qwen3_moe 4.
	NumKeyValueHeads int
	// HeadDim is each head's width; absent or null means HiddenSize / NumAttentionHeads.
	// Explicit in qwen3 (default 128) and in Llama-3.2 and Qwen3-MoE checkpoints.
	HeadDim int
	// MaxPositionEmbeddings is the context length the model was trained for (tokens). Default:
	// llama 2048; mistral, mixtral 131072; qwen2, qwen3, qwen3_moe 32768; olmoe 4096.
	MaxPositionEmbeddings int
	// RMSNormEps is the epsilon inside every RMSNorm. Default: 1e-6; mixtral, olmoe 1e-5.
	RMSNormEps float64
	// HiddenAct is the MLP activation (transformers' ACT2FN name). Default "silu".
	HiddenAct string
	// InitializerRange is the standard deviation of the normal initialisation of weights.
	// Default 0.02.
	InitializerRange float64
	// TieWordEmbeddings: the LM head reuses the embedding matrix. Default false.
	TieWordEmbeddings bool
	// UseCache: generation keeps a KV cache (informational for training). Default true.
	UseCache bool
	// AttentionBias: q/k/v/o projections carry biases (llama, qwen3, qwen3_moe, olmoe key).
	// Default false. See QKVBias for what the model actually uses.
	AttentionBias bool
	// MLPBias: the MLP projections carry biases (llama only). Default false.
	MLPBias bool
	// AttentionDropout is the dropout probability on attention weights. Default 0.0.
	AttentionDropout float64
	// PretrainingTP is llama's pretraining tensor-parallel degree (informational). Default 1.
	PretrainingTP int
	// ClipQKV clamps q, k and v to [-ClipQKV, ClipQKV] (olmoe); 0 means no clipping (null).
	ClipQKV float64

	// BOSTokenID is the beginning-of-sequence token, nil when absent. Default: llama, mistral,
	// mixtral 1; others none.
	BOSTokenID *int
	// EOSTokenIDs are the end-of-sequence tokens (config.json holds an int or a list). Default:
	// llama, mistral, mixtral [2]; olmoe [50279]; others none.
	EOSTokenIDs []int
	// PadTokenID is the padding token, nil when absent. Default: olmoe 1; others none.
	PadTokenID *int

	// SlidingWindow is the attention window in tokens for sliding layers; 0 means none (null).
	// qwen2, qwen3 and qwen3_moe keep it only when UseSlidingWindow is set. Default: mistral
	// 4096; others none.
	SlidingWindow int
	// UseSlidingWindow enables SlidingWindow (qwen2, qwen3, qwen3_moe). Default false.
	UseSlidingWindow bool
	// MaxWindowLayers: layers with index >= MaxWindowLayers use sliding attention when it is
	// enabled (qwen2, qwen3). Default 28.
	MaxWindowLayers int
	// LayerTypes gives each layer's attention ("full_attention" or "sliding_attention"); qwen2
	// and qwen3 write it (derived from SlidingWindow and MaxWindowLayers when absent); nil for
	// families without the key.
	LayerTypes []string

	// Rope describes the rotary position embedding.
	Rope Rope

	// Features holds the keys of the families that depart from Llama's decoder (features.go).
	Features
	// Latent holds the keys of multi-head latent attention (latent.go).
	Latent
	// Linear holds the keys of gated delta-net linear attention (linear.go).
	Linear
	// MoEKeys holds keys of further mixture-of-experts families (moe_keys.go).
	MoEKeys
	// Gemma4 holds gemma4_text's keys (gemma4.go).
	Gemma4
	// LFM2 holds lfm2_moe's keys (lfm2_moe.go).
	LFM2
	// DeepseekV4 holds deepseek_v4's keys (deepseek_v4.go).
	DeepseekV4
	// Cohere2MoE holds cohere2_moe's keys (cohere2_moe.go).
	Cohere2MoE

	// NumExperts is the number of routed experts per MoE layer (qwen3_moe num_experts or
	// num_local_experts, mixtral num_local_experts, olmoe num_experts); 0 for dense families.
	// Default: qwen3_moe 128; mixtral 8; olmoe 64.
	NumExperts int
	// NumExpertsPerTok is the router's top-k. Default: qwen3_moe, olmoe 8; mixtral 2.
	NumExpertsPerTok int
	// MoEIntermediateSize is each expert's SwiGLU width (qwen3_moe; default 768). Mixtral and
	// olmoe experts use IntermediateSize; see ExpertIntermediateSize.
	MoEIntermediateSize int
	// DecoderSparseStep: layer i is sparse when (i+1) % DecoderSparseStep == 0 (qwen3_moe).
	// Default 1.
	DecoderSparseStep int
	// MLPOnlyLayers are layer indices that use a dense MLP instead of experts (qwen3_moe).
	// Default [].
	MLPOnlyLayers []int
	// NormTopKProb renormalises the top-k routing weights to sum to 1 (qwen3_moe, olmoe key,
	// default false; always true for mixtral, whose router renormalises).
	NormTopKProb bool
	// OutputRouterLogits: the model adds the auxiliary load-balancing loss to the LM loss.
	// Default false.
	OutputRouterLogits bool
	// RouterAuxLossCoef weights the auxiliary load-balancing loss. Default: qwen3_moe, mixtral
	// 0.001; olmoe 0.01.
	RouterAuxLossCoef float64
	// RouterJitterNoise is the multiplicative jitter applied to router inputs in training
	// (mixtral). Default 0.0.
	RouterJitterNoise float64
	// InputJitterNoise scales the MoE blocks' inputs by uniform noise in [1-x, 1+x] in training
	// (phimoe). Default 0.0.
	InputJitterNoise float64
	// LMHeadBias: lm_head carries a bias [vocab] (phimoe). Default false.
	LMHeadBias bool

	// QueryPreAttnScalar: attention scores are scaled by QueryPreAttnScalar^-0.5 instead of
	// head_dim^-0.5 (gemma3_text; default 256).
	QueryPreAttnScalar float64
	// FinalLogitSoftcapping caps the LM head's logits, c * tanh(logit / c); 0 means none
	// (null). Default: gemma3_text none.
	FinalLogitSoftcapping float64
	// AttnLogitSoftcapping caps the attention scores the same way; 0 means none (null).
	AttnLogitSoftcapping float64
	// UseBidirectionalAttention makes every token attend both ways (gemma3_text; default
	// false).
	UseBidirectionalAttention bool
	// SlidingWindowPattern: when layer_types is absent, every SlidingWindowPattern-th layer
	// (1-based) is full attention and the others sliding (gemma3_text; default 6).
	SlidingWindowPattern int
	// SavedSlidingWindowPattern is _sliding_window_pattern, the private attribute transformers
	// (5.x) keeps and writes for gemma3_text: sliding_window_pattern when the source had it,
	// else 6, unless the file holds _sliding_window_pattern itself. It never decides the
	// layers (layer_types, or sliding_window_pattern when that is absent, does), so it is only
	// carried so that what is written is what transformers writes.
	SavedSlidingWindowPattern int
	// CacheImplementation is the generation cache class (gemma3_text 4.x files write
	// "hybrid"); informational for training.
	CacheImplementation string
	// SwigluLimit clamps gpt_oss's expert gate (above) and up projection (both sides) before
	// the gated activation; SwigluAlpha is the sigmoid's gain there. Default 7.0 and 1.702.
	SwigluLimit, SwigluAlpha float64
	// ExpertsPerToken and InitialContextLength are keys of the original gpt-oss release that
	// its Hub config.json keeps (num_experts_per_tok and the yarn original context in
	// transformers' terms); informational, written back when read.
	ExpertsPerToken, InitialContextLength int
	// SlidingRope is the rotary embedding of the sliding-attention layers for families whose
	// rope_parameters are given per layer type (Family.RopePerLayerType: gemma3_text, where
	// Rope is that of the full-attention layers). Zero otherwise.
	SlidingRope Rope

	family *Family
	// src records the canonical keys present in the source file.
	src map[string]bool
	// intLit records output paths ("rope_parameters.rope_theta") whose source literal was an
	// integer, so they are written back as Python would (1000000, not 1000000.0).
	intLit map[string]bool
	// eosList: eos_token_id was a list in the source (written back as a list).
	eosList bool
	// layerTypesDerived: LayerTypes was computed, not read; it follows NumHiddenLayers,
	// SlidingWindow and MaxWindowLayers when they change.
	layerTypesDerived bool
	// layerTypesFromFile: LayerTypes was read from the file and not yet compared with the rule.
	layerTypesFromFile bool
	derivedLayerTypes  []string
	// extra holds top-level keys not mapped onto fields, in source order, written back as read.
	extra []rawKey
	// dropped are generation parameters found in the source, which are not written back.
	dropped []string
}

// rawKey is a config.json entry kept as read.
type rawKey struct {
	Key   string
	Value json.RawMessage
	// understood: the package reads this key (e.g. a top-level partial_rotary_factor) but
	// transformers also keeps it as an attribute, so it is written back and not Unknown.
	understood bool
}

// Rope is the rotary position embedding: transformers 5.x rope_parameters, or 4.x rope_theta +
// rope_scaling. Zero values mean "absent": the model uses the documented default.
type Rope struct {
	// Type is rope_type: "default", "linear", "dynamic", "llama3", "yarn" or "longrope".
	Type string
	// Theta is the base period. Default 10000.0 (mixtral 1e6).
	Theta float64
	// Factor is the context scaling factor (linear, dynamic, llama3, yarn; optional for
	// longrope).
	Factor float64
	// OriginalMaxPositionEmbeddings is the pretraining context length (llama3, yarn, longrope);
	// defaults to MaxPositionEmbeddings for those types.
	OriginalMaxPositionEmbeddings int
	// LowFreqFactor and HighFreqFactor bound llama3's frequency bands.
	LowFreqFactor, HighFreqFactor float64
	// BetaFast and BetaSlow bound yarn's ramp (defaults 32 and 1 when zero).
	BetaFast, BetaSlow float64
	// AttentionFactor scales attention logits (yarn, longrope); zero means the type's formula
	// (yarn: 0.1 ln(factor) + 1).
	AttentionFactor float64
	// MScale and MScaleAllDim are yarn's DeepSeek-style attention scale parameters.
	MScale, MScaleAllDim float64
	// Truncate is yarn's truncate option (nil when absent).
	Truncate *bool
	// ShortFactor and LongFactor are longrope's per-frequency factors (head_dim/2 entries).
	ShortFactor, LongFactor []float64
	// PartialRotaryFactor is the fraction of each head rotated; zero means 1.
	PartialRotaryFactor float64

	// legacyType is the 4.x "type" key of the source ("" if absent); transformers keeps it,
	// and so do we.
	legacyType string
	// src records the rope keys present in the source.
	src map[string]bool
	// extra are rope keys this package does not know, kept as read.
	extra []rawKey
}

// Family returns the registered family of c.ModelType, or nil if it is not registered.
func (c *Config) Family() *Family {
	if c.family != nil && c.family.ModelType == c.ModelType {
		return c.family
	}
	f, _ := Lookup(c.ModelType)
	return f
}

// KVHeads returns the number of key/value heads.
func (c *Config) KVHeads() int { return c.NumKeyValueHeads }

// RotaryDim is the number of dimensions per head that RoPE rotates: HeadDim scaled by
// Rope.PartialRotaryFactor, as transformers computes it (int(head_dim * factor)).
func (c *Config) RotaryDim() int {
	if c.Rope.PartialRotaryFactor == 0 {
		return c.HeadDim
	}
	return int(float64(c.HeadDim) * c.Rope.PartialRotaryFactor)
}

// ExpertIntermediateSize is each routed expert's SwiGLU width: MoEIntermediateSize where the
// family has it (qwen3_moe), else IntermediateSize (mixtral, olmoe).
func (c *Config) ExpertIntermediateSize() int {
	if c.MoEIntermediateSize > 0 {
		return c.MoEIntermediateSize
	}
	return c.IntermediateSize
}

// IsMoE reports whether any layer routes to experts.
func (c *Config) IsMoE() bool {
	for i := 0; i < c.NumHiddenLayers; i++ {
		if c.IsMoELayer(i) {
			return true
		}
	}
	return false
}

// IsMoELayer reports whether decoder layer i (0-based) has a sparse MoE block rather than a
// dense MLP, following the family's rule (qwen3_moe: i not in MLPOnlyLayers, NumExperts > 0
// and (i+1) % DecoderSparseStep == 0; mixtral, olmoe: every layer; dense families: none).
func (c *Config) IsMoELayer(i int) bool {
	f := c.Family()
	if f == nil || f.MoELayer == nil || i < 0 || i >= c.NumHiddenLayers {
		return false
	}
	return f.MoELayer(c, i)
}

// IsSlidingLayer reports whether layer i uses sliding-window attention of SlidingWindow tokens.
func (c *Config) IsSlidingLayer(i int) bool {
	if c.SlidingWindow <= 0 || i < 0 || i >= c.NumHiddenLayers {
		return false
	}
	if len(c.LayerTypes) == c.NumHiddenLayers {
		return c.LayerTypes[i] == SlidingAttention
	}
	return true
}

// QKVBias reports whether q_proj, k_proj and v_proj carry biases: AttentionBias for llama,
// qwen3, qwen3_moe and olmoe; always for qwen2; never for mistral and mixtral.
func (c *Config) QKVBias() bool {
	if f := c.Family(); f != nil && f.QKVBias != nil {
		return f.QKVBias(c)
	}
	return c.AttentionBias
}

// OProjBias reports whether o_proj carries a bias (AttentionBias for the families that have
// the key; never for qwen2, mistral and mixtral).
func (c *Config) OProjBias() bool {
	if f := c.Family(); f != nil && f.OProjBias != nil {
		return f.OProjBias(c)
	}
	return c.AttentionBias
}

// QKNorm reports whether the family applies RMSNorm to queries and keys (qwen3, qwen3_moe per
// head; olmoe over the whole projection); QKNormKind says which.
func (c *Config) QKNorm() bool { return c.QKNormKind() != NoQKNorm }

// QKNormKind returns how the family normalises queries and keys.
func (c *Config) QKNormKind() QKNorm {
	if f := c.Family(); f != nil {
		if f.QKNormOf != nil {
			return f.QKNormOf(c)
		}
		return f.QKNorm
	}
	return NoQKNorm
}

// Unknown lists the top-level keys of the source file that this package does not understand
// for the family, in file order. They are kept and written back; callers may warn about them.
func (c *Config) Unknown() []string {
	var out []string
	for _, kv := range c.extra {
		if !kv.understood {
			out = append(out, kv.Key)
		}
	}
	for _, kv := range c.Rope.extra {
		if kv.understood {
			continue
		}
		prefix := "rope_parameters."
		if c.Family() != nil && c.Family().RopePerLayerType {
			prefix += FullAttention + "."
		}
		out = append(out, prefix+kv.Key)
	}
	for _, kv := range c.SlidingRope.extra {
		out = append(out, "rope_parameters."+SlidingAttention+"."+kv.Key)
	}
	return out
}

// Extra returns a top-level key of the source file that this package keeps as read (for
// example quantization_config), and whether it is present.
func (c *Config) Extra(key string) (json.RawMessage, bool) {
	for _, kv := range c.extra {
		if kv.Key == key {
			return slices.Clone(kv.Value), true
		}
	}
	return nil, false
}

// SetExtra sets a top-level key that this package keeps as read (replacing it when present),
// to be written back by Write: e.g. id2label of a sequence classifier. value must be JSON.
func (c *Config) SetExtra(key string, value json.RawMessage) {
	for i, kv := range c.extra {
		if kv.Key == key {
			c.extra[i].Value = slices.Clone(value)
			return
		}
	}
	c.extra = append(c.extra, rawKey{Key: key, Value: slices.Clone(value)})
}

// Dropped lists the generation parameters (max_length, temperature, ...) found in the source
// file: transformers moves them out of the model config on load, and they are not written back.
// They belong in generation_config.json.
func (c *Config) Dropped() []string { return slices.Clone(c.dropped) }

// Clone returns a deep copy of c.
func (c *Config) Clone() *Config {
	n := *c
	n.Architectures = slices.Clone(c.Architectures)
	n.EOSTokenIDs = slices.Clone(c.EOSTokenIDs)
	n.LayerTypes = slices.Clone(c.LayerTypes)
	n.derivedLayerTypes = slices.Clone(c.derivedLayerTypes)
	n.MLPOnlyLayers = slices.Clone(c.MLPOnlyLayers)
	if c.BOSTokenID != nil {
		v := *c.BOSTokenID
		n.BOSTokenID = &v
	}
	if c.PadTokenID != nil {
		v := *c.PadTokenID
		n.PadTokenID = &v
	}
	n.src = cloneSet(c.src)
	n.intLit = cloneSet(c.intLit)
	n.extra = cloneRaw(c.extra)
	n.dropped = slices.Clone(c.dropped)
	n.Rope = c.Rope.clone()
	n.Features = c.Features.clone()
	n.MoEKeys = c.MoEKeys.clone()
	n.Latent = c.Latent.clone()
	n.SlidingRope = c.SlidingRope.clone()
	n.DeepseekV4 = c.DeepseekV4.clone()
	return &n
}

func (r Rope) clone() Rope {
	n := r
	n.ShortFactor = slices.Clone(r.ShortFactor)
	n.LongFactor = slices.Clone(r.LongFactor)
	if r.Truncate != nil {
		v := *r.Truncate
		n.Truncate = &v
	}
	n.src = cloneSet(r.src)
	n.extra = cloneRaw(r.extra)
	return n
}

func cloneSet(m map[string]bool) map[string]bool {
	if m == nil {
		return nil
	}
	n := make(map[string]bool, len(m))
	for k, v := range m {
		n[k] = v
	}
	return n
}

func cloneRaw(kvs []rawKey) []rawKey {
	if kvs == nil {
		return nil
	}
	out := make([]rawKey, len(kvs))
	for i, kv := range kvs {
		out[i] = rawKey{Key: kv.Key, Value: slices.Clone(kv.Value), understood: kv.understood}
	}
	return out
}

// IntPtr returns a pointer to v, for BOSTokenID and PadTokenID.
func IntPtr(v int) *int { return &v }

// setIntLiteral marks an output path as holding an integer literal (written without ".0").
func (c *Config) setIntLiteral(path string) {
	if c.intLit == nil {
		c.intLit = map[string]bool{}
	}
	c.intLit[path] = true
}
