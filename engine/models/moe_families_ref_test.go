package models

import (
	"math"
	"sort"
	"strconv"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
)

// moeRefSpec describes, family by family, the decoders of flex_olmo, granitemoe,
// hunyuan_v1_moe, ernie4_5_moe and minimax_m2 as transformers 5.17's modeling files compute
// them; moeRef is a float64 decoder written from that description alone (it shares no code
// with the model but the RoPE frequencies), the oracle of TestMoEFamiliesMatchReference.
type moeRefSpec struct {
	postNorms bool // norms on the attention and MLP outputs, none on their inputs (FlexOlmo)
	// qkNorm is where the q/k RMSNorms sit: "" none, "before" or "after" RoPE. Their width is
	// their weight's: the whole projection (FlexOlmo, MiniMax-M2) or one head (HunYuan).
	qkNorm string
	qName  string // the q/k norm modules under self_attn
	kName  string
	// interleaved rotates the pairs (2i, 2i+1) (ERNIE 4.5), not (i, i+R/2).
	interleaved bool
	block       string // the MoE block's module
	router      string // the router's module under block
	gate, up    string // per-expert projection names
	down        string
	sigmoid     bool   // sigmoid scores, else softmax
	bias        string // the selection-only bias under block ("" none)
	shared      string // the shared SwiGLU MLP under block ("" none)
	renorm      bool   // the top-k weights are divided by their sum
	// headGate scales each head's attention output by softplus(g_proj(x)) (Laguna).
	headGate bool
	// layerNorm: the pre-norms and the final norm are nn.LayerNorms with a bias (PhiMoE).
	layerNorm bool
	// sparseMixer: PhiMoE's router in eval mode, two stages of a softmax over the experts
	// within 2*router_jitter_noise (relative) of the stage's best logit.
	sparseMixer bool
	// moa: the attention is JetMoE's mixture of attention heads (self_attention.experts.*,
	// kv_proj); moaInterleave pairs query head h with key head h / top-k (repeat_interleave)
	// in place of JetMoE's h % NKV, for the feature check.
	moa, moaInterleave bool
	// outBias: the MoE block adds the bias of this name under it to its output.
	outBias string
	// layerEps, when nonzero, is the decoder layers' norms' epsilon (rms_norm_eps then the
	// final norm's only: JetMoE).
	layerEps float64
}

var moeRefSpecs = map[string]moeRefSpec{
	"flex_olmo": {postNorms: true, qkNorm: "before", qName: "q_norm", kName: "k_norm", block: "mlp", router: "gate",
		gate: "gate_proj", up: "up_proj", down: "down_proj"},
	"granitemoe": {block: "block_sparse_moe", router: "router.layer", gate: "gate_proj", up: "up_proj", down: "down_proj", renorm: true},
	"hunyuan_v1_moe": {qkNorm: "after", qName: "query_layernorm", kName: "key_layernorm", block: "mlp", router: "gate.wg",
		gate: "gate_proj", up: "up_proj", down: "down_proj", shared: "shared_mlp", renorm: true},
	"ernie4_5_moe": {interleaved: true, block: "mlp", router: "gate", gate: "gate_proj", up: "up_proj", down: "down_proj",
		bias: "moe_statics.e_score_correction_bias", shared: "shared_experts", renorm: true},
	"laguna": {qkNorm: "before", qName: "q_norm", kName: "k_norm", block: "mlp", router: "gate",
		gate: "gate_proj", up: "up_proj", down: "down_proj", sigmoid: true, bias: "experts.e_score_correction_bias",
		shared: "shared_expert", renorm: true, headGate: true},
	"phimoe": {block: "block_sparse_moe", router: "gate", gate: "w1", up: "w3", down: "w2", layerNorm: true, sparseMixer: true},
	"jetmoe": {moa: true, block: "mlp", router: "router.layer", gate: "gate_proj", up: "up_proj", down: "down_proj",
		renorm: true, outBias: "bias", layerEps: 1e-6},
	"minimax_m2": {qkNorm: "before", qName: "q_norm", kName: "k_norm", block: "block_sparse_moe", router: "gate",
		gate: "w1", up: "w3", down: "w2", sigmoid: true, bias: "e_score_correction_bias", renorm: true},
}

