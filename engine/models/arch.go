package models

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/nn"
)

// Arch is what the model code needs from config.json: the structure of the model as its
// family's rules resolve it (config.Shape, embedded: sizes, which biases and q/k norms exist,
// the expert layout), and the settings that are not structure (norm epsilon, init, windows,
// rotary embedding, padding row).
type Arch struct {
	config.Shape
	NormEps float32
	// InitStd is initializer_range: the std of normal init for linears and embeddings.
	InitStd float64
	// Windows[i] is layer i's sliding attention window in tokens; 0 = full causal.
	Windows []int
	// PadID is pad_token_id (its embedding row starts at zero), or -1.
	PadID int
	// NumLabels > 0 makes the model a sequence classifier (transformers'
	// AutoModelForSequenceClassification): a score head score.weight [NumLabels, C] on the
	// final norm's output, pooled at each sequence's last token that is not PadID, instead
	// of the LM head. 0 for a causal LM.
	NumLabels int
	// Rope is the rotary embedding configuration.
	Rope backend.RoPEConfig
	// SlidingRope, when set, is the rotary embedding of the sliding-attention layers
	// (families whose rope_parameters are per layer type); nil means Rope everywhere.
	SlidingRope *backend.RoPEConfig
	// LocalRope[i] marks layer i as rotating with SlidingRope (nil when SlidingRope is nil).
	LocalRope []bool
	// Act is the MLP gate (hidden_act: silu or gelu_pytorch_tanh).
	Act nn.Activation
	// LogitSoftcap caps the LM head's logits with tanh (final_logit_softcapping); 0 = none.
	LogitSoftcap float32
	// HeldExperts is the range of routed experts the model holds in each MoE layer ([0, E)
	// unless Options.Experts names a subset; zero for dense models).
	HeldExperts ExpertRange
	// Config is the config.json the architecture came from (nil when built by hand); the
	// mixture-of-experts hooks read the per-layer rule and the router settings from it.
	Config *config.Config

	// NoRoPE[i] marks layer i as a NoPE layer (smollm3); nil means every layer rotates.
	NoRoPE []bool
	// LinearLayers[i] marks layer i as a gated delta-net (linear attention) layer
	// (qwen3_next, qwen3_5_moe_text); nil means none.
	LinearLayers []bool
	// InterleavedRoPE rotates pairs (2i, 2i+1) (glm4), from the family.
	InterleavedRoPE bool
	// QKNormAfterRoPE and QKNormNames are the family's (Family.QKNormAfterRoPE,
	// Family.QKNormNames).
	QKNormAfterRoPE bool
	QKNormNames     [2]string
	// EmbedScale multiplies the embeddings, ResidualScale each branch before its residual
	// add, AttnScale replaces 1/sqrt(head_dim) and LogitScale multiplies the logits (granite;
	// AttnScale is also Gemma's query_pre_attn_scalar^-0.5; 0 means the plain decoder).
	EmbedScale, ResidualScale, AttnScale, LogitScale float32
}

// Validate checks the sizes (the router settings first) so that layer construction cannot
// fail on shapes.
func (a *Arch) Validate() error {
	if a.Experts > 0 {
		if a.TopK < 1 || a.TopK > a.Experts {
			return fmt.Errorf("models: %s: num_experts_per_tok %d must be between 1 and the number of experts %d", a.ModelType, a.TopK, a.Experts)
		}
		if a.ExpertIntermediate <= 0 {
			return fmt.Errorf("models: %s: the expert width must be > 0, got %d (moe_intermediate_size or intermediate_size)", a.ModelType, a.ExpertIntermediate)
		}
	}
	dense := a.Intermediate
	if a.MoELayers == a.Layers && a.Experts > 0 && dense == 0 {
		dense = 1 // no dense MLP to size (qwen3_5_moe_text)
	}
	if a.LinearLayers != nil && len(a.LinearLayers) != a.Layers {
		return fmt.Errorf("models: %s: %d linear-attention flags for %d layers", a.ModelType, len(a.LinearLayers), a.Layers)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"vocab_size", a.Vocab}, {"hidden_size", a.Hidden}, {"intermediate_size", dense},
		{"num_hidden_layers", a.Layers}, {"num_attention_heads", a.Heads},
		{"num_key_value_heads", a.KVHeads}, {"head_dim", a.HeadDim}} {
		if f.v <= 0 {
			return fmt.Errorf("models: %s: %s must be > 0, got %d", a.ModelType, f.name, f.v)
		}
	}
	if a.Heads%a.KVHeads != 0 {
		return fmt.Errorf("models: %s: num_attention_heads %d must be a multiple of num_key_value_heads %d",
			a.ModelType, a.Heads, a.KVHeads)
	}
	if len(a.Windows) != a.Layers {
		return fmt.Errorf("models: %s: %d attention windows for %d layers", a.ModelType, len(a.Windows), a.Layers)
	}
	for i, w := range a.Windows {
		if w < 0 {
			return fmt.Errorf("models: %s: layer %d: sliding window %d must be >= 0", a.ModelType, i, w)
		}
	}
	if !(a.NormEps > 0) {
		return fmt.Errorf("models: %s: rms_norm_eps must be > 0, got %v", a.ModelType, a.NormEps)
	}
	if _, _, err := a.Rope.Compute(1); err != nil {
		return fmt.Errorf("models: %s: %w", a.ModelType, err)
	}
	if a.SlidingRope != nil {
		if _, _, err := a.SlidingRope.Compute(1); err != nil {
			return fmt.Errorf("models: %s: sliding layers: %w", a.ModelType, err)
		}
		if a.SlidingRope.DependsOnLength() {
			return fmt.Errorf("models: %s: rope_type %q on the sliding-attention layers is not supported (their table is computed once); use a length-independent type there", a.ModelType, a.SlidingRope.Type)
		}
		if len(a.LocalRope) != a.Layers {
			return fmt.Errorf("models: %s: %d local-rope flags for %d layers", a.ModelType, len(a.LocalRope), a.Layers)
		}
	}
	return nil
}

// IsLinear reports whether layer i is a gated delta-net (linear attention) layer.
func (a *Arch) IsLinear(i int) bool { return i < len(a.LinearLayers) && a.LinearLayers[i] }

// NumExperts is the number of routed experts per MoE layer (0 for dense models).
func (a *Arch) NumExperts() int { return a.Experts }

// holdExperts resolves and checks the range of experts the model holds.
func (a *Arch) holdExperts(r ExpertRange) error {
	e := a.NumExperts()
	if r.All() {
		a.HeldExperts = ExpertRange{0, e}
		return nil
	}
	if e == 0 {
		return fmt.Errorf("models: %s: experts %s requested, but the model has no routed experts; leave Options.Experts empty", a.ModelType, r)
	}
	if r.Lo < 0 || r.Hi > e || r.Lo >= r.Hi {
		return fmt.Errorf("models: %s: expert range %s is not a non-empty part of the %d experts [0,%d)", a.ModelType, r, e, e)
	}
	a.HeldExperts = r
	return nil
}

// qkNormNames returns the modules of the query and key norms under self_attn.
func (a *Arch) qkNormNames() (q, k string) {
	if a.QKNormNames != ([2]string{}) {
		return a.QKNormNames[0], a.QKNormNames[1]
	}
	return "q_norm", "k_norm"
}
