package models

import (
	"math"
	"sort"
	"testing"
)

// The float64 reference decoders of gemma4_text and lfm2_moe: each written out from
// transformers' modeling code (Gemma4ForCausalLM, Lfm2MoeForCausalLM) independently of the
// engine (its own RoPE tables, attention, convolution and routing), the oracles of
// TestGemma4MatchesReference and TestLFM2MatchesReference.

// refNorm is an RMSNorm over rows of width c: x / sqrt(mean(x^2) + eps) * w, or without a
// weight when w is nil.
func refNorm(x []float64, c int, w []float64, eps float64) []float64 {
	out := make([]float64, len(x))
	for r := 0; r < len(x)/c; r++ {
		s := 0.0
		for _, v := range x[r*c : (r+1)*c] {
			s += v * v
		}
		rs := 1 / math.Sqrt(s/float64(c)+eps)
		for j := 0; j < c; j++ {
			g := 1.0
			if w != nil {
				g = w[j]
			}
			out[r*c+j] = x[r*c+j] * rs * g
		}
	}
	return out
}

// refRope rotates each head of v [n, heads, hd] in place with rotate-half pairs (i, i+hd/2) at
// frequencies inv [hd/2] and positions 0..n-1.
func refRope(v []float64, n, heads, hd int, inv []float64) {
	half := hd / 2
	for t := 0; t < n; t++ {
		for h := 0; h < heads; h++ {
			row := v[(t*heads+h)*hd : (t*heads+h+1)*hd]
			for i := 0; i < half; i++ {
				ang := float64(float32(float64(t) * inv[i]))
				co, si := math.Cos(ang), math.Sin(ang)
				x1, x2 := row[i], row[i+half]
				row[i], row[i+half] = x1*co-x2*si, x2*co+x1*si
			}
		}
	}
}

// refAttention is causal GQA attention of q [n, nh, hd] over k, v [n, nkv, hd] with score
// scale s and a sliding window of w tokens (0: none).
func refAttention(q, k, v []float64, n, nh, nkv, hd int, s float64, w int) []float64 {
	att := make([]float64, n*nh*hd)
	for t := 0; t < n; t++ {
		lo := 0
		if w > 0 {
			lo = max(0, t-w+1)
		}
		for h := 0; h < nh; h++ {
			kh := h / (nh / nkv)
			sc := make([]float64, 0, t-lo+1)
			m := math.Inf(-1)
			for j := lo; j <= t; j++ {
				d := 0.0
				for e := 0; e < hd; e++ {
					d += q[(t*nh+h)*hd+e] * k[(j*nkv+kh)*hd+e]
				}
				sc = append(sc, d*s)
				m = math.Max(m, d*s)
			}
			z := 0.0
			for i := range sc {
				sc[i] = math.Exp(sc[i] - m)
				z += sc[i]
			}
			for i, j := 0, lo; j <= t; i, j = i+1, j+1 {
				for e := 0; e < hd; e++ {
					att[(t*nh+h)*hd+e] += sc[i] / z * v[(j*nkv+kh)*hd+e]
				}
			}
		}
	}
	return att
}