type moeRef struct {
	s moeRefSpec
	c *config.Config
	a Arch
	p func(name string) []float64
}

func (r moeRef) rms(x, w []float64) []float64 { return r.rmsEps(x, w, r.c.RMSNormEps) }

func (r moeRef) rmsEps(x, w []float64, eps float64) []float64 {
	c := len(w)
	out := make([]float64, len(x))
	for i := 0; i < len(x)/c; i++ {
		s := 0.0
		for _, v := range x[i*c : (i+1)*c] {
			s += v * v
		}
		rs := 1 / math.Sqrt(s/float64(c)+eps)
		for j := 0; j < c; j++ {
			out[i*c+j] = x[i*c+j] * rs * w[j]
		}
	}
	return out
}

// norm is the pre-norm or final norm module on the rows x: an RMSNorm, or a LayerNorm
// (biased variance, then weight and bias) for layerNorm.
func (r moeRef) norm(x []float64, module string) []float64 {
	w := r.p(module + ".weight")
	if !r.s.layerNorm {
		return r.rms(x, w)
	}
	b, c := r.p(module+".bias"), len(w)
	out := make([]float64, len(x))
	for i := 0; i < len(x)/c; i++ {
		row := x[i*c : (i+1)*c]
		mean, vr := 0.0, 0.0
		for _, v := range row {
			mean += v
		}
		mean /= float64(c)
		for _, v := range row {
			vr += (v - mean) * (v - mean)
		}
		rs := 1 / math.Sqrt(vr/float64(c)+r.c.RMSNormEps)
		for j, v := range row {
			out[i*c+j] = (v-mean)*rs*w[j] + b[j]
		}
	}
	return out
}

// sparseMixer returns the two experts and weights of PhiMoE's eval-mode router for one
// token's logits: stage k takes the best logit m among the experts not yet chosen, keeps those
// j with (m - z_j) / max(|z_j|, m) <= 2 eps, and weighs its choice by their softmax.
func sparseMixer(z []float64, eps float64) (sel [2]int, w [2]float64) {
	chosen := -1
	for k := 0; k < 2; k++ {
		best := -1
		for j := range z {
			if j != chosen && (best < 0 || z[j] > z[best]) {
				best = j
			}
		}
		m, sum := z[best], 0.0
		for j, v := range z {
			if j != chosen && (m-v)/math.Max(math.Abs(v), m) <= 2*eps {
				sum += math.Exp(v - m)
			}
		}
		sel[k], w[k] = best, 1/sum
		chosen = best
	}
	return sel, w
}

// proj is x @ W^T (+ b when the module has a bias).
func (r moeRef) proj(x []float64, module string, in int, bias bool) []float64 {
	y := lin(x, r.p(module+".weight"), in)
	if bias {
		b := r.p(module + ".bias")
		for i := range y {
			y[i] += b[i%len(b)]
		}
	}
	return y
}

func silu(v float64) float64 { return v / (1 + math.Exp(-v)) }

func (r moeRef) swiglu(x []float64, pre, gate, up, down string, in int) []float64 {
	g, u := r.proj(x, pre+gate, in, false), r.proj(x, pre+up, in, false)
	for i := range g {
		g[i] = silu(g[i]) * u[i]
	}
	return r.proj(g, pre+down, len(g)/(len(x)/in), false)
}

