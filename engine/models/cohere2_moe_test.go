package models

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
)

// cohereRef is a float64 decoder written from transformers 5's modeling_cohere2_moe.py alone
// (Cohere2MoeDecoderLayer, Cohere2MoeAttention, Cohere2MoeSparseMoeBlock, its rotary
// embedding and Cohere2MoeForCausalLM); it shares no code with the model. The switches turn
// one of the family's features into its common alternative, for the tests that check each
// feature moves the result.
type cohereRef struct {
	c *config.Config
	p map[string][]float64

	sequential   bool // x + attn, then + mlp(norm(mid)) with the same norm, as Llama
	halfRoPE     bool // rotate (i, i+R/2) instead of (2i, 2i+1)
	ropeAll      bool // rotate every layer
	sumShared    bool // add the shared expert even under "average"
	noLogitScale bool // leave the logits unscaled
}

func (r cohereRef) norm(x []float64, module string) []float64 {
	w := r.p[module+".weight"]
	c := len(w)
	out := make([]float64, len(x))
	for i := 0; i < len(x)/c; i++ {
		row := x[i*c : (i+1)*c]
		mean, eps := 0.0, r.c.CohereRMSNormEps
		if eps == 0 {
			// Cohere2MoeLayerNorm: centred, biased variance, weight only.
			eps = r.c.LayerNormEps
			for _, v := range row {
				mean += v
			}
			mean /= float64(c)
		}
		vr := 0.0
		for _, v := range row {
			vr += (v - mean) * (v - mean)
		}
		rs := 1 / math.Sqrt(vr/float64(c)+eps)
		for j, v := range row {
			out[i*c+j] = w[j] * (v - mean) * rs
		}
	}
	return out
}

func (r cohereRef) proj(x []float64, module string, in int, bias bool) []float64 {
	y := lin(x, r.p[module+".weight"], in)
	if bias {
		b := r.p[module+".bias"]
		for i := range y {
			y[i] += b[i%len(b)]
		}
	}
	return y
}

func (r cohereRef) swiglu(x []float64, pre string, in int) []float64 {
	g, u := r.proj(x, pre+"gate_proj", in, false), r.proj(x, pre+"up_proj", in, false)
	for i := range g {
		g[i] = silu(g[i]) * u[i]
	}
	return r.proj(g, pre+"down_proj", len(g)/(len(x)/in), false)
}

// moe is Cohere2MoeSparseMoeBlock on the normalised rows x.
func (r cohereRef) moe(x []float64, pre string) []float64 {
	c := r.c
	h, e, k, n := c.HiddenSize, c.NumExperts, c.NumExpertsPerTok, len(x)/c.HiddenSize
	logits := r.proj(x, pre+"gate", h, false)
	out := make([]float64, n*h)
	for t := 0; t < n; t++ {
		row := logits[t*e : (t+1)*e]
		idx := make([]int, e)
		for j := range idx {
			idx[j] = j
		}
		sort.SliceStable(idx, func(a, b int) bool { return row[idx[a]] > row[idx[b]] })
		sel := idx[:k]
		w := make([]float64, k)
		sum := 0.0
		if c.ExpertSelectionFn == "sigmoid" {
			for j, s := range sel {
				w[j] = 1 / (1 + math.Exp(-row[s]))
				sum += w[j]
			}
			if c.NormTopKProb {
				for j := range w {
					w[j] /= sum
				}
			}
		} else {
			// softmax over the top-k logits
			for j, s := range sel {
				w[j] = math.Exp(row[s] - row[sel[0]])
				sum += w[j]
			}
			for j := range w {
				w[j] /= sum
			}
		}
		xt := x[t*h : (t+1)*h]
		for j, s := range sel {
			y := r.swiglu(xt, pre+"experts."+strconv.Itoa(s)+".", h)
			for d := range y {
				out[t*h+d] += w[j] * y[d]
			}
		}
		if c.NumSharedExperts > 0 {
			y := r.swiglu(xt, pre+"shared_experts.", h)
			avg := c.SharedExpertCombinationStrategy == "average" && !r.sumShared
			for d := range y {
				out[t*h+d] += y[d]
				if avg {
					out[t*h+d] /= 2
				}
			}
		}
	}
	return out
}