// refLogprobs turns final hidden states [n, c] into log p(ids[t+1] | ids[:t+1]) through the
// head weight [V, c] and a tanh cap (0: none).
func refLogprobs(x, head []float64, c, vocab int, softcap float64, ids []int32) []float64 {
	logits := lin(x, head, c)
	out := make([]float64, len(ids)-1)
	for t := 0; t+1 < len(ids); t++ {
		row := logits[t*vocab : (t+1)*vocab]
		m := math.Inf(-1)
		for j := range row {
			if softcap > 0 {
				row[j] = softcap * math.Tanh(row[j]/softcap)
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

func add(x, y []float64) {
	for i := range x {
		x[i] += y[i]
	}
}

// params64 reads a model's parameters in float64.
func params64(t *testing.T, m *Model) func(string) []float64 {
	return func(name string) []float64 {
		v, err := m.ParamFloat32(name)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]float64, len(v))
		for i, x := range v {
			out[i] = float64(x)
		}
		return out
	}
}

// gemma4Ref is Gemma4ForCausalLM's text decoder without per-layer inputs, shared KV layers or
// the MoE block. theta and partial are the full layers' proportional RoPE, localTheta the
// sliding layers' default one.
func gemma4Ref(a Arch, p func(string) []float64, ids []int32, theta, partial, localTheta float64) []float64 {
	c, nh, n, eps := a.Hidden, a.Heads, len(ids), float64(a.NormEps)
	emb := p(nameEmbed)
	scale := float64(embedScale(c, 0))
	x := make([]float64, n*c)
	for i, id := range ids {
		for j := 0; j < c; j++ {
			x[i*c+j] = emb[int(id)*c+j] * scale
		}
	}
	for l := 0; l < a.Layers; l++ {
		pn := func(s string) []float64 { return p(layerName(l, s)) }
		full := a.Global.Full[l]
		hd, nkv := a.HeadDim, a.KVHeads
		if full {
			hd, nkv = a.Global.HeadDim, a.Global.KVHeads
		}
		// inv_freq: default RoPE on the sliding layers, proportional on the full ones (the
		// first floor(partial * hd / 2) pairs at theta^(-2i/hd), the others unrotated).
		inv := make([]float64, hd/2)
		for i := range inv {
			if full {
				if i < int(math.Floor(partial*float64(hd)/2)) {
					inv[i] = float64(float32(1 / math.Pow(theta, float64(2*i)/float64(hd))))
				}
			} else {
				inv[i] = float64(float32(1 / math.Pow(localTheta, float64(2*i)/float64(hd))))
			}
		}
		h := refNorm(x, c, pn("input_layernorm.weight"), eps)
		q := refNorm(lin(h, pn("self_attn.q_proj.weight"), c), hd, pn("self_attn.q_norm.weight"), eps)
		kRaw := lin(h, pn("self_attn.k_proj.weight"), c)
		vRaw := kRaw
		if !(full && a.Global.KEqV) {
			vRaw = lin(h, pn("self_attn.v_proj.weight"), c)
		}
		k := refNorm(kRaw, hd, pn("self_attn.k_norm.weight"), eps)
		v := refNorm(vRaw, hd, nil, eps)
		refRope(q, n, nh, hd, inv)
		refRope(k, n, nkv, hd, inv)
		att := refAttention(q, k, v, n, nh, nkv, hd, 1, a.Windows[l])
		add(x, refNorm(lin(att, pn("self_attn.o_proj.weight"), nh*hd), c, pn("post_attention_layernorm.weight"), eps))
		h2 := refNorm(x, c, pn("pre_feedforward_layernorm.weight"), eps)
		g, u := lin(h2, pn("mlp.gate_proj.weight"), c), lin(h2, pn("mlp.up_proj.weight"), c)
		for i := range g {
			g[i] = gelu(g[i]) * u[i]
		}
		add(x, refNorm(lin(g, pn("mlp.down_proj.weight"), a.Intermediate), c, pn("post_feedforward_layernorm.weight"), eps))
		s := pn("layer_scalar")[0]
		for i := range x {
			x[i] *= s
		}
	}
	return refLogprobs(refNorm(x, c, p("model.norm.weight"), eps), emb, c, a.Vocab, float64(a.LogitSoftcap), ids)
}

// TestGemma4MatchesReference: the model's logprobs equal the float64 reference decoder's on a
// document longer than the sliding window (the gemma4_two_head_widths case: two head widths,
// values shared with the keys, v_norm, proportional RoPE, layer scalars, a softcap), and the
// features the case relies on move the result.
func TestGemma4MatchesReference(t *testing.T) {
	var a Arch
	for _, tc := range familyCases {
		if tc.name == "gemma4_two_head_widths" {
			a = tc.arch
		}
	}
	m := newTiny(t, newCPU(), a, Options{}, 5)
	p := params64(t, m)
	ids := []int32{3, 17, 0, 36, 5, 5, 21, 9, 30}
	got, err := m.Logprobs(ids)
	if err != nil {
		t.Fatal(err)
	}
	r := m.Arch.Rope
	want := gemma4Ref(m.Arch, p, ids, r.Theta, r.PartialRotaryFactor, m.Arch.SlidingRope.Theta)
	for i := range want {
		if d := math.Abs(float64(got[i]) - want[i]); d > 2e-5 {
			t.Errorf("logprob %d: model %.7f, reference %.7f", i, got[i], want[i])
		}
	}
	// The proportional RoPE's unrotated pairs matter: rotating every pair differs.
	off := gemma4Ref(m.Arch, p, ids, r.Theta, 1, m.Arch.SlidingRope.Theta)
	diff := 0.0
	for i := range off {
		diff = math.Max(diff, math.Abs(off[i]-want[i]))
	}
	if diff < 1e-4 {
		t.Errorf("rotating every pair of the full heads moved no logprob by 1e-4 (max %g): the case does not exercise proportional RoPE", diff)
	}
}

// lfm2Ref is Lfm2MoeForCausalLM: short convolutions, attention with q/k layernorms, dense
// SwiGLU and the sigmoid-routed experts with transformers' 1e-6 in the renormalisation.
func lfm2Ref(m *Model, p func(string) []float64, ids []int32) []float64 {
	a, cfg := m.Arch, m.Arch.Config
	c, n, eps := a.Hidden, len(ids), float64(a.NormEps)
	emb := p(nameEmbed)
	x := make([]float64, n*c)
	for i, id := range ids {
		copy(x[i*c:(i+1)*c], emb[int(id)*c:(int(id)+1)*c])
	}
	hd, nh, nkv := a.HeadDim, a.Heads, a.KVHeads
	inv := make([]float64, hd/2)
	for i := range inv {
		inv[i] = float64(float32(1 / math.Pow(a.Rope.Theta, float64(2*i)/float64(hd))))
	}
	addBias := func(y []float64, name string) {
		b := p(name)
		for i := range y {
			y[i] += b[i%len(b)]
		}
	}
	for l := 0; l < a.Layers; l++ {
		pn := func(s string) []float64 { return p(layerName(l, s)) }
		h := refNorm(x, c, pn("operator_norm.weight"), eps)
		var o []float64
		if a.IsConv(l) {
			bcx := lin(h, pn("conv.in_proj.weight"), c)
			if a.Conv.Bias {
				addBias(bcx, layerName(l, "conv.in_proj.bias"))
			}
			w, taps := pn("conv.conv.weight"), a.Conv.Taps
			bx := make([]float64, n*c)
			for t := 0; t < n; t++ {
				for j := 0; j < c; j++ {
					bx[t*c+j] = bcx[t*3*c+j] * bcx[t*3*c+2*c+j]
				}
			}
			y := make([]float64, n*c)
			for t := 0; t < n; t++ {
				for j := 0; j < c; j++ {
					s := 0.0
					if a.Conv.Bias {
						s = pn("conv.conv.bias")[j]
					}
					// nn.Conv1d with padding L-1, first n outputs: tap k reads t-(L-1)+k.
					for k := 0; k < taps; k++ {
						if src := t - (taps - 1) + k; src >= 0 {
							s += w[j*taps+k] * bx[src*c+j]
						}
					}
					y[t*c+j] = bcx[t*3*c+c+j] * s
				}
			}
			o = lin(y, pn("conv.out_proj.weight"), c)
			if a.Conv.Bias {
				addBias(o, layerName(l, "conv.out_proj.bias"))
			}
		} else {
			q := refNorm(lin(h, pn("self_attn.q_proj.weight"), c), hd, pn("self_attn.q_layernorm.weight"), eps)
			k := refNorm(lin(h, pn("self_attn.k_proj.weight"), c), hd, pn("self_attn.k_layernorm.weight"), eps)
			v := lin(h, pn("self_attn.v_proj.weight"), c)
			refRope(q, n, nh, hd, inv)
			refRope(k, n, nkv, hd, inv)
			o = lin(refAttention(q, k, v, n, nh, nkv, hd, 1/math.Sqrt(float64(hd)), 0), pn("self_attn.out_proj.weight"), nh*hd)
		}
		add(x, o)
		h2 := refNorm(x, c, pn("ffn_norm.weight"), eps)
		mlp := func(pre string, in []float64, width int) []float64 {
			g, u := lin(in, p(pre+"w1.weight"), c), lin(in, p(pre+"w3.weight"), c)
			for i := range g {
				g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
			}
			return lin(g, p(pre+"w2.weight"), width)
		}
		if !cfg.IsMoELayer(l) {
			add(x, mlp(layerName(l, "feed_forward."), h2, a.Intermediate))
			continue
		}
		logits := lin(h2, pn("feed_forward.gate.weight"), c)
		var bias []float64
		if a.RouterBias {
			bias = pn("feed_forward.expert_bias")
		}
		e := a.Experts
		ff := make([]float64, n*c)
		for t := 0; t < n; t++ {
			score := make([]float64, e)
			rank := make([]int, e)
			for j := 0; j < e; j++ {
				score[j] = 1 / (1 + math.Exp(-logits[t*e+j]))
				rank[j] = j
			}
			key := func(j int) float64 {
				if bias != nil {
					return score[j] + bias[j]
				}
				return score[j]
			}
			sort.SliceStable(rank, func(i, j int) bool { return key(rank[i]) > key(rank[j]) })
			sel := rank[:a.TopK]
			sum := 0.0
			for _, j := range sel {
				sum += score[j]
			}
			for _, j := range sel {
				wgt := score[j]
				if cfg.NormTopKProb {
					wgt /= sum + 1e-6
				}
				wgt *= cfg.RoutedScalingFactor
				y := mlp(layerName(l, "feed_forward.experts.")+itoa(j)+".", h2[t*c:(t+1)*c], a.ExpertIntermediate)
				for d := 0; d < c; d++ {
					ff[t*c+d] += wgt * y[d]
				}
			}
		}
		add(x, ff)
	}
	head := emb
	if !a.Tied {
		head = p(nameLMHead)
	}
	return refLogprobs(refNorm(x, c, p("model.embedding_norm.weight"), eps), head, c, a.Vocab, 0, ids)
}

func itoa(i int) string {
	const d = "0123456789"
	if i < 10 {
		return d[i : i+1]
	}
	return itoa(i/10) + d[i%10:i%10+1]
}

// TestLFM2MatchesReference: the model's logprobs equal the float64 reference decoder's for
// both LFM2-MoE cases (3-tap conv layers with biases, a dense layer and the expert bias; a
// 4-tap conv without biases, every layer sparse, raw weights, an untied head).
func TestLFM2MatchesReference(t *testing.T) {
	for _, tc := range moeCases {
		if tc.fam != "lfm2_moe" {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			m := tinyMoE(t, tc.fam, tc.mod)
			ids := []int32{3, 17, 0, 36, 5, 5, 21, 9, 30, 2, 11}
			got, err := m.Logprobs(ids)
			if err != nil {
				t.Fatal(err)
			}
			want := lfm2Ref(m, params64(t, m), ids)
			for i := range want {
				if d := math.Abs(float64(got[i]) - want[i]); d > 2e-5 {
					t.Errorf("logprob %d: model %.7f, reference %.7f", i, got[i], want[i])
				}
			}
		})
	}
}