func (r moeRef) logprobs(ids []int32) []float64 {
	a, c := r.a, r.c
	h, hd, nh, nkv, n := a.Hidden, a.HeadDim, a.Heads, a.KVHeads, len(ids)
	emb := r.p(nameEmbed)
	x := make([]float64, n*h)
	for i, id := range ids {
		for j := 0; j < h; j++ {
			x[i*h+j] = emb[int(id)*h+j]
			if c.EmbeddingMultiplier != 0 {
				x[i*h+j] *= c.EmbeddingMultiplier
			}
		}
	}
	mainInv, _, err := a.Rope.Compute(a.Rope.MaxPositionEmbeddings)
	if err != nil {
		panic(err)
	}
	var inv []float32
	rot := func(v []float64, heads int) {
		half := len(inv)
		for t := 0; t < n; t++ {
			for hh := 0; hh < heads; hh++ {
				row := v[(t*heads+hh)*hd : (t*heads+hh+1)*hd]
				for i := 0; i < half; i++ {
					ang := float64(float32(t) * inv[i])
					co, si := math.Cos(ang), math.Sin(ang)
					i1, i2 := i, i+half
					if r.s.interleaved {
						i1, i2 = 2*i, 2*i+1
					}
					x1, x2 := row[i1], row[i2]
					row[i1], row[i2] = x1*co-x2*si, x2*co+x1*si
				}
			}
		}
	}
	resid := 1.0
	if c.ResidualMultiplier != 0 {
		resid = c.ResidualMultiplier
	}
	scale := 1 / math.Sqrt(float64(hd))
	if c.AttentionMultiplier != 0 {
		scale = c.AttentionMultiplier
	}
	bias := c.AttentionBias
	for l := 0; l < a.Layers; l++ {
		pre := layerName(l, "")
		inv = mainInv
		if c.IsSlidingLayer(l) && a.SlidingRope != nil {
			// The sliding layers' own base and rotary width (Laguna).
			if inv, _, err = a.SlidingRope.Compute(a.Rope.MaxPositionEmbeddings); err != nil {
				panic(err)
			}
		}
		window := 0
		if c.IsSlidingLayer(l) {
			window = c.SlidingWindow
		}
		in := x
		if !r.s.postNorms {
			in = r.layerNorm(x, pre+"input_layernorm")
		}
		if r.s.moa {
			o := r.moaAttention(in, pre+"self_attention.", rot)
			for i := range x {
				x[i] += o[i]
			}
			f := r.moe(r.layerNorm(x, pre+"post_attention_layernorm"), pre+r.s.block+".")
			for i := range x {
				x[i] += f[i]
			}
			continue
		}
		q := r.proj(in, pre+"self_attn.q_proj", h, bias)
		k := r.proj(in, pre+"self_attn.k_proj", h, bias)
		v := r.proj(in, pre+"self_attn.v_proj", h, bias)
		if r.s.qkNorm == "before" {
			q, k = r.rms(q, r.p(pre+"self_attn."+r.s.qName+".weight")), r.rms(k, r.p(pre+"self_attn."+r.s.kName+".weight"))
		}
		rot(q, nh)
		rot(k, nkv)
		if r.s.qkNorm == "after" {
			q, k = r.rms(q, r.p(pre+"self_attn."+r.s.qName+".weight")), r.rms(k, r.p(pre+"self_attn."+r.s.kName+".weight"))
		}
		att := make([]float64, n*nh*hd)
		for t := 0; t < n; t++ {
			for hh := 0; hh < nh; hh++ {
				kh := hh / (nh / nkv)
				sc := make([]float64, t+1)
				m := math.Inf(-1)
				lo := 0
				if window > 0 {
					lo = max(0, t-window+1)
				}
				for j := range sc {
					sc[j] = math.Inf(-1)
				}
				for j := lo; j <= t; j++ {
					s := 0.0
					for d := 0; d < hd; d++ {
						s += q[(t*nh+hh)*hd+d] * k[(j*nkv+kh)*hd+d]
					}
					sc[j] = s * scale
					m = math.Max(m, sc[j])
				}
				z := 0.0
				for _, s := range sc {
					z += math.Exp(s - m)
				}
				for j := lo; j <= t; j++ {
					for d := 0; d < hd; d++ {
						att[(t*nh+hh)*hd+d] += math.Exp(sc[j]-m) / z * v[(j*nkv+kh)*hd+d]
					}
				}
			}
		}
		if r.s.headGate {
			g := r.proj(in, pre+"self_attn.g_proj", h, false)
			for t := 0; t < n; t++ {
				for hh := 0; hh < nh; hh++ {
					sp := math.Log1p(math.Exp(g[t*nh+hh]))
					for d := 0; d < hd; d++ {
						att[(t*nh+hh)*hd+d] *= sp
					}
				}
			}
		}
		o := r.proj(att, pre+"self_attn.o_proj", nh*hd, bias)
		if r.s.postNorms {
			o = r.rms(o, r.p(pre+"post_attention_layernorm.weight"))
		}
		for i := range x {
			x[i] += resid * o[i]
		}
		in = x
		if !r.s.postNorms {
			in = r.layerNorm(x, pre+"post_attention_layernorm")
		}
		var f []float64
		if c.IsMoELayer(l) {
			f = r.moe(in, pre+r.s.block+".")
		} else {
			f = r.swiglu(in, pre+"mlp.", "gate_proj", "up_proj", "down_proj", h)
		}
		if r.s.postNorms {
			f = r.rms(f, r.p(pre+"post_feedforward_layernorm.weight"))
		}
		for i := range x {
			x[i] += resid * f[i]
		}
	}
	x = r.norm(x, "model.norm")
	head := nameLMHead
	if a.Tied {
		head = nameEmbed
	}
	logits := lin(x, r.p(head), h)
	if c.LMHeadBias {
		b := r.p(nameLMHeadBias)
		for i := range logits {
			logits[i] += b[i%len(b)]
		}
	}
	out := make([]float64, n-1)
	v := a.Vocab
	for t := 0; t < n-1; t++ {
		row := logits[t*v : (t+1)*v]
		m := math.Inf(-1)
		for j := range row {
			if c.LogitsScaling != 0 {
				row[j] /= c.LogitsScaling
			}
			m = math.Max(m, row[j])
		}
		z := 0.0
		for _, l := range row {
			z += math.Exp(l - m)
		}
		out[t] = row[ids[t+1]] - m - math.Log(z)
	}
	return out
}

