package models

import (
	"fmt"
	"math"
	"sort"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
)

// qwenNextRef is the decoder of Qwen3-Next and Qwen3.5-MoE's text model written out in float64
// from transformers' definitions (Qwen3NextForCausalLM, Qwen3_5MoeForCausalLM on their torch
// path), reading the parameters by their checkpoint names: the oracle of
// TestGatedDeltaNetFamiliesMatchReference. It shares no code with the model: the projections
// are split as fix_query_key_value_ordering and in_proj_qkv/z/b/a lay them out, the rotary
// frequencies come from rope_theta and partial_rotary_factor, and the gated delta rule is
// torch_recurrent_gated_delta_rule's loop.
type qwenNextRef struct {
	c       *config.Config
	grouped bool
	p       func(name string) []float64
}

func sigm(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// rms normalises rows of len(w) and scales by off + w (off 1 for Qwen3NextRMSNorm, 0 for the
// gated norm's weight).
func (r qwenNextRef) rms(x, w []float64, off float64) []float64 {
	out := make([]float64, len(x))
	n := len(w)
	for row := 0; row < len(x)/n; row++ {
		s := 0.0
		for _, v := range x[row*n : (row+1)*n] {
			s += v * v
		}
		rs := 1 / math.Sqrt(s/float64(n)+r.c.RMSNormEps)
		for j := range n {
			out[row*n+j] = x[row*n+j] * rs * (off + w[j])
		}
	}
	return out
}

func (r qwenNextRef) linear(x []float64, name string, in int) []float64 {
	y := lin(x, r.p(name+".weight"), in)
	if r.c.AttentionBias { // q, k, v and o_proj: bias=config.attention_bias
		b := r.p(name + ".bias")
		for i := range y {
			y[i] += b[i%len(b)]
		}
	}
	return y
}

func (r qwenNextRef) attention(l int, h []float64, n int) []float64 {
	c := r.c
	C, hd, nh, nkv := c.HiddenSize, c.HeadDim, c.NumAttentionHeads, c.NumKeyValueHeads
	pre := fmt.Sprintf("model.layers.%d.self_attn.", l)
	qg := r.linear(h, pre+"q_proj", C)
	q, gate := make([]float64, n*nh*hd), make([]float64, n*nh*hd)
	for t := range n {
		for hh := range nh {
			// view(..., NH, 2·HD).chunk(2, dim=-1)
			src := qg[t*2*nh*hd+hh*2*hd:]
			copy(q[(t*nh+hh)*hd:(t*nh+hh+1)*hd], src[:hd])
			copy(gate[(t*nh+hh)*hd:(t*nh+hh+1)*hd], src[hd:2*hd])
		}
	}
	q = r.rms(q, r.p(pre+"q_norm.weight"), 1)
	k := r.rms(r.linear(h, pre+"k_proj", C), r.p(pre+"k_norm.weight"), 1)
	v := r.linear(h, pre+"v_proj", C)
	dim := int(float64(hd) * c.Rope.PartialRotaryFactor)
	half := dim / 2
	rot := func(x []float64, heads int) {
		for t := range n {
			for hh := range heads {
				row := x[(t*heads+hh)*hd:]
				for i := range half {
					inv := 1 / math.Pow(c.Rope.Theta, float64(2*i)/float64(dim))
					co, si := math.Cos(float64(t)*inv), math.Sin(float64(t)*inv)
					x1, x2 := row[i], row[i+half]
					row[i], row[i+half] = x1*co-x2*si, x2*co+x1*si
				}
			}
		}
	}
	rot(q, nh)
	rot(k, nkv)
	att := make([]float64, n*nh*hd)
	for t := range n {
		for hh := range nh {
			kh := hh / (nh / nkv)
			sc := make([]float64, t+1)
			m := math.Inf(-1)
			for j := 0; j <= t; j++ {
				s := 0.0
				for d := range hd {
					s += q[(t*nh+hh)*hd+d] * k[(j*nkv+kh)*hd+d]
				}
				sc[j] = s / math.Sqrt(float64(hd))
				m = math.Max(m, sc[j])
			}
			z := 0.0
			for j := range sc {
				sc[j] = math.Exp(sc[j] - m)
				z += sc[j]
			}
			for j := 0; j <= t; j++ {
				for d := range hd {
					att[(t*nh+hh)*hd+d] += sc[j] / z * v[(j*nkv+kh)*hd+d]
				}
			}
		}
	}
	for i := range att {
		att[i] *= sigm(gate[i])
	}
	return r.linear(att, pre+"o_proj", nh*hd)
}

func (r qwenNextRef) linearAttention(l int, h []float64, n int) []float64 {
	c := r.c
	C := c.HiddenSize
	kh, vh, kd, vd, K := c.LinearNumKeyHeads, c.LinearNumValueHeads, c.LinearKeyHeadDim, c.LinearValueHeadDim, c.LinearConvKernelDim
	rr := vh / kh
	pre := fmt.Sprintf("model.layers.%d.linear_attn.", l)
	d := 2*kh*kd + vh*vd
	mixed, z := make([]float64, n*d), make([]float64, n*vh*vd)
	b, a := make([]float64, n*vh), make([]float64, n*vh)
	if r.grouped {
		qkvz := lin(h, r.p(pre+"in_proj_qkvz.weight"), C)
		ba := lin(h, r.p(pre+"in_proj_ba.weight"), C)
		per := 2*kd + 2*rr*vd
		for t := range n {
			row := qkvz[t*kh*per:]
			for g := range kh {
				blk := row[g*per : (g+1)*per]
				copy(mixed[t*d+g*kd:], blk[:kd])
				copy(mixed[t*d+kh*kd+g*kd:], blk[kd:2*kd])
				copy(mixed[t*d+2*kh*kd+g*rr*vd:], blk[2*kd:2*kd+rr*vd])
				copy(z[t*vh*vd+g*rr*vd:], blk[2*kd+rr*vd:per])
				bb := ba[t*2*vh+g*2*rr:]
				copy(b[t*vh+g*rr:], bb[:rr])
				copy(a[t*vh+g*rr:], bb[rr:2*rr])
			}
		}
	} else {
		mixed = lin(h, r.p(pre+"in_proj_qkv.weight"), C)
		z = lin(h, r.p(pre+"in_proj_z.weight"), C)
		b = lin(h, r.p(pre+"in_proj_b.weight"), C)
		a = lin(h, r.p(pre+"in_proj_a.weight"), C)
	}
	w := r.p(pre + "conv1d.weight")
	u := make([]float64, n*d)
	for t := range n {
		for ch := range d {
			s := 0.0
			for j := range K {
				if src := t + j - (K - 1); src >= 0 {
					s += w[ch*K+j] * mixed[src*d+ch]
				}
			}
			u[t*d+ch] = s * sigm(s)
		}
	}
	dt, alog := r.p(pre+"dt_bias"), r.p(pre+"A_log")
	l2 := func(x []float64) []float64 {
		s := 0.0
		for _, v := range x {
			s += v * v
		}
		out := make([]float64, len(x))
		for i, v := range x {
			out[i] = v / math.Sqrt(s+1e-6)
		}
		return out
	}
	core := make([]float64, n*vh*vd)
	for hh := range vh {
		g := hh / rr // repeat_interleave
		S := make([]float64, kd*vd)
		for t := range n {
			q := l2(u[t*d+g*kd : t*d+(g+1)*kd])
			k := l2(u[t*d+kh*kd+g*kd : t*d+kh*kd+(g+1)*kd])
			v := u[t*d+2*kh*kd+hh*vd : t*d+2*kh*kd+(hh+1)*vd]
			beta := sigm(b[t*vh+hh])
			x := a[t*vh+hh] + dt[hh]
			sp := x
			if x <= 20 {
				sp = math.Log1p(math.Exp(x))
			}
			decay := math.Exp(-math.Exp(alog[hh]) * sp)
			for i := range S {
				S[i] *= decay
			}
			for j := range vd {
				mem := 0.0
				for i := range kd {
					mem += S[i*vd+j] * k[i]
				}
				delta := (v[j] - mem) * beta
				for i := range kd {
					S[i*vd+j] += k[i] * delta
				}
			}
			for j := range vd {
				s := 0.0
				for i := range kd {
					s += S[i*vd+j] * q[i] / math.Sqrt(float64(kd))
				}
				core[t*vh*vd+hh*vd+j] = s
			}
		}
	}
	normed := r.rms(core, r.p(pre+"norm.weight"), 0)
	for i := range normed {
		normed[i] *= z[i] * sigm(z[i])
	}
	return lin(normed, r.p(pre+"out_proj.weight"), vh*vd)
}

func (r qwenNextRef) mlp(h []float64, pre string, in int) []float64 {
	g, u := lin(h, r.p(pre+".gate_proj.weight"), r.c.HiddenSize), lin(h, r.p(pre+".up_proj.weight"), r.c.HiddenSize)
	for i := range g {
		g[i] = g[i] * sigm(g[i]) * u[i]
	}
	return lin(g, r.p(pre+".down_proj.weight"), in)
}

func (r qwenNextRef) moe(l int, h []float64, n int) []float64 {
	c := r.c
	C := c.HiddenSize
	pre := fmt.Sprintf("model.layers.%d.mlp", l)
	if !c.IsMoELayer(l) {
		return r.mlp(h, pre, c.IntermediateSize)
	}
	logits := lin(h, r.p(pre+".gate.weight"), C)
	e := c.NumExperts
	out := make([]float64, n*C)
	for t := range n {
		row := logits[t*e : (t+1)*e]
		m := math.Inf(-1)
		for _, v := range row {
			m = math.Max(m, v)
		}
		probs := make([]float64, e)
		z := 0.0
		for j, v := range row {
			probs[j] = math.Exp(v - m)
			z += probs[j]
		}
		idx := make([]int, e)
		for j := range idx {
			probs[j] /= z
			idx[j] = j
		}
		sort.SliceStable(idx, func(i, j int) bool { return probs[idx[i]] > probs[idx[j]] })
		top := idx[:c.NumExpertsPerTok]
		sum := 0.0
		for _, j := range top {
			sum += probs[j]
		}
		x := h[t*C : (t+1)*C]
		for _, j := range top {
			wgt := probs[j]
			if c.NormTopKProb {
				wgt /= sum
			}
			y := r.mlp(x, fmt.Sprintf("%s.experts.%d", pre, j), c.MoEIntermediateSize)
			for i := range y {
				out[t*C+i] += wgt * y[i]
			}
		}
		s := r.mlp(x, pre+".shared_expert", c.SharedExpertIntermediateSize)
		gv := sigm(lin(x, r.p(pre+".shared_expert_gate.weight"), C)[0])
		for i := range s {
			out[t*C+i] += gv * s[i]
		}
	}
	return out
}

func (r qwenNextRef) logprobs(ids []int32) []float64 {
	c := r.c
	C, n := c.HiddenSize, len(ids)
	emb := r.p(nameEmbed)
	x := make([]float64, n*C)
	for t, id := range ids {
		copy(x[t*C:(t+1)*C], emb[int(id)*C:(int(id)+1)*C])
	}
	for l := range c.NumHiddenLayers {
		h := r.rms(x, r.p(layerName(l, "input_layernorm.weight")), 1)
		var y []float64
		if c.IsLinearLayer(l) {
			y = r.linearAttention(l, h, n)
		} else {
			y = r.attention(l, h, n)
		}
		for i := range x {
			x[i] += y[i]
		}
		h = r.rms(x, r.p(layerName(l, "post_attention_layernorm.weight")), 1)
		y = r.moe(l, h, n)
		for i := range x {
			x[i] += y[i]
		}
	}
	hf := r.rms(x, r.p(nameFinalNorm), 1)
	head := emb
	if !c.TieWordEmbeddings {
		head = r.p(nameLMHead)
	}
	logits := lin(hf, head, C)
	v := c.VocabSize
	out := make([]float64, n-1)
	for t := 0; t+1 < n; t++ {
		row := logits[t*v : (t+1)*v]
		m := math.Inf(-1)
		for _, l := range row {
			m = math.Max(m, l)
		}
		z := 0.0
		for _, l := range row {
			z += math.Exp(l - m)
		}
		out[t] = row[ids[t+1]] - m - math.Log(z)
	}
	return out
}

// TestGatedDeltaNetFamiliesMatchReference: the model's logprobs equal the float64 reference
// decoder's, for both families with every feature on (attention biases, a dense layer, a
// linear layer before and after a full one, top-2 of 4 experts, tied embeddings for
// qwen3_5_moe_text), on a document longer than the conv kernel.
func TestGatedDeltaNetFamiliesMatchReference(t *testing.T) {
	for _, tc := range []struct {
		family string
		edit   func(*config.Config)
	}{
		{"qwen3_next", func(c *config.Config) {
			c.AttentionBias, c.MLPOnlyLayers, c.NormTopKProb = true, []int{2}, false
			c.LayerTypes = []string{config.LinearAttention, config.FullAttention, config.LinearAttention, config.FullAttention}
		}},
		{"qwen3_5_moe_text", func(c *config.Config) {
			c.TieWordEmbeddings = true
			c.LayerTypes = []string{config.FullAttention, config.LinearAttention, config.LinearAttention, config.FullAttention}
		}},
	} {
		t.Run(tc.family, func(t *testing.T) {
			m := tinyLinearModel(t, tc.family, func(c *config.Config) {
				c.NumExpertsPerTok = 2
				c.InitializerRange = 0.3
				tc.edit(c)
			})
			cfg := m.Config()
			ref := qwenNextRef{c: cfg, grouped: tc.family == "qwen3_next", p: func(name string) []float64 {
				v, err := m.ParamFloat32(name)
				if err != nil {
					panic(err)
				}
				out := make([]float64, len(v))
				for i, x := range v {
					out[i] = float64(x)
				}
				return out
			}}
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
		})
	}
}
