package models

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
)

// familyCases cover every structural variant of the dense families.
var familyCases = []struct {
	name string
	arch Arch
}{
	{"llama", tinyArch("llama", nil)},
	{"llama_bias_tied", tinyArch("llama", func(a *Arch) { a.QKVBias, a.OBias, a.MLPBias, a.Tied = true, true, true, true })},
	{"llama3_rope_mha", tinyArch("llama", func(a *Arch) {
		a.KVHeads = 4
		a.Rope = backend.RoPEConfig{Type: "llama3", Theta: 500000, MaxPositionEmbeddings: 64, Factor: 8,
			LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8}
	})},
	{"mistral_window", tinyArch("mistral", func(a *Arch) { a.Windows = []int{3, 3} })},
	{"qwen2_yarn", tinyArch("qwen2", func(a *Arch) {
		a.Tied = true
		a.Rope = backend.RoPEConfig{Type: "yarn", Theta: 10000, MaxPositionEmbeddings: 64, Factor: 4, OriginalMaxPositionEmbeddings: 16}
	})},
	{"qwen3_qknorm_headdim", tinyArch("qwen3", func(a *Arch) { a.HeadDim = 8; a.Heads = 2; a.KVHeads = 1; a.Windows = []int{0, 4} })},
	{"qwen3_partial_rotary", tinyArch("qwen3", func(a *Arch) { a.HeadDim = 8; a.Rope.PartialRotaryFactor = 0.5 })},
	// Norms on the branch outputs only, q/k norms over the whole projections.
	{"olmo2_post_norms", tinyArch("olmo2", nil)},
	{"olmo3_window", tinyArch("olmo3", func(a *Arch) { a.Windows = []int{3, 0} })},
	// Fused qkv_proj and gate_up_proj; longrope over half of each head, with the long factors
	// (every document of the tests is longer than the original context of 2; a batch's factors
	// depend on its longest document, so packing documents on both sides of it would change
	// them, as in transformers).
	{"phi3_fused_longrope", tinyArch("phi3", func(a *Arch) {
		a.HeadDim = 8
		a.Rope = backend.RoPEConfig{Type: "longrope", Theta: 10000, MaxPositionEmbeddings: 64, PartialRotaryFactor: 0.5,
			OriginalMaxPositionEmbeddings: 2, ShortFactor: []float64{1, 1.5}, LongFactor: []float64{2, 5}}
	})},
	{"granite_multipliers", tinyArch("granite", func(a *Arch) {
		a.EmbedScale, a.ResidualScale, a.AttnScale, a.LogitScale = 3, 0.5, 0.3, 0.25
	})},
	{"smollm3_nope_layer", tinyArch("smollm3", func(a *Arch) { a.NoRoPE = []bool{false, true}; a.Windows = []int{0, 3} })},
	// Four norms per layer, q/k/v biases, fused gate_up_proj, interleaved rotation of half
	// of each head.
	{"glm4_sandwich_interleaved", tinyArch("glm4", func(a *Arch) { a.HeadDim = 8; a.Rope.PartialRotaryFactor = 0.5 })},
	// Gemma 3 with every feature on: sandwich norms with 1 + w gains, scaled embeddings, GeGLU,
	// a sliding layer with its own RoPE base beside a full one with linear scaling, the
	// query_pre_attn_scalar score scale and final-logit softcapping at a cap that bends.
	// gpt-oss's attention: per-head sinks in the softmax, q/k/v/o biases, a sliding layer.
	{"mistral_sinks_window", tinyArch("mistral", func(a *Arch) {
		a.Sinks, a.QKVBias, a.OBias = true, true, true
		a.Windows = []int{3, 0}
	})},
	// gpt-oss: sinks, biases, a sliding layer and its expert block (router bias, expert
	// biases, clamped SwiGLU), 4 experts of 6, top-2.
	{"gpt_oss_experts", tinyArch("gpt_oss", func(a *Arch) {
		a.Windows = []int{3, 0}
		a.Experts, a.TopK, a.ExpertIntermediate = 4, 2, 6
		a.Rope = backend.RoPEConfig{Type: "yarn", Theta: 10000, MaxPositionEmbeddings: 64, Factor: 4, OriginalMaxPositionEmbeddings: 16}
	})},
	// Gemma 4: a sliding layer of 4-wide heads beside a full layer of 8-wide heads over one
	// key/value head shared with the values, v_norm, unscaled scores, proportional RoPE over
	// half of the full heads, w gains, layer scalars (set by perturb), a final-logit cap.
	{"gemma4_two_head_widths", tinyArch("gemma4_text", func(a *Arch) {
		a.Windows = []int{3, 0}
		a.LocalRope = []bool{true, false}
		a.Global = config.GlobalShape{Full: []bool{false, true}, HeadDim: 8, KVHeads: 1, KEqV: true}
		a.SlidingRope = &backend.RoPEConfig{Theta: 100, MaxPositionEmbeddings: 64}
		a.Rope = backend.RoPEConfig{Type: "proportional", PartialRotaryFactor: 0.5, Theta: 10000, MaxPositionEmbeddings: 64}
		a.LogitSoftcap = 2
	})},
	// Gemma 4's optional parts: per-layer inputs of width 4, a third (sliding) layer that
	// attends over the first layer's keys and values with a double-wide MLP, and an MoE block
	// of 3 experts (top-2) beside every MLP.
	{"gemma4_all_parts", tinyArch("gemma4_text", func(a *Arch) {
		a.Layers = 3
		a.Windows = []int{3, 0, 3}
		a.LocalRope = []bool{true, false, true}
		a.Global = config.GlobalShape{Full: []bool{false, true, false}, HeadDim: 8, KVHeads: 2,
			PerLayerInput: 4, PerLayerVocab: 37, SharedFrom: []int{-1, -1, 0}, WideMLP: []bool{false, false, true},
			BesideExperts: 3, BesideWidth: 6, BesideTopK: 2}
		a.SlidingRope = &backend.RoPEConfig{Theta: 100, MaxPositionEmbeddings: 64}
		a.Rope = backend.RoPEConfig{Type: "proportional", PartialRotaryFactor: 0.5, Theta: 10000, MaxPositionEmbeddings: 64}
		a.LogitSoftcap = 2
	})},
	{"gemma3_all_features", tinyArch("gemma3_text", func(a *Arch) {
		a.Windows = []int{3, 0}
		a.LocalRope = []bool{true, false}
		a.SlidingRope = &backend.RoPEConfig{Theta: 100, MaxPositionEmbeddings: 64}
		a.Rope = backend.RoPEConfig{Type: "linear", Factor: 2, Theta: 10000, MaxPositionEmbeddings: 64}
		a.AttnScale, a.LogitSoftcap = 0.3, 2
	})},
}