// moe is the sparse block at module pre on the normalised rows x.
func (r moeRef) moe(x []float64, pre string) []float64 {
	h, e, k, n := r.a.Hidden, r.a.Experts, r.a.TopK, len(x)/r.a.Hidden
	logits := r.proj(x, pre+r.s.router, h, false)
	var bias []float64
	if r.s.bias != "" {
		bias = r.p(pre + r.s.bias)
	}
	out := make([]float64, n*h)
	for t := 0; t < n; t++ {
		row := logits[t*e : (t+1)*e]
		p := make([]float64, e)
		if r.s.sigmoid {
			for j, l := range row {
				p[j] = 1 / (1 + math.Exp(-l))
			}
		} else {
			m := math.Inf(-1)
			for _, l := range row {
				m = math.Max(m, l)
			}
			z := 0.0
			for j, l := range row {
				p[j] = math.Exp(l - m)
				z += p[j]
			}
			for j := range p {
				p[j] /= z
			}
		}
		xt := x[t*h : (t+1)*h]
		if r.s.sparseMixer {
			sel, w := sparseMixer(row, r.c.RouterJitterNoise)
			for k, s := range sel {
				y := r.swiglu(xt, pre+"experts."+strconv.Itoa(s)+".", r.s.gate, r.s.up, r.s.down, h)
				for j := range y {
					out[t*h+j] += w[k] * y[j]
				}
			}
			continue
		}
		score := make([]float64, e)
		idx := make([]int, e)
		for j := range p {
			score[j], idx[j] = p[j], j
			if bias != nil {
				score[j] += bias[j]
			}
		}
		sort.SliceStable(idx, func(i, j int) bool { return score[idx[i]] > score[idx[j]] })
		sel := idx[:k]
		sum := 0.0
		for _, s := range sel {
			sum += p[s]
		}
		for _, s := range sel {
			w := p[s]
			if r.s.renorm {
				w /= sum
			}
			if f := r.c.RoutedScalingFactor; f != 0 {
				w *= f
			}
			y := r.swiglu(xt, pre+"experts."+strconv.Itoa(s)+".", r.s.gate, r.s.up, r.s.down, h)
			for j := range y {
				out[t*h+j] += w * y[j]
			}
		}
		if r.s.shared != "" {
			y := r.swiglu(xt, pre+r.s.shared+".", "gate_proj", "up_proj", "down_proj", h)
			for j := range y {
				out[t*h+j] += y[j]
			}
		}
		if r.s.outBias != "" {
			b := r.p(pre + r.s.outBias)
			for j := range b {
				out[t*h+j] += b[j]
			}
		}
	}
	return out
}

// layerNorm is a decoder layer's pre-norm (norm, with layerEps when set).
func (r moeRef) layerNorm(x []float64, module string) []float64 {
	if r.s.layerEps != 0 {
		return r.rmsEps(x, r.p(module+".weight"), r.s.layerEps)
	}
	return r.norm(x, module)
}

