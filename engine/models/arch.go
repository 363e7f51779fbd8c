package models

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
)

// Arch is the resolved structure of a decoder: everything the model code needs from
// config.json, in the model's own terms. Families adjust it in their Tune hook.
type Arch struct {
	ModelType    string
	Vocab        int // V
	Hidden       int // C
	Intermediate int // I (F in backend docs)
	Layers       int // L
	Heads        int // NH
	KVHeads      int // NKV
	HeadDim      int // HD
	NormEps      float32
	// InitStd is initializer_range: the std of normal init for linears and embeddings.
	InitStd float64
	// Tied: lm_head shares model.embed_tokens.weight (absent from the checkpoint).
	Tied bool
	// QKVBias: q/k/v projections carry a bias; OBias: o_proj does; MLPBias: the MLP does.
	QKVBias, OBias, MLPBias bool
	// QKNorm: RMSNorm of queries and keys before RoPE, per head (Qwen3) or, with QKNormFull,
	// over the whole q and k projections (OLMoE: q_norm [NH*HD], k_norm [NKV*HD]).
	QKNorm, QKNormFull bool
	// Windows[i] is layer i's sliding attention window in tokens; 0 = full causal.
	Windows []int
	// PadID is pad_token_id (its embedding row starts at zero), or -1.
	PadID int
	// Rope is the rotary embedding configuration.
	Rope backend.RoPEConfig
	// HeldExperts is the range of routed experts the model holds in each MoE layer ([0, E)
	// unless Options.Experts names a subset; zero for dense models).
	HeldExperts ExpertRange
	// Config is the config.json the architecture came from (nil when built by hand); family
	// hooks read fields that Arch does not carry (experts, router settings) from it.
	Config *config.Config
}

// Validate checks the sizes so that layer construction cannot fail on shapes.
func (a *Arch) Validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"vocab_size", a.Vocab}, {"hidden_size", a.Hidden}, {"intermediate_size", a.Intermediate},
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
	return nil
}

// NumExperts is the number of routed experts of the config (0 for dense models).
func (a *Arch) NumExperts() int {
	if a.Config == nil || !a.Config.IsMoE() {
		return 0
	}
	return a.Config.NumExperts
}

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