func (r cohereRef) logprobs(ids []int32) []float64 {
	c := r.c
	h, hd, nh, nkv, n := c.HiddenSize, c.HeadDim, c.NumAttentionHeads, c.NumKeyValueHeads, len(ids)
	emb := r.p[nameEmbed]
	x := make([]float64, n*h)
	for i, id := range ids {
		copy(x[i*h:(i+1)*h], emb[int(id)*h:(int(id)+1)*h])
	}
	inv := make([]float64, hd/2)
	for i := range inv {
		inv[i] = 1 / math.Pow(c.Rope.Theta, float64(2*i)/float64(hd))
	}
	rot := func(v []float64, heads int) {
		for t := 0; t < n; t++ {
			for hh := 0; hh < heads; hh++ {
				row := v[(t*heads+hh)*hd : (t*heads+hh+1)*hd]
				for i := range inv {
					co, si := math.Cos(float64(t)*inv[i]), math.Sin(float64(t)*inv[i])
					i1, i2 := 2*i, 2*i+1
					if r.halfRoPE {
						i1, i2 = i, i+hd/2
					}
					x1, x2 := row[i1], row[i2]
					row[i1], row[i2] = x1*co-x2*si, x2*co+x1*si
				}
			}
		}
	}
	bias := c.AttentionBias
	for l := 0; l < c.NumHiddenLayers; l++ {
		pre := layerName(l, "")
		sliding := c.SlidingWindow > 0 && c.LayerTypes[l] == config.SlidingAttention
		dense := c.MLPLayerTypes[l] == "dense"
		in := r.norm(x, pre+"input_layernorm")
		q := r.proj(in, pre+"self_attn.q_proj", h, bias)
		k := r.proj(in, pre+"self_attn.k_proj", h, bias)
		v := r.proj(in, pre+"self_attn.v_proj", h, bias)
		if sliding || (dense && c.PrefixDenseSlidingWindowPattern == 1) || r.ropeAll {
			rot(q, nh)
			rot(k, nkv)
		}
		att := make([]float64, n*nh*hd)
		for t := 0; t < n; t++ {
			lo := 0
			if sliding {
				lo = max(0, t-c.SlidingWindow+1)
			}
			for hh := 0; hh < nh; hh++ {
				kh := hh / (nh / nkv)
				sc := make([]float64, t+1)
				m := math.Inf(-1)
				for j := lo; j <= t; j++ {
					s := 0.0
					for d := 0; d < hd; d++ {
						s += q[(t*nh+hh)*hd+d] * k[(j*nkv+kh)*hd+d]
					}
					sc[j] = s / math.Sqrt(float64(hd))
					m = math.Max(m, sc[j])
				}
				z := 0.0
				for j := lo; j <= t; j++ {
					z += math.Exp(sc[j] - m)
				}
				for j := lo; j <= t; j++ {
					pj := math.Exp(sc[j]-m) / z
					for d := 0; d < hd; d++ {
						att[(t*nh+hh)*hd+d] += pj * v[(j*nkv+kh)*hd+d]
					}
				}
			}
		}
		o := r.proj(att, pre+"self_attn.o_proj", nh*hd, bias)
		ffnIn := in
		if r.sequential {
			for i := range x {
				x[i] += o[i]
			}
			ffnIn = r.norm(x, pre+"input_layernorm")
			for i := range o {
				o[i] = 0
			}
		}
		var f []float64
		if dense {
			f = r.swiglu(ffnIn, pre+"mlp.", h)
		} else {
			f = r.moe(ffnIn, pre+"mlp.")
		}
		for i := range x {
			x[i] += o[i] + f[i]
		}
	}
	x = r.norm(x, "model.norm")
	head := nameLMHead
	if c.TieWordEmbeddings {
		head = nameEmbed
	}
	logits := lin(x, r.p[head], h)
	out := make([]float64, n-1)
	vocab := c.VocabSize
	for t := 0; t < n-1; t++ {
		row := logits[t*vocab : (t+1)*vocab]
		m := math.Inf(-1)
		for j := range row {
			if !r.noLogitScale {
				row[j] *= c.LogitScale
			}
			m = math.Max(m, row[j])
		}
		z := 0.0
		for _, v := range row {
			z += math.Exp(v - m)
		}
		out[t] = row[ids[t+1]] - m - math.Log(z)
	}
	return out
}