// TestGradientMatchesFiniteDifferences checks every parameter's gradient of the whole model
// against central differences of the loss along a random direction within that parameter.
func TestGradientMatchesFiniteDifferences(t *testing.T) {
	for _, tc := range familyCases {
		t.Run(tc.name, func(t *testing.T) {
			b := newCPU()
			m := newTiny(t, b, tc.arch, Options{}, 1)
			batch := packedBatch(tc.arch.Vocab, []int{5, 7}, 2)
			if err := m.ZeroGrads(); err != nil {
				t.Fatal(err)
			}
			_, n, err := m.ForwardBackward(batch, 1)
			if err != nil {
				t.Fatal(err)
			}
			if n != 10 {
				t.Fatalf("targets = %d, want 10", n)
			}
			grads := allGrads(t, m)
			rng := rand.New(rand.NewPCG(3, 3))
			loss := func() float64 {
				l, _, err := m.Forward(batch)
				if err != nil {
					t.Fatal(err)
				}
				return l
			}
			for _, s := range m.Specs {
				p0, _ := m.ParamFloat32(s.Name)
				if isBuffer(s.Name) {
					// A checkpoint buffer (Gemma 4's layer_scalar): no gradient reaches it.
					if slices.ContainsFunc(grads[s.Name], func(g float32) bool { return g != 0 }) {
						t.Errorf("%s is a buffer but has a gradient %v", s.Name, grads[s.Name])
					}
					continue
				}
				// A unit-norm random direction within this parameter.
				dir := make([]float32, len(p0))
				norm := 0.0
				for i := range dir {
					dir[i] = float32(rng.NormFloat64())
					norm += float64(dir[i]) * float64(dir[i])
				}
				analytic := 0.0
				for i := range dir {
					dir[i] /= float32(math.Sqrt(norm))
					analytic += float64(dir[i]) * float64(grads[s.Name][i])
				}
				const eps = 1e-2
				shifted := func(sign float64) float64 {
					p := make([]float32, len(p0))
					for i := range p {
						p[i] = p0[i] + float32(sign*eps)*dir[i]
					}
					if err := m.SetParam(s.Name, p); err != nil {
						t.Fatal(err)
					}
					return loss()
				}
				numeric := (shifted(1) - shifted(-1)) / (2 * eps)
				if err := m.SetParam(s.Name, p0); err != nil {
					t.Fatal(err)
				}
				if d := math.Abs(numeric - analytic); d > 1e-3+1e-2*math.Abs(numeric) {
					t.Errorf("%s: directional derivative %.6g, gradient gives %.6g", s.Name, numeric, analytic)
				}
			}
		})
	}
}

