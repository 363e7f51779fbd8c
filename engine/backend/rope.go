package backend

import (
	"fmt"
	"math"
)

// RoPEConfig is the rotary-embedding part of an HF config.json: rope_theta, head_dim,
// partial_rotary_factor, max_position_embeddings and the rope_scaling (rope_parameters) dict.
// Compute turns it into the inverse frequencies and attention scaling that RoPEArgs take; every
// backend uses this one function so their rotations agree.
type RoPEConfig struct {
	Type                  string  // rope_type: "default" (or ""), "linear", "dynamic", "llama3", "yarn"
	Theta                 float64 // rope_theta (base)
	HeadDim               int     // HD
	PartialRotaryFactor   float64 // fraction of HD rotated; 0 means 1
	MaxPositionEmbeddings int     // config.max_position_embeddings
	Factor                float64 // rope_scaling.factor (linear, dynamic, llama3, yarn)
	// OriginalMaxPositionEmbeddings is rope_scaling.original_max_position_embeddings (llama3:
	// required; yarn: optional, the pre-extension context used for the correction range, else
	// MaxPositionEmbeddings; the explicit Factor is used either way, as transformers 5 does).
	OriginalMaxPositionEmbeddings int
	LowFreqFactor                 float64 // llama3
	HighFreqFactor                float64 // llama3
	BetaFast                      float64 // yarn; 0 means 32
	BetaSlow                      float64 // yarn; 0 means 1
	MScale                        float64 // yarn mscale; 0 = unset
	MScaleAllDim                  float64 // yarn mscale_all_dim; 0 = unset
	AttentionFactor               float64 // yarn attention_factor; 0 = computed
	NoTruncate                    bool    // yarn truncate=false (HF default truncates)
	// ShortFactor and LongFactor are longrope's per-frequency divisors [R/2]: the long ones
	// apply once the sequence is longer than OriginalMaxPositionEmbeddings.
	ShortFactor, LongFactor []float64
	// ShortFactorsOnly makes longrope divide by ShortFactor at every length, LongFactor never
	// applying: transformers 5's PhimoeRotaryEmbedding computes its frequencies without the
	// sequence length (rope_init_fn(config)), so they are the short ones however long the batch.
	ShortFactorsOnly bool
}

// maxHeadDim bounds head_dim read from a config so a corrupt value cannot ask for a huge table.
const maxHeadDim = 1 << 16

// RotaryDim returns R = int(HD * partial_rotary_factor); HD for "proportional", which rotates
// pairs across the whole head (its unrotated pairs have frequency 0).
func (c RoPEConfig) RotaryDim() int {
	if c.Type == "proportional" {
		return c.HeadDim
	}
	f := c.PartialRotaryFactor
	if f == 0 {
		f = 1
	}
	return int(float64(c.HeadDim) * f)
}

// DependsOnLength reports whether Compute's result changes with the sequence length (dynamic
// NTK scaling, longrope unless ShortFactorsOnly), so callers recompute it per micro-batch
// instead of once.
func (c RoPEConfig) DependsOnLength() bool {
	return c.Type == "dynamic" || (c.Type == "longrope" && !c.ShortFactorsOnly)
}

// LongRoPE reports whether longrope uses its long factors for a sequence of seqLen tokens
// (seqLen > original_max_position_embeddings, as transformers switches them; never under
// ShortFactorsOnly).
func (c RoPEConfig) LongRoPE(seqLen int) bool {
	return c.Type == "longrope" && !c.ShortFactorsOnly && seqLen > c.OriginalMaxPositionEmbeddings
}