// cohereCases are the configurations the family's tests run, every feature switched on in
// one of them (also in moeCases): a sliding layer, a full one and a sliding one; a dense first
// layer of its own width, rotated as a dense prefix layer under pattern 1; attention biases;
// softmax routing with the shared expert averaged in; an untied head; LayerNorms. The second
// case: RMSNorms (rms_norm_eps), sigmoid routing without renormalisation (top 3), the shared
// expert summed, a dense full-attention layer left unrotated (prefix pattern 2).
var cohereCases = []struct {
	name string
	mod  func(*config.Config)
}{
	{"softmax_average", func(c *config.Config) {
		c.NumHiddenLayers, c.SlidingWindow, c.AttentionBias, c.TieWordEmbeddings = 3, 3, true, false
		c.LayerTypes = []string{config.FullAttention, config.SlidingAttention, config.FullAttention}
		c.MLPLayerTypes = []string{"dense", "sparse", "sparse"}
		c.NumSharedExperts, c.PrefixDenseIntermediateSize, c.LogitScale = 2, 20, 0.7
	}},
	{"sigmoid_sum_rms", func(c *config.Config) {
		c.NumHiddenLayers, c.SlidingWindow, c.NumExpertsPerTok = 3, 4, 3
		c.LayerTypes = []string{config.FullAttention, config.SlidingAttention, config.FullAttention}
		c.MLPLayerTypes = []string{"dense", "sparse", "sparse"}
		c.ExpertSelectionFn, c.NormTopKProb, c.SharedExpertCombinationStrategy = "sigmoid", false, "sum"
		c.CohereRMSNormEps, c.PrefixDenseSlidingWindowPattern, c.LogitScale = 1e-6, 2, 1.3
	}},
}

// refParams reads every parameter of m as float64.
func refParams(t *testing.T, m *Model) map[string][]float64 {
	p := map[string][]float64{}
	get := float64s(t, m)
	for _, s := range m.Specs {
		p[s.Name] = get(s.Name)
	}
	return p
}

