package models

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// configSource is the config.json a model was built from.
type configSource = *config.Config

// ArchFromConfig resolves the model structure from a typed config.json: the shape its family's
// rules give (config.Shape) and the settings the model code needs besides. Settings the model
// code does not implement are refused here, before any allocation.
func ArchFromConfig(c *config.Config) (Arch, error) {
	if c == nil {
		return Arch{}, fmt.Errorf("models: nil config")
	}
	act := nn.SiLU
	switch c.HiddenAct {
	case "", "silu", "swish":
	case "gelu_pytorch_tanh":
		act = nn.GELUTanh
	default:
		return Arch{}, fmt.Errorf("models: %s: hidden_act %q is not supported (the MLP gates with silu or gelu_pytorch_tanh)", c.ModelType, c.HiddenAct)
	}
	if c.AttnLogitSoftcapping != 0 {
		return Arch{}, fmt.Errorf("models: %s: attn_logit_softcapping %v is not supported (the fused attention does not cap scores); set it to null", c.ModelType, c.AttnLogitSoftcapping)
	}
	if c.UseBidirectionalAttention {
		return Arch{}, fmt.Errorf("models: %s: use_bidirectional_attention is not supported (attention is causal); set it to false", c.ModelType)
	}
	if err := ossConfigCheck(c); err != nil {
		return Arch{}, err
	}
	if err := gemma4Check(c); err != nil {
		return Arch{}, err
	}
	if err := lfm2Check(c); err != nil {
		return Arch{}, err
	}
	if c.ClipQKV != 0 {
		return Arch{}, fmt.Errorf("models: %s: clip_qkv is not supported yet; remove it from config.json", c.ModelType)
	}
	if c.AttentionDropout != 0 {
		return Arch{}, fmt.Errorf("models: %s: attention_dropout %v is not supported (no dropout on the attention weights is implemented, so training would not match transformers); set it to 0.0 in config.json", c.ModelType, c.AttentionDropout)
	}
	if c.ResidPdrop != 0 || c.EmbdPdrop != 0 {
		return Arch{}, fmt.Errorf("models: %s: resid_pdrop %v and embd_pdrop %v are not supported (no dropout on the residual stream or the embeddings is implemented); set them to 0 in config.json", c.ModelType, c.ResidPdrop, c.EmbdPdrop)
	}
	if c.RouterJitterNoise != 0 && (c.Family() == nil || !c.Family().SparseMixer) {
		return Arch{}, fmt.Errorf("models: %s: router_jitter_noise %v is not supported (training would not match transformers); set it to 0 in config.json", c.ModelType, c.RouterJitterNoise)
	}
	a := Arch{
		Shape: c.Shape(), NormEps: float32(c.NormEpsilon()), InitStd: c.InitializerRange,
		PadID: -1, Config: c, Act: act, LogitSoftcap: float32(c.FinalLogitSoftcapping),
	}
	if c.PadTokenID != nil {
		a.PadID = *c.PadTokenID
	}
	a.Windows = make([]int, c.NumHiddenLayers)
	if a.Linear.Layers > 0 {
		a.LinearLayers = make([]bool, c.NumHiddenLayers)
		for i := range a.LinearLayers {
			a.LinearLayers[i] = c.IsLinearLayer(i)
		}
	}
	for i := range a.Windows {
		if c.IsSlidingLayer(i) {
			a.Windows[i] = c.SlidingWindow
		}
		if !c.UsesRoPE(i) {
			if a.NoRoPE == nil {
				a.NoRoPE = make([]bool, c.NumHiddenLayers)
			}
			a.NoRoPE[i] = true
		}
	}
	a.EmbedScale, a.ResidualScale = float32(c.EmbeddingMultiplier), float32(c.ResidualMultiplier)
	a.AttnScale = float32(c.AttentionMultiplier)
	if c.LogitsScaling != 0 {
		a.LogitScale = float32(1 / c.LogitsScaling)
	}
	if c.LogitScale != 0 {
		a.LogitScale = float32(c.LogitScale) // cohere2_moe multiplies the logits by logit_scale
	}
	if c.QueryPreAttnScalar > 0 {
		a.AttnScale = float32(math.Pow(c.QueryPreAttnScalar, -0.5))
	}
	rope := func(r config.Rope) backend.RoPEConfig {
		theta := r.Theta
		if theta == 0 {
			theta = 10000
		}
		return backend.RoPEConfig{
			Type: r.Type, Theta: theta, HeadDim: a.HeadDim, PartialRotaryFactor: r.PartialRotaryFactor,
			MaxPositionEmbeddings: c.MaxPositionEmbeddings, Factor: r.Factor,
			OriginalMaxPositionEmbeddings: r.OriginalMaxPositionEmbeddings,
			LowFreqFactor:                 r.LowFreqFactor, HighFreqFactor: r.HighFreqFactor,
			BetaFast: r.BetaFast, BetaSlow: r.BetaSlow, MScale: r.MScale, MScaleAllDim: r.MScaleAllDim,
			AttentionFactor: r.AttentionFactor, NoTruncate: r.Truncate != nil && !*r.Truncate,
			ShortFactor: r.ShortFactor, LongFactor: r.LongFactor,
		}
	}
	a.Rope = rope(c.Rope)
	if f := c.Family(); f != nil && f.RopeAttentionFactor != nil {
		a.Rope.AttentionFactor = f.RopeAttentionFactor(c)
	}
	if f := c.Family(); f != nil && f.RopeShortFactorsOnly {
		a.Rope.ShortFactorsOnly = true
	}
	if a.Global.Full != nil {
		// gemma4_text: the main table is the full layers', at their head width.
		a.Rope.HeadDim = a.Global.HeadDim
	}
	if f := c.Family(); f != nil && f.RopePerLayerType {
		sr := rope(c.SlidingRope)
		a.SlidingRope = &sr
		a.LocalRope = make([]bool, c.NumHiddenLayers)
		for i := range a.LocalRope {
			a.LocalRope[i] = i < len(c.LayerTypes) && c.LayerTypes[i] == config.SlidingAttention
		}
	}
	return a, nil
}

