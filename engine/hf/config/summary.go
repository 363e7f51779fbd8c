package config

import (
	"fmt"
	"io"
	"strconv"
	"strings"
)

// WriteSummary writes a human-readable description of c: family, shapes, parameter counts,
// attention, RoPE, MoE layout, and keys that were not understood or were dropped.
func (c *Config) WriteSummary(w io.Writer) error {
	d := c.Shape()
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	arch := "-"
	if len(c.Architectures) > 0 {
		arch = strings.Join(c.Architectures, ", ")
	}
	p("model_type     %s (%s)\n", c.ModelType, arch)
	if c.DType != "" {
		p("dtype          %s\n", c.DType)
	}
	p("parameters     %s", humanCount(d.NumParameters()))
	if d.MoE() {
		p(" (%s active per token)", humanCount(d.ActiveParameters()))
	}
	p("\n")
	p("vocab          %d%s\n", d.Vocab, map[bool]string{true: " (tied embeddings)", false: ""}[d.Tied])
	p("layers         %d, hidden %d, MLP %d, %s, rms_norm_eps %g\n", d.Layers, d.Hidden, d.Intermediate, c.HiddenAct, c.RMSNormEps)
	p("attention      %d heads, %d KV heads, head_dim %d", d.Heads, d.KVHeads, d.HeadDim)
	var feats []string
	if d.QKVBias {
		feats = append(feats, "qkv bias")
	}
	if d.OBias {
		feats = append(feats, "o bias")
	}
	switch d.QKNorm {
	case QKNormPerHead:
		feats = append(feats, "q/k norm per head")
	case QKNormProjection:
		feats = append(feats, "q/k norm over projections")
	}
	if len(feats) > 0 {
		p(" (%s)", strings.Join(feats, ", "))
	}
	p("\n")
	if l := d.Latent; l.KVRank > 0 {
		q := fmt.Sprintf("q rank %d", l.QRank)
		if l.QRank == 0 {
			q = "plain q_proj"
		}
		p("latent         %s, kv rank %d, query/key heads %d + %d rotary (interleaved %v), value heads %d\n",
			q, l.KVRank, l.Nope, l.Rope, c.RopeInterleave, l.V)
	}
	if c.SlidingWindow > 0 {
		n := 0
		for i := 0; i < c.NumHiddenLayers; i++ {
			if c.IsSlidingLayer(i) {
				n++
			}
		}
		p("sliding window %d tokens on %d of %d layers\n", c.SlidingWindow, n, c.NumHiddenLayers)
	}
	r := c.Rope
	p("rope           %s, theta %s", r.Type, strconv.FormatFloat(r.Theta, 'f', -1, 64))
	switch r.Type {
	case "linear", "dynamic":
		p(", factor %g", r.Factor)
	case "llama3":
		p(", factor %g, low/high freq %g/%g, original context %d", r.Factor, r.LowFreqFactor, r.HighFreqFactor, r.OriginalMaxPositionEmbeddings)
	case "yarn", "longrope":
		p(", factor %g, original context %d", r.Factor, r.OriginalMaxPositionEmbeddings)
	}
	if rd := c.RotaryDim(); rd != d.HeadDim {
		p(", rotary dim %d", rd)
	}
	p("; context %d\n", c.MaxPositionEmbeddings)
	if d.MoE() {
		p("experts        %d per layer, top-%d, width %d, on %d of %d layers", d.Experts, d.TopK, d.ExpertIntermediate, d.MoELayers, d.Layers)
		if c.NormTopKProb {
			p(", renormalised")
		}
		if d.RouterBias {
			p(", sigmoid router with correction bias, best %d of %d groups, weights x %g", c.TopKGroup, c.NGroup, c.RoutedScalingFactor)
		}
		if d.SharedExpert > 0 {
			p(", shared expert width %d", d.SharedExpert)
		}
		p(", aux loss coef %g\n", c.RouterAuxLossCoef)
	}
	if u := c.Unknown(); len(u) > 0 {
		p("not understood %s (kept)\n", strings.Join(u, ", "))
	}
	if dr := c.Dropped(); len(dr) > 0 {
		p("dropped        %s (generation parameters)\n", strings.Join(dr, ", "))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// humanCount writes n with a B/M/K suffix and the exact value.
func humanCount(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB (%d)", float64(n)/1e9, n)
	case n >= 1e6:
		return fmt.Sprintf("%.2fM (%d)", float64(n)/1e6, n)
	case n >= 1e3:
		return fmt.Sprintf("%.1fK (%d)", float64(n)/1e3, n)
	}
	return fmt.Sprint(n)
}