// TestCohere2MoEMatchesReference: the model's logprobs equal the float64 reference decoder's,
// its gradient of the summed cross-entropy matches the reference's central differences along a
// random direction of every parameter, and each of the family's features (the parallel layer,
// the interleaved pairs, rotation on the chosen layers only, logit_scale, the averaged shared
// expert) moves the reference's result, so that each is checked against its definition.
func TestCohere2MoEMatchesReference(t *testing.T) {
	ids := []int32{3, 17, 0, 36, 5, 5, 21, 9, 30, 2, 40}
	for _, tc := range cohereCases {
		t.Run(tc.name, func(t *testing.T) {
			m := tinyMoE(t, "cohere2_moe", tc.mod)
			ref := cohereRef{c: m.Config(), p: refParams(t, m)}
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
			offs := map[string]func(*cohereRef){
				"sequential layer":    func(r *cohereRef) { r.sequential = true },
				"half-split pairs":    func(r *cohereRef) { r.halfRoPE = true },
				"every layer rotated": func(r *cohereRef) { r.ropeAll = true },
				"unscaled logits":     func(r *cohereRef) { r.noLogitScale = true },
			}
			if m.Config().SharedExpertCombinationStrategy == "average" {
				offs["shared expert summed"] = func(r *cohereRef) { r.sumShared = true }
			}
			for name, off := range offs {
				o := ref
				off(&o)
				diff := 0.0
				for i, v := range o.logprobs(ids) {
					diff = math.Max(diff, math.Abs(v-want[i]))
				}
				if diff < 1e-3 {
					t.Errorf("%s: the reference moved no logprob by 1e-3 (max %g): the case does not exercise the feature", name, diff)
				}
			}

			// Gradients of the summed cross-entropy of one document.
			if err := m.ZeroGrads(); err != nil {
				t.Fatal(err)
			}
			if _, _, err := m.ForwardBackward(rowsBatch([][]int32{ids}), 1); err != nil {
				t.Fatal(err)
			}
			grads := allGrads(t, m)
			loss := func(p map[string][]float64) float64 {
				r := ref
				r.p = p
				s := 0.0
				for _, v := range r.logprobs(ids) {
					s -= v
				}
				return s
			}
			rng := rand.New(rand.NewPCG(7, 11))
			for _, s := range m.Specs {
				p0 := ref.p[s.Name]
				dir := make([]float64, len(p0))
				nrm := 0.0
				for i := range dir {
					dir[i] = rng.NormFloat64()
					nrm += dir[i] * dir[i]
				}
				analytic := 0.0
				for i := range dir {
					dir[i] /= math.Sqrt(nrm)
					analytic += dir[i] * float64(grads[s.Name][i])
				}
				const eps = 1e-5
				shifted := func(sign float64) float64 {
					p := make(map[string][]float64, len(ref.p))
					for k, v := range ref.p {
						p[k] = v
					}
					q := slices.Clone(p0)
					for i := range q {
						q[i] += sign * eps * dir[i]
					}
					p[s.Name] = q
					return loss(p)
				}
				numeric := (shifted(1) - shifted(-1)) / (2 * eps)
				if math.Abs(numeric-analytic) > 2e-4+2e-3*math.Abs(numeric) {
					t.Errorf("%s: reference directional derivative %.6g, model gradient gives %.6g", s.Name, numeric, analytic)
				}
			}
		})
	}
}

// TestCohere2MoEDocumentsAreIndependent: two documents packed in one batch give the loss and
// the gradients of the two run apart (positions restart, attention stays inside each).
func TestCohere2MoEDocumentsAreIndependent(t *testing.T) {
	m := tinyMoE(t, "cohere2_moe", cohereCases[0].mod)
	a, b := []int32{3, 9, 17, 2, 30, 8, 8}, []int32{40, 1, 5, 22, 13, 6}
	run := func(rows ...[]int32) (float64, map[string][]float32) {
		if err := m.ZeroGrads(); err != nil {
			t.Fatal(err)
		}
		var l float64
		for _, r := range rows {
			li, _, err := m.ForwardBackward(rowsBatch([][]int32{r}), 1)
			if err != nil {
				t.Fatal(err)
			}
			l += li
		}
		return l, allGrads(t, m)
	}
	if err := m.ZeroGrads(); err != nil {
		t.Fatal(err)
	}
	packed, _, err := m.ForwardBackward(rowsBatch([][]int32{a, b}), 1)
	if err != nil {
		t.Fatal(err)
	}
	pg := allGrads(t, m)
	apart, ag := run(a, b)
	if math.Abs(packed-apart) > 1e-4*math.Abs(apart) {
		t.Errorf("packed loss %v, apart %v", packed, apart)
	}
	for name, g := range ag {
		if d := relDiff(pg[name], g); d > 1e-4 {
			t.Errorf("%s: packed and separate gradients differ (relative %g)", name, d)
		}
	}
}