// TestPackedEqualsSeparate checks that documents packed into one micro-batch give the same
// per-token logprobs and the same gradients as running each document alone: no attention
// across documents and positions restart.
func TestPackedEqualsSeparate(t *testing.T) {
	for _, tc := range familyCases {
		t.Run(tc.name, func(t *testing.T) {
			b := newCPU()
			m := newTiny(t, b, tc.arch, Options{}, 4)
			lens := []int{6, 3, 9}
			packed := packedBatch(tc.arch.Vocab, lens, 5)
			lp, err := m.TokenLogprobs(packed)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.ZeroGrads(); err != nil {
				t.Fatal(err)
			}
			if _, _, err := m.ForwardBackward(packed, 1); err != nil {
				t.Fatal(err)
			}
			gPacked := allGrads(t, m)
			if err := m.ZeroGrads(); err != nil {
				t.Fatal(err)
			}
			var lpSep []float32
			for d := range lens {
				lo, hi := packed.DocStarts[d], packed.DocStarts[d+1]
				doc := Batch{Tokens: packed.Tokens[lo:hi], Targets: packed.Targets[lo:hi]}
				v, err := m.TokenLogprobs(doc)
				if err != nil {
					t.Fatal(err)
				}
				lpSep = append(lpSep, v...)
				if _, _, err := m.ForwardBackward(doc, 1); err != nil {
					t.Fatal(err)
				}
			}
			if d := maxAbsDiff(lp, lpSep); d > 1e-5 {
				t.Errorf("packed logprobs differ from separate runs by %g", d)
			}
			gSep := allGrads(t, m)
			for name, g := range gPacked {
				if r := relDiff(g, gSep[name]); r > 1e-5 {
					t.Errorf("%s: packed gradient differs from separate runs (relative %g)", name, r)
				}
			}
		})
	}
}

// TestRecomputeGivesIdenticalGradients checks that activation recomputation changes memory,
// not results: gradients and loss are bit-identical.
func TestRecomputeGivesIdenticalGradients(t *testing.T) {
	for _, tc := range familyCases[:4] {
		t.Run(tc.name, func(t *testing.T) {
			b := newCPU()
			m := newTiny(t, b, tc.arch, Options{}, 6)
			batch := packedBatch(tc.arch.Vocab, []int{7, 5}, 7)
			run := func(recompute bool) (float64, map[string][]float32) {
				m.SetRecompute(recompute)
				if err := m.ZeroGrads(); err != nil {
					t.Fatal(err)
				}
				l, _, err := m.ForwardBackward(batch, 0.25)
				if err != nil {
					t.Fatal(err)
				}
				return l, allGrads(t, m)
			}
			l0, g0 := run(false)
			l1, g1 := run(true)
			if l0 != l1 {
				t.Errorf("loss %v without recompute, %v with", l0, l1)
			}
			for name, g := range g0 {
				if !slices.Equal(g, g1[name]) {
					t.Errorf("%s: gradient differs with recompute (max abs %g)", name, maxAbsDiff(g, g1[name]))
				}
			}
		})
	}
}

