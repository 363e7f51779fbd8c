//go:build ignore

package models

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
)

// configSource is the config.json a model was built from.
type configSource = *config.Config

// ArchFromConfig resolves the model structure from a typed config.json. The family's Tune hook
// is applied by New, not here.
func ArchFromConfig(c *config.Config) (Arch, error) {
	if c == nil {
		return Arch{}, fmt.Errorf("models: nil config")
	}
	if c.HiddenAct != "" && c.HiddenAct != "silu" && c.HiddenAct != "swish" {
		return Arch{}, fmt.Errorf("models: %s: hidden_act %q is not supported (the MLP is SwiGLU: use \"silu\")", c.ModelType, c.HiddenAct)
	}
	if c.ClipQKV != 0 {
		return Arch{}, fmt.Errorf("models: %s: clip_qkv is not supported yet; remove it from config.json", c.ModelType)
	}
	a := Arch{
		ModelType: c.ModelType, Vocab: c.VocabSize, Hidden: c.HiddenSize,
		Intermediate: c.IntermediateSize, Layers: c.NumHiddenLayers, Heads: c.NumAttentionHeads,
		KVHeads: c.KVHeads(), HeadDim: c.HeadDim, NormEps: float32(c.RMSNormEps),
		InitStd: c.InitializerRange, Tied: c.TieWordEmbeddings,
		QKVBias: c.QKVBias(), OBias: c.OProjBias(), MLPBias: c.MLPBias, QKNorm: c.QKNorm(),
		PadID: -1,
	}
	if a.HeadDim == 0 && a.Heads > 0 {
		a.HeadDim = a.Hidden / a.Heads
	}
	if a.KVHeads == 0 {
		a.KVHeads = a.Heads
	}
	if c.PadTokenID != nil {
		a.PadID = *c.PadTokenID
	}
	a.Windows = make([]int, c.NumHiddenLayers)
	for i := range a.Windows {
		if c.IsSlidingLayer(i) {
			a.Windows[i] = c.SlidingWindow
		}
	}
	r := c.Rope
	theta := r.Theta
	if theta == 0 {
		theta = 10000
	}
	a.Rope = backend.RoPEConfig{
		Type: r.Type, Theta: theta, HeadDim: a.HeadDim, PartialRotaryFactor: r.PartialRotaryFactor,
		MaxPositionEmbeddings: c.MaxPositionEmbeddings, Factor: r.Factor,
		OriginalMaxPositionEmbeddings: r.OriginalMaxPositionEmbeddings,
		LowFreqFactor:                 r.LowFreqFactor, HighFreqFactor: r.HighFreqFactor,
		BetaFast: r.BetaFast, BetaSlow: r.BetaSlow, MScale: r.MScale, MScaleAllDim: r.MScaleAllDim,
		AttentionFactor: r.AttentionFactor, NoTruncate: r.Truncate != nil && !*r.Truncate,
	}
	if r.Type == "longrope" {
		return Arch{}, fmt.Errorf("models: %s: rope_type longrope is not supported yet (supported: default, linear, dynamic, llama3, yarn)", c.ModelType)
	}
	return a, nil
}