// TestCohere2MoESaveLoad: Save writes transformers' checkpoint names (per-expert experts, the
// shared experts, one norm per layer, the untied head) and the config.json it reads; Load
// reads them back into the same model, and a checkpoint with transformers 5's fused in-memory
// expert tensors loads too.
func TestCohere2MoESaveLoad(t *testing.T) {
	m := tinyMoE(t, "cohere2_moe", cohereCases[0].mod)
	dir := t.TempDir()
	if err := m.Save(dir, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	names := ck.Names()
	ck.Close()
	for _, n := range []string{"model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.gate.weight",
		"model.layers.1.mlp.experts.5.down_proj.weight", "model.layers.2.mlp.shared_experts.up_proj.weight",
		"model.layers.2.input_layernorm.weight", "model.layers.1.self_attn.o_proj.bias", "model.norm.weight", "lm_head.weight"} {
		if !slices.Contains(names, n) {
			t.Errorf("%s not saved", n)
		}
	}
	for _, n := range names {
		if strings.Contains(n, "post_attention_layernorm") || strings.HasSuffix(n, "layernorm.bias") || n == "model.norm.bias" {
			t.Errorf("%s saved: Cohere2MoeDecoderLayer has one norm, without bias", n)
		}
	}
	back, err := Load(dir, newCPU(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	if len(back.Unused) != 0 {
		t.Errorf("tensors not used on load: %v", back.Unused)
	}
	cb := back.Config()
	if cb.LogitScale != 0.7 || cb.NumSharedExperts != 2 || cb.PrefixDenseIntermediateSize != 20 || !slices.Equal(cb.MLPLayerTypes, m.Config().MLPLayerTypes) {
		t.Errorf("config after the round trip: %+v", cb)
	}
	ids := []int32{3, 9, 17, 2, 30, 8, 8, 40}
	x, err := m.Logprobs(ids)
	if err != nil {
		t.Fatal(err)
	}
	y, err := back.Logprobs(ids)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(x, y) {
		t.Errorf("logprobs after the round trip %v, before %v", y, x)
	}
	// transformers 5's in-memory names: the experts fused per layer.
	ck, err = safetensors.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	e, in, c := m.Arch.Experts, m.Arch.ExpertIntermediate, m.Arch.Hidden
	var out []safetensors.Tensor
	for _, n := range ck.Names() {
		if strings.Contains(n, ".mlp.experts.") {
			continue
		}
		info, _ := ck.Tensor(n)
		out = append(out, safetensors.Tensor{Name: n, DType: info.DType, Shape: info.Shape, Data: info.Data})
	}
	for l := 1; l < 3; l++ {
		pre := layerName(l, "mlp.experts.")
		var gu, dn []byte
		for x := 0; x < e; x++ {
			for _, p := range []string{"gate_proj", "up_proj"} {
				info, _ := ck.Tensor(pre + strconv.Itoa(x) + "." + p + ".weight")
				gu = append(gu, info.Data...)
			}
			info, _ := ck.Tensor(pre + strconv.Itoa(x) + ".down_proj.weight")
			dn = append(dn, info.Data...)
		}
		out = append(out, safetensors.Tensor{Name: pre + "gate_up_proj", DType: safetensors.F32, Shape: []int{e, 2 * in, c}, Data: gu},
			safetensors.Tensor{Name: pre + "down_proj", DType: safetensors.F32, Shape: []int{e, c, in}, Data: dn})
	}
	checkLoadsAs(t, m, dir, out, "loading the fused experts")
}

// TestCohere2MoERefusesScaledRope: rope types other than default are refused when the model is
// built, naming the rope type.
func TestCohere2MoERefusesScaledRope(t *testing.T) {
	c, err := config.Parse([]byte(`{"model_type": "cohere2_moe", "num_hidden_layers": 2, "hidden_size": 16,
		"intermediate_size": 8, "num_attention_heads": 4, "head_dim": 4, "num_experts": 4, "vocab_size": 41,
		"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}`), "cfg.json")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(c, newCPU(), Options{}); err == nil || !strings.Contains(err.Error(), "linear") {
		t.Errorf("linear rope: %v, want a refusal naming it", err)
	}
}