// TestGradientsAccumulate checks the += contract: two ForwardBackward calls with scale 1/2 each
// equal one call with scale 1.
func TestGradientsAccumulate(t *testing.T) {
	b := newCPU()
	m := newTiny(t, b, familyCases[1].arch, Options{}, 8)
	batch := packedBatch(m.Arch.Vocab, []int{8}, 9)
	if err := m.ZeroGrads(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.ForwardBackward(batch, 1); err != nil {
		t.Fatal(err)
	}
	one := allGrads(t, m)
	if err := m.ZeroGrads(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if _, _, err := m.ForwardBackward(batch, 0.5); err != nil {
			t.Fatal(err)
		}
	}
	two := allGrads(t, m)
	for name, g := range one {
		if r := relDiff(two[name], g); r > 1e-6 {
			t.Errorf("%s: two half-scaled accumulations differ from one full (relative %g)", name, r)
		}
	}
}

// TestTiedEmbeddingGradientIsSum checks weight tying: with the same values in the embedding
// and the LM head, the tied model's embedding gradient is the untied model's embedding gradient
// plus its lm_head gradient, and the tied model has no lm_head parameter.
func TestTiedEmbeddingGradientIsSum(t *testing.T) {
	b := newCPU()
	tiedArch := tinyArch("llama", func(a *Arch) { a.Tied = true })
	untiedArch := tinyArch("llama", nil)
	tied := newTiny(t, b, tiedArch, Options{}, 10)
	untied := newTiny(t, b, untiedArch, Options{}, 10)
	for _, s := range tied.Specs {
		if s.Name == nameLMHead {
			t.Fatalf("tied model has a separate %s parameter", nameLMHead)
		}
		v, _ := tied.ParamFloat32(s.Name)
		if err := untied.SetParam(s.Name, v); err != nil {
			t.Fatal(err)
		}
	}
	emb, _ := tied.ParamFloat32(nameEmbed)
	if err := untied.SetParam(nameLMHead, emb); err != nil {
		t.Fatal(err)
	}
	if tied.NumParams()+len(emb) != untied.NumParams() {
		t.Errorf("tied params %d + embedding %d != untied %d", tied.NumParams(), len(emb), untied.NumParams())
	}
	batch := packedBatch(tiedArch.Vocab, []int{9}, 11)
	for _, m := range []*Model{tied, untied} {
		if err := m.ZeroGrads(); err != nil {
			t.Fatal(err)
		}
		if _, _, err := m.ForwardBackward(batch, 1); err != nil {
			t.Fatal(err)
		}
	}
	gt, _ := tied.GradFloat32(nameEmbed)
	ge, _ := untied.GradFloat32(nameEmbed)
	gh, _ := untied.GradFloat32(nameLMHead)
	sum := make([]float32, len(ge))
	for i := range sum {
		sum[i] = ge[i] + gh[i]
	}
	if r := relDiff(gt, sum); r > 1e-5 {
		t.Errorf("tied embedding gradient differs from embed+lm_head gradients of the untied twin (relative %g)", r)
	}
}

// TestGenerateCacheMatchesNoCache checks KV-cache greedy decoding against re-running the whole
// sequence for every token and taking the argmax.
func TestGenerateCacheMatchesNoCache(t *testing.T) {
	for _, tc := range familyCases {
		t.Run(tc.name, func(t *testing.T) {
			b := newCPU()
			m := newTiny(t, b, tc.arch, Options{}, 12)
			prompt := []int32{3, 9, 1, 22, 5}
			got, err := m.Generate(prompt, GenerateOptions{MaxNewTokens: 8})
			if err != nil {
				t.Fatal(err)
			}
			seq := slices.Clone(prompt)
			for i := 0; i < 8; i++ {
				lg, err := m.NextLogits(seq)
				if err != nil {
					t.Fatal(err)
				}
				seq = append(seq, Argmax(lg))
			}
			if want := seq[len(prompt):]; !slices.Equal(got, want) {
				t.Errorf("cached greedy %v, uncached %v", got, want)
			}
		})
	}
}

// TestGenerateStopsAndSamplesReproducibly checks StopIDs and that sampling depends only on the
// seed.
func TestGenerateStopsAndSamplesReproducibly(t *testing.T) {
	b := newCPU()
	m := newTiny(t, b, familyCases[0].arch, Options{}, 13)
	prompt := []int32{4, 5, 6}
	o := GenerateOptions{MaxNewTokens: 12, Temperature: 1.5, TopK: 10, TopP: 0.9, Seed: 42}
	a, err := m.Generate(prompt, o)
	if err != nil {
		t.Fatal(err)
	}
	c, err := m.Generate(prompt, o)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a, c) || len(a) != 12 {
		t.Fatalf("same seed gave %v and %v", a, c)
	}
	o.StopIDs = []int32{a[3]}
	s, err := m.Generate(prompt, o)
	if err != nil {
		t.Fatal(err)
	}
	stop := slices.Index(a, a[3])
	if !slices.Equal(s, a[:stop+1]) {
		t.Errorf("with stop id %d got %v, want %v", a[3], s, a[:stop+1])
	}
	var streamed []int32
	o.StopIDs = nil
	o.OnToken = func(id int32) error { streamed = append(streamed, id); return nil }
	if _, err := m.Generate(prompt, o); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(streamed, a) {
		t.Errorf("streamed %v, returned %v", streamed, a)
	}
}