// moaAttention is JetMoE's mixture of attention heads at module pre on the normalised rows x
// (rot rotates [n, heads, hd] rows in place by the main table): each token's top-k experts by
// router logit, weighted by the softmax over those logits, project its queries for the NKV
// key/value heads; query head i·NKV + j attends causally with key/value head j of kv_proj;
// each slot's output goes through its expert's output projection, weighted, plus the bias.
func (r moeRef) moaAttention(x []float64, pre string, rot func([]float64, int)) []float64 {
	a := r.a
	h, e, k, nkv, hd, n := a.Hidden, a.Experts, a.TopK, a.KVHeads, a.HeadDim, len(x)/a.Hidden
	kvw, nh := nkv*hd, k*nkv
	logits := r.proj(x, pre+"experts.router.layer", h, false)
	wq, wo := r.p(pre+"experts.input_linear.weight"), r.p(pre+"experts.output_linear.weight")
	sel := make([][]int, n)
	gates := make([][]float64, n)
	q := make([]float64, n*nh*hd)
	for t := 0; t < n; t++ {
		row := logits[t*e : (t+1)*e]
		idx := make([]int, e)
		for j := range idx {
			idx[j] = j
		}
		sort.SliceStable(idx, func(i, j int) bool { return row[idx[i]] > row[idx[j]] })
		sel[t] = idx[:k]
		m, z := row[sel[t][0]], 0.0
		gates[t] = make([]float64, k)
		for i, s := range sel[t] {
			gates[t][i] = math.Exp(row[s] - m)
			z += gates[t][i]
		}
		for i, s := range sel[t] {
			gates[t][i] /= z
			for o := 0; o < kvw; o++ {
				acc := 0.0
				for c := 0; c < h; c++ {
					acc += wq[(s*kvw+o)*h+c] * x[t*h+c]
				}
				q[t*nh*hd+i*kvw+o] = acc
			}
		}
	}
	kv := r.proj(x, pre+"kv_proj", h, false)
	kk, vv := make([]float64, n*kvw), make([]float64, n*kvw)
	for t := 0; t < n; t++ {
		copy(kk[t*kvw:(t+1)*kvw], kv[t*2*kvw:t*2*kvw+kvw])
		copy(vv[t*kvw:(t+1)*kvw], kv[t*2*kvw+kvw:(t+1)*2*kvw])
	}
	rot(q, nh)
	rot(kk, nkv)
	scale := 1 / math.Sqrt(float64(hd))
	att := make([]float64, n*nh*hd)
	for t := 0; t < n; t++ {
		for hh := 0; hh < nh; hh++ {
			kh := hh % nkv
			if r.s.moaInterleave {
				kh = hh / k
			}
			sc := make([]float64, t+1)
			m := math.Inf(-1)
			for j := 0; j <= t; j++ {
				s := 0.0
				for d := 0; d < hd; d++ {
					s += q[(t*nh+hh)*hd+d] * kk[(j*nkv+kh)*hd+d]
				}
				sc[j] = s * scale
				m = math.Max(m, sc[j])
			}
			z := 0.0
			for _, s := range sc {
				z += math.Exp(s - m)
			}
			for j := 0; j <= t; j++ {
				for d := 0; d < hd; d++ {
					att[(t*nh+hh)*hd+d] += math.Exp(sc[j]-m) / z * vv[(j*nkv+kh)*hd+d]
				}
			}
		}
	}
	b := r.p(pre + "experts.bias")
	out := make([]float64, n*h)
	for t := 0; t < n; t++ {
		for i, s := range sel[t] {
			for c := 0; c < h; c++ {
				acc := 0.0
				for o := 0; o < kvw; o++ {
					acc += wo[(s*h+c)*kvw+o] * att[t*nh*hd+i*kvw+o]
				}
				out[t*h+c] += gates[t][i] * acc
			}
		}
		for c := 0; c < h; c++ {
			out[t*h+c] += b[c]
		}
	}
	return out
}