// Compute returns inv_freq [R/2] and the attention scaling (multiplier of cos and sin) exactly as
// Hugging Face transformers' ROPE_INIT_FUNCTIONS compute them (in float64, rounded to float32).
// seqLen is the longest position + 1 in the batch; only "dynamic" uses it (HF recomputes the
// base only when seqLen exceeds max_position_embeddings and uses the default frequencies
// otherwise).
func (c RoPEConfig) Compute(seqLen int) (invFreq []float32, attentionScaling float32, err error) {
	if c.HeadDim <= 0 || c.HeadDim > maxHeadDim {
		return nil, 0, fmt.Errorf("rope: head_dim %d must be in [1, %d]", c.HeadDim, maxHeadDim)
	}
	if !(c.PartialRotaryFactor >= 0 && c.PartialRotaryFactor <= 1) {
		return nil, 0, fmt.Errorf("rope: partial_rotary_factor %v must be in (0, 1]", c.PartialRotaryFactor)
	}
	dim := c.RotaryDim()
	if !(c.Theta > 0) || math.IsInf(c.Theta, 0) {
		return nil, 0, fmt.Errorf("rope: rope_theta must be a finite number > 0, got %v", c.Theta)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"factor", c.Factor}, {"low_freq_factor", c.LowFreqFactor}, {"high_freq_factor", c.HighFreqFactor},
		{"beta_fast", c.BetaFast}, {"beta_slow", c.BetaSlow}, {"mscale", c.MScale}, {"mscale_all_dim", c.MScaleAllDim},
		{"attention_factor", c.AttentionFactor}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 {
			return nil, 0, fmt.Errorf("rope: rope_scaling.%s = %v must be a finite number >= 0", f.name, f.v)
		}
	}
	if dim <= 0 || dim%2 != 0 || dim > c.HeadDim {
		return nil, 0, fmt.Errorf("rope: rotary dim %d (head_dim %d * partial_rotary_factor %v) must be even, positive and <= head_dim",
			dim, c.HeadDim, c.PartialRotaryFactor)
	}
	base := c.Theta
	pow := func(b float64) []float64 { // b ** (arange(0, dim, 2) / dim)
		out := make([]float64, dim/2)
		for i := range out {
			out[i] = math.Pow(b, float64(2*i)/float64(dim))
		}
		return out
	}
	needFactor := func() error {
		if !(c.Factor > 0) {
			return fmt.Errorf("rope: rope_type %q needs rope_scaling.factor > 0, got %v", c.Type, c.Factor)
		}
		return nil
	}
	inv := make([]float64, dim/2)
	scale := 1.0
	switch c.Type {
	case "", "default":
		for i, p := range pow(base) {
			inv[i] = 1 / p
		}
	case "linear":
		if err := needFactor(); err != nil {
			return nil, 0, err
		}
		for i, p := range pow(base) {
			inv[i] = 1 / p / c.Factor
		}
	case "dynamic":
		if err := needFactor(); err != nil {
			return nil, 0, err
		}
		maxPos := c.MaxPositionEmbeddings
		if maxPos <= 0 {
			return nil, 0, fmt.Errorf("rope: rope_type dynamic needs max_position_embeddings > 0")
		}
		b := base
		if seqLen > maxPos {
			b = base * math.Pow(c.Factor*float64(seqLen)/float64(maxPos)-(c.Factor-1), float64(dim)/float64(dim-2))
		}
		for i, p := range pow(b) {
			inv[i] = 1 / p
		}
	case "llama3":
		if err := needFactor(); err != nil {
			return nil, 0, err
		}
		old := float64(c.OriginalMaxPositionEmbeddings)
		if old <= 0 || !(c.HighFreqFactor > c.LowFreqFactor) || c.LowFreqFactor <= 0 {
			return nil, 0, fmt.Errorf("rope: llama3 needs original_max_position_embeddings > 0 and 0 < low_freq_factor < high_freq_factor (got %v, %v, %v)",
				old, c.LowFreqFactor, c.HighFreqFactor)
		}
		lowWave := old / c.LowFreqFactor
		highWave := old / c.HighFreqFactor
		for i, p := range pow(base) {
			f := 1 / p
			wave := 2 * math.Pi / f
			switch {
			case wave > lowWave:
				f /= c.Factor
			case wave < highWave:
			default:
				s := (old/wave - c.LowFreqFactor) / (c.HighFreqFactor - c.LowFreqFactor)
				f = (1-s)*f/c.Factor + s*f
			}
			inv[i] = f
		}
	case "yarn":
		if err := needFactor(); err != nil {
			return nil, 0, err
		}
		// transformers uses the explicit factor even when it disagrees with
		// max_position_embeddings / original_max_position_embeddings (it only warns).
		factor := c.Factor
		origMax := float64(c.MaxPositionEmbeddings)
		if c.OriginalMaxPositionEmbeddings > 0 {
			origMax = float64(c.OriginalMaxPositionEmbeddings)
		}
		if origMax <= 0 {
			return nil, 0, fmt.Errorf("rope: yarn needs max_position_embeddings or original_max_position_embeddings > 0")
		}
		mscale := func(s, m float64) float64 {
			if s <= 1 {
				return 1
			}
			return 0.1*m*math.Log(s) + 1
		}
		scale = c.AttentionFactor
		if scale == 0 {
			if c.MScale != 0 && c.MScaleAllDim != 0 {
				scale = mscale(factor, c.MScale) / mscale(factor, c.MScaleAllDim)
			} else {
				scale = mscale(factor, 1)
			}
		}
		betaFast, betaSlow := c.BetaFast, c.BetaSlow
		if betaFast == 0 {
			betaFast = 32
		}
		if betaSlow == 0 {
			betaSlow = 1
		}
		corr := func(rot float64) float64 {
			return float64(dim) * math.Log(origMax/(rot*2*math.Pi)) / (2 * math.Log(base))
		}
		low, high := corr(betaFast), corr(betaSlow)
		if !c.NoTruncate {
			low, high = math.Floor(low), math.Ceil(high)
		}
		low = math.Max(low, 0)
		high = math.Min(high, float64(dim-1))
		if low == high {
			high += 0.001
		}
		for i, p := range pow(base) {
			ramp := math.Min(math.Max((float64(i)-low)/(high-low), 0), 1)
			extra := 1 - ramp // inv_freq_extrapolation_factor
			inv[i] = (1/(factor*p))*(1-extra) + (1/p)*extra
		}
	case "longrope":
		// transformers' _compute_longrope_parameters: inv_freq = 1 / (ext * base^(2i/R)) with
		// ext the short factors, or the long ones past the original context (LongRoPE); the
		// attention factor is sqrt(1 + ln(s) / ln(original)) for s = max_position_embeddings /
		// original (1 when s <= 1) unless given.
		orig := c.OriginalMaxPositionEmbeddings
		if orig <= 0 || c.MaxPositionEmbeddings <= 0 {
			return nil, 0, fmt.Errorf("rope: longrope needs original_max_position_embeddings and max_position_embeddings > 0")
		}
		ext := c.ShortFactor
		if c.LongRoPE(seqLen) {
			ext = c.LongFactor
		}
		if len(c.ShortFactor) != dim/2 || len(c.LongFactor) != dim/2 {
			return nil, 0, fmt.Errorf("rope: longrope needs short_factor and long_factor of %d entries (rotary dim / 2), got %d and %d",
				dim/2, len(c.ShortFactor), len(c.LongFactor))
		}
		scale = c.AttentionFactor
		if scale == 0 {
			s := c.Factor
			if s == 0 {
				s = float64(c.MaxPositionEmbeddings) / float64(orig)
			}
			scale = 1
			if s > 1 {
				scale = math.Sqrt(1 + math.Log(s)/math.Log(float64(orig)))
			}
		}
		for i, p := range pow(base) {
			if !(ext[i] > 0) || math.IsInf(ext[i], 0) {
				return nil, 0, fmt.Errorf("rope: longrope factor %d is %v; the factors must be finite and positive", i, ext[i])
			}
			inv[i] = 1 / (ext[i] * p)
		}
	case "proportional":
		// transformers' _compute_proportional_rope_parameters (Gemma 4's full layers): the
		// first floor(partial_rotary_factor * HD / 2) pairs (i, i + HD/2) rotate with
		// base^(-2i/HD), the others not at all (frequency 0), all divided by factor (1 when
		// unset). dim is HD here.
		f := c.PartialRotaryFactor
		if f == 0 {
			f = 1
		}
		angles := int(math.Floor(f * float64(dim) / 2))
		factor := c.Factor
		if factor == 0 {
			factor = 1
		}
		for i := 0; i < angles; i++ {
			inv[i] = 1 / math.Pow(base, float64(2*i)/float64(dim)) / factor
		}
		if angles < 1 {
			return nil, 0, fmt.Errorf("rope: proportional: partial_rotary_factor %v of head_dim %d rotates no pair", c.PartialRotaryFactor, c.HeadDim)
		}
	default:
		return nil, 0, fmt.Errorf("rope: unsupported rope_type %q (supported: default, linear, dynamic, llama3, yarn, longrope, proportional)", c.Type)
	}
	invFreq = make([]float32, len(inv))
	for i, v := range inv {
		invFreq[i] = float32(v)
		if v == 0 && c.Type == "proportional" {
			continue // an unrotated pair
		}
		if !(invFreq[i] > 0) || math.IsInf(float64(invFreq[i]), 0) {
			return nil, 0, fmt.Errorf("rope: %s: computed inv_freq[%d] = %v is not finite and positive; check rope_theta and rope_scaling", c.Type, i, v)
		}
	}
	if !(scale > 0) || math.IsInf(scale, 0) {
		return nil, 0, fmt.Errorf("rope: %s: attention scaling %v is not finite and positive; check rope_scaling", c.Type, scale)
	}
	return invFreq, float32(scale), nil
}
