package models

import (
	"math"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// gemmaRef is Gemma 3's text decoder written out in float64 from its definition (transformers'
// Gemma3ForCausalLM): the oracle of TestGemma3MatchesReference. p reads a parameter by name.
type gemmaRef struct {
	a Arch
	p func(name string) []float64
}

// norm is Gemma's RMSNorm: x / sqrt(mean(x^2) + eps) * (1 + w), over rows of len(w).
func (g gemmaRef) norm(x []float64, w []float64) []float64 {
	out := make([]float64, len(x))
	c := len(w)
	for r := 0; r < len(x)/c; r++ {
		s := 0.0
		for _, v := range x[r*c : (r+1)*c] {
			s += v * v
		}
		rs := 1 / math.Sqrt(s/float64(c)+float64(g.a.NormEps))
		for j := 0; j < c; j++ {
			out[r*c+j] = x[r*c+j] * rs * (1 + w[j])
		}
	}
	return out
}

// lin is x [T,in] @ W^T for W [out,in].
func lin(x, w []float64, in int) []float64 {
	t, out := len(x)/in, len(w)/in
	y := make([]float64, t*out)
	for i := 0; i < t; i++ {
		for o := 0; o < out; o++ {
			s := 0.0
			for k := 0; k < in; k++ {
				s += x[i*in+k] * w[o*in+k]
			}
			y[i*out+o] = s
		}
	}
	return y
}

func gelu(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

// logprobs runs one document ids and returns log p(ids[t+1] | ids[:t+1]).
func (g gemmaRef) logprobs(ids []int32) []float64 {
	a := g.a
	c, hd, nh, nkv := a.Hidden, a.HeadDim, a.Heads, a.KVHeads
	n := len(ids)
	emb := g.p(nameEmbed)
	scale := float64(embedScale(c, 0))
	x := make([]float64, n*c)
	for i, id := range ids {
		for j := 0; j < c; j++ {
			x[i*c+j] = emb[int(id)*c+j] * scale
		}
	}
	rot := func(v []float64, heads int, r backend.RoPEConfig) {
		inv, s, err := r.Compute(r.MaxPositionEmbeddings)
		if err != nil {
			panic(err)
		}
		half := len(inv)
		for t := 0; t < n; t++ {
			for h := 0; h < heads; h++ {
				row := v[(t*heads+h)*hd : (t*heads+h+1)*hd]
				for i := 0; i < half; i++ {
					ang := float64(float32(t) * inv[i])
					co, si := math.Cos(ang)*float64(s), math.Sin(ang)*float64(s)
					x1, x2 := row[i], row[i+half]
					row[i], row[i+half] = x1*co-x2*si, x2*co+x1*si
				}
			}
		}
	}
	for l := 0; l < a.Layers; l++ {
		pn := func(s string) []float64 { return g.p(layerName(l, s)) }
		h := g.norm(x, pn("input_layernorm.weight"))
		q := g.norm(lin(h, pn("self_attn.q_proj.weight"), c), pn("self_attn.q_norm.weight"))
		k := g.norm(lin(h, pn("self_attn.k_proj.weight"), c), pn("self_attn.k_norm.weight"))
		v := lin(h, pn("self_attn.v_proj.weight"), c)
		r := a.Rope
		if a.LocalRope[l] {
			r = *a.SlidingRope
		}
		rot(q, nh, r)
		rot(k, nkv, r)
		att := make([]float64, n*nh*hd)
		for t := 0; t < n; t++ {
			for hh := 0; hh < nh; hh++ {
				kh := hh / (nh / nkv)
				var sc []float64
				lo := 0
				if w := a.Windows[l]; w > 0 {
					lo = max(0, t-w+1)
				}
				m := math.Inf(-1)
				for j := lo; j <= t; j++ {
					s := 0.0
					for d := 0; d < hd; d++ {
						s += q[(t*nh+hh)*hd+d] * k[(j*nkv+kh)*hd+d]
					}
					s *= float64(a.AttnScale)
					sc = append(sc, s)
					m = math.Max(m, s)
				}
				z := 0.0
				for i := range sc {
					sc[i] = math.Exp(sc[i] - m)
					z += sc[i]
				}
				for i, j := 0, lo; j <= t; i, j = i+1, j+1 {
					for d := 0; d < hd; d++ {
						att[(t*nh+hh)*hd+d] += sc[i] / z * v[(j*nkv+kh)*hd+d]
					}
				}
			}
		}
		o := g.norm(lin(att, pn("self_attn.o_proj.weight"), nh*hd), pn("post_attention_layernorm.weight"))
		for i := range x {
			x[i] += o[i]
		}
		h2 := g.norm(x, pn("pre_feedforward_layernorm.weight"))
		gt, up := lin(h2, pn("mlp.gate_proj.weight"), c), lin(h2, pn("mlp.up_proj.weight"), c)
		for i := range gt {
			gt[i] = gelu(gt[i]) * up[i]
		}
		f := g.norm(lin(gt, pn("mlp.down_proj.weight"), a.Intermediate), pn("post_feedforward_layernorm.weight"))
		for i := range x {
			x[i] += f[i]
		}
	}
	hf := g.norm(x, g.p(nameFinalNorm))
	logits := lin(hf, emb, c)
	v := a.Vocab
	out := make([]float64, n-1)
	for t := 0; t+1 < n; t++ {
		row := logits[t*v : (t+1)*v]
		m := math.Inf(-1)
		for j := range row {
			if a.LogitSoftcap > 0 {
				cp := float64(a.LogitSoftcap)
				row[j] = cp * math.Tanh(row[j]/cp)
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

// TestGemma3MatchesReference: the model's logprobs equal the float64 reference decoder's on a
// document longer than the sliding window, with every Gemma feature on (the
// gemma3_all_features case), so that each one is checked against its definition, not only
// against the model's own gradient.
func TestGemma3MatchesReference(t *testing.T) {
	var a Arch
	for _, tc := range familyCases {
		if tc.name == "gemma3_all_features" {
			a = tc.arch
		}
	}
	m := newTiny(t, newCPU(), a, Options{}, 5)
	ref := gemmaRef{a: m.Arch, p: func(name string) []float64 {
		v, err := m.ParamFloat32(name)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]float64, len(v))
		for i, x := range v {
			out[i] = float64(x)
		}
		return out
	}}
	ids := []int32{3, 17, 0, 36, 5, 5, 21, 9, 30}
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
	// Each feature changes the result: without the cap, the model differs from the reference.
	ref.a.LogitSoftcap = 0
	off := ref.logprobs(ids)
	diff := 0.0
	for i := range off {
		diff = math.Max(diff, math.Abs(off[i]-want[i]))
	}
	if diff < 1e-3 {
		t.Errorf("the softcap of 2 moved no logprob by 1e-3 (max %g): the case does not exercise it", diff)
	}
}