// New builds a model of cfg's family on b. Parameters are zero: call InitRandom or LoadWeights.
func New(cfg *config.Config, b backend.Backend, o Options) (*Model, error) {
	f, err := Lookup(cfg.ModelType)
	if err != nil {
		return nil, err
	}
	cfg = cfg.Clone()
	a, err := ArchFromConfig(cfg)
	if err != nil {
		return nil, err
	}
	return newModel(f, a, cfg, b, o)
}

// Load reads a Hugging Face checkpoint directory (config.json and model.safetensors or sharded
// safetensors with an index) onto b. Stored dtypes are converted to o.DType (default F32).
// Tensors in the checkpoint that the model does not use are listed in m.Unused.
func Load(dir string, b backend.Backend, o Options) (*Model, error) {
	cfg, err := config.Load(dir)
	if err != nil {
		return nil, err
	}
	ck, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	q, err := readPrequantized(cfg, ck, b)
	if err != nil {
		return nil, fmt.Errorf("%w (checkpoint %s)", err, dir)
	}
	if c := o.QuantizeOnLoad; q == nil && c != nil && c.LoadIn4bit {
		if q, err = quantizeOnLoad(cfg, ck, b, o.DType, *c); err != nil {
			return nil, fmt.Errorf("%w (checkpoint %s)", err, dir)
		}
	}
	o.prequant = q
	m, err := New(cfg, b, o)
	if err != nil {
		if q != nil {
			q.free(b)
		}
		return nil, fmt.Errorf("%w (checkpoint %s)", err, dir)
	}
	if err := m.checkPrequantized(); err != nil {
		m.Close()
		return nil, fmt.Errorf("%w (checkpoint %s)", err, dir)
	}
	if m.Unused, err = m.loadWeights(ck); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// Config returns a copy of the config.json the model was built from (with dtype set to the
// model's dtype).
func (m *Model) Config() *config.Config {
	if m.cfg == nil {
		return nil
	}
	return m.cfg.Clone()
}

// SaveOptions control Save.
type SaveOptions struct {
	// DType of the stored weights; Invalid means the model's dtype.
	DType tensor.DType
	// MaxShardSize in bytes; above it the weights are split into shards with an index
	// (0 = safetensors.DefaultMaxShardSize, 5 GB as transformers).
	MaxShardSize int64
}

// Save writes a Hugging Face checkpoint (config.json + safetensors, sharded with an index above
// MaxShardSize) that transformers loads. Each file is written to a temporary name and renamed;
// weights files of an earlier save in dir that this one does not replace are removed, other
// files (tokenizer, trainer state) are kept. To replace a whole checkpoint atomically, Save
// into a temporary directory and rename it.
func (m *Model) Save(dir string, o SaveOptions) error {
	if m.quant != nil {
		return fmt.Errorf("models: Save %s: the base is quantised to 4 bits; save the adapter (SaveAdapter), whose base is the original checkpoint", dir)
	}
	if m.cfg == nil {
		return fmt.Errorf("models: Save %s: the model was not built from a config.json", dir)
	}
	if h := m.Arch.HeldExperts; h.Len() != m.Arch.NumExperts() {
		return fmt.Errorf("models: Save %s: the model holds experts %s of %d, not a whole checkpoint; gather into a model holding every expert (parallel.Plan.Gather) and save that", dir, h, m.Arch.NumExperts())
	}
	dt := o.DType
	if dt == tensor.Invalid {
		dt = m.opts.DType
	}
	cfg := m.cfg.Clone()
	// Multi-token-prediction layers (glm4_moe's num_nextn_predict_layers) are not built, so
	// their weights are not saved, and the config says so (transformers then ignores them too).
	cfg.NumNextNPredictLayers = 0
	switch dt {
	case tensor.F32:
		cfg.DType = "float32"
	case tensor.BF16:
		cfg.DType = "bfloat16"
	case tensor.F16:
		cfg.DType = "float16"
	}
	if len(cfg.Architectures) == 0 {
		cfg.Architectures = []string{m.Family.Architectures[0]}
	}
	if m.IsClassifier() {
		m.classifierConfig(cfg)
	}
	tensors, err := m.WeightTensors(dt)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("models: Save: %w", err)
	}
	if _, err := safetensors.SaveCheckpoint(dir, tensors, safetensors.CheckpointOptions{MaxShardSize: o.MaxShardSize}); err != nil {
		return fmt.Errorf("models: Save %s: %w", dir, err)
	}
	if raw, ok := cfg.Extra("quantization_config"); ok && strings.Contains(string(raw), `"mxfp4"`) {
		cfg.RemoveExtra("quantization_config") // the experts were dequantised on load
	}
	if err := cfg.Write(filepath.Join(dir, "config.json")); err != nil {
		return fmt.Errorf("models: Save %s: %w", dir, err)
	}
	return nil
}