// TestMoEFamiliesMatchReference: each family's logprobs equal the float64 reference decoder's
// with every feature the family has switched on, and each feature moves the result (the
// reference without it disagrees), so that every one is checked against its definition, not
// only against the model's own gradient.
func TestMoEFamiliesMatchReference(t *testing.T) {
	for _, tc := range []struct {
		fam string
		mod func(*config.Config)
		// off turns one feature off in the reference, which must then disagree.
		off func(*moeRef)
	}{
		{"flex_olmo", func(c *config.Config) { c.AttentionBias = true },
			func(r *moeRef) { r.s.qkNorm = "" }},
		{"granitemoe", func(c *config.Config) { c.AttentionBias = true },
			func(r *moeRef) { r.c.ResidualMultiplier = 1 }},
		{"hunyuan_v1_moe", func(c *config.Config) { c.AttentionBias = true },
			func(r *moeRef) { r.s.qkNorm = "before" }},
		{"ernie4_5_moe", func(c *config.Config) {
			c.NumHiddenLayers, c.MoELayerStartIndex, c.MoELayerEndIndex = 3, 1, 2
		}, func(r *moeRef) { r.s.interleaved = false }},
		{"laguna", func(c *config.Config) {
			c.NumHiddenLayers, c.RoutedScalingFactor, c.NumExpertsPerTok = 3, 1.7, 3
			c.LayerTypes = []string{"sliding_attention", "full_attention", "sliding_attention"}
			c.MLPLayerTypes = []string{"dense", "sparse", "sparse"}
			c.NumAttentionHeadsPerLayer = []int{4, 4, 4}
			c.SlidingWindow = 3
		}, func(r *moeRef) { r.s.headGate = false }},
		// The threshold at 0.3 so that the stages keep several experts; the reference without
		// the sparsemixer (plain top-2 softmax weights) must disagree.
		{"phimoe", func(c *config.Config) { c.AttentionBias, c.LMHeadBias, c.RouterJitterNoise = true, true, 0.3 },
			func(r *moeRef) { r.s.sparseMixer = false }},
		{"minimax_m2", func(c *config.Config) { c.NumExpertsPerTok = 3 },
			func(r *moeRef) { r.s.bias = "" }},
		// rms_norm_eps far from the layer norms' 1e-6, so that the final norm's own epsilon
		// shows; the feature checked is the key head each query head reads (h % NKV).
		{"jetmoe", func(c *config.Config) { c.RMSNormEps = 0.05 },
			func(r *moeRef) { r.s.moaInterleave = true }},
	} {
		t.Run(tc.fam, func(t *testing.T) {
			m := tinyMoE(t, tc.fam, tc.mod)
			if tc.fam == "minimax_m2" || tc.fam == "ernie4_5_moe" || tc.fam == "laguna" {
				// A correction bias large enough to change choices.
				name := layerName(m.moe.index[len(m.moe.index)-1], moeRefSpecs[tc.fam].block+"."+moeRefSpecs[tc.fam].bias)
				b := make([]float32, m.Arch.Experts)
				for i := range b {
					b[i] = 0.3 * float32(i%3-1)
				}
				if err := m.SetParam(name, b); err != nil {
					t.Fatal(err)
				}
			}
			if tc.fam == "jetmoe" {
				// Biases away from their zero initial values.
				for l := 0; l < m.Arch.Layers; l++ {
					for _, name := range []string{"self_attention.experts.bias", "mlp.bias"} {
						b := make([]float32, m.Arch.Hidden)
						for i := range b {
							b[i] = 0.2 * float32(i%5-2)
						}
						if err := m.SetParam(layerName(l, name), b); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			ref := moeRef{s: moeRefSpecs[tc.fam], c: m.Config(), a: m.Arch, p: float64s(t, m)}
			ids := []int32{3, 17, 0, 36, 5, 5, 21, 9, 30, 2, 40}
			got, err := m.Logprobs(ids)
			if err != nil {
				t.Fatal(err)
			}
			want := ref.logprobs(ids)
			for i := range want {
				if d := math.Abs(float64(got[i]) - want[i]); d > 2e-5 {
					t.Errorf("logprob %d: model %.7f, reference %.7f", i, got[i], want[i])
				}
			}
			offRef := ref
			offRef.c = m.Config().Clone()
			tc.off(&offRef)
			off := offRef.logprobs(ids)
			diff := 0.0
			for i := range off {
				diff = math.Max(diff, math.Abs(off[i]-want[i]))
			}
			if diff < 1e-3 {
				t.Errorf("turning the feature off moved no logprob by 1e-3 (max %g): the case does not exercise it", diff)
			}
		})
	}
}
