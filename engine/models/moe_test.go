package models

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// tinyMoE is a small mixture-of-experts model of family fam, randomly initialised with a
// large enough initializer_range that routing is far from uniform; mod adjusts the config.
func tinyMoE(t testing.TB, fam string, mod func(*config.Config)) *Model {
	return tinyMoEWith(t, fam, mod, Options{})
}

func tinyMoEWith(t testing.TB, fam string, mod func(*config.Config), o Options) *Model {
	t.Helper()
	c, err := config.Preset(fam, "tiny")
	if err != nil {
		t.Fatal(err)
	}
	c.VocabSize, c.HiddenSize, c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim = 41, 16, 4, 2, 4
	c.IntermediateSize, c.InitializerRange = 24, 0.3
	if c.MoEIntermediateSize > 0 {
		c.MoEIntermediateSize = 12
	} else {
		c.IntermediateSize = 12
	}
	c.NumExperts, c.NumExpertsPerTok = 6, 2
	if c.NGroup > 1 {
		c.NGroup, c.TopKGroup = 3, 2 // groups of 2 of the 6 experts, the best 2 kept
	}
	if c.SharedExpertIntermediateSize > 0 {
		c.SharedExpertIntermediateSize = 20
	}
	if f := c.Rope.PartialRotaryFactor; f != 0 && int(float64(c.HeadDim)*f) < 2 {
		c.Rope.PartialRotaryFactor = 0.5 // two rotary dims of the heads of 4
	}
	if mod != nil {
		mod(c)
	}
	m, err := New(c, newCPU(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if err := m.InitRandom(5); err != nil {
		t.Fatal(err)
	}
	perturb(t, m, 6)
	return m
}

var moeCases = []struct {
	name string
	fam  string
	mod  func(*config.Config)
}{
	{"qwen3_moe_renorm", "qwen3_moe", func(c *config.Config) { c.NormTopKProb = true }},
	{"qwen3_moe_sparse_step", "qwen3_moe", func(c *config.Config) { c.DecoderSparseStep, c.NumHiddenLayers = 2, 3 }},
	{"qwen3_moe_mlp_only", "qwen3_moe", func(c *config.Config) { c.MLPOnlyLayers = []int{0} }},
	{"mixtral", "mixtral", nil},
	// LayerNorms with biases, attention and lm_head biases, the sparsemixer router (its
	// threshold at 0.3 so that stages keep more than one expert and no check straddles a change
	// of the kept sets).
	{"phimoe", "phimoe", func(c *config.Config) { c.AttentionBias, c.LMHeadBias, c.RouterJitterNoise = true, true, 0.3 }},
	{"olmoe", "olmoe", nil},
	// OLMo 2's post-norms and projection-wide q/k norms around OLMoE's experts.
	{"flex_olmo", "flex_olmo", nil},
	// Granite's multipliers around experts that the checkpoint holds fused; attention biases.
	{"granitemoe", "granitemoe", func(c *config.Config) { c.AttentionBias = true }},
	// Per-head q/k norms after RoPE, a shared MLP beside the experts.
	{"hunyuan_v1_moe", "hunyuan_v1_moe", nil},
	// Interleaved rotary pairs, a dense first layer, softmax routing with a selection-only
	// correction bias, a shared expert.
	// Projection-wide q/k norms, a sigmoid router with a selection-only correction bias (top 3
	// of 6: at top 2 the sigmoid scores of this tiny model sit within the step of a tie).
	{"minimax_m2", "minimax_m2", func(c *config.Config) { c.NumExpertsPerTok = 3 }},
	// Per-head q/k norms and output gates, a sliding layer with its own rotary width, a dense
	// layer, the sigmoid router with its correction bias, scaled weights, a shared expert.
	{"laguna", "laguna", func(c *config.Config) {
		// Top 3 of 6: at top 2 the sigmoid scores of this tiny model sit within the step of a tie.
		c.NumHiddenLayers, c.RoutedScalingFactor, c.NumExpertsPerTok = 3, 1.7, 3
		c.LayerTypes = []string{"sliding_attention", "full_attention", "sliding_attention"}
		c.MLPLayerTypes = []string{"dense", "sparse", "sparse"}
		c.NumAttentionHeadsPerLayer = []int{4, 4, 4}
		c.SlidingWindow = 3
	}},
	// Cohere2-MoE: the parallel layer with LayerNorms without bias, interleaved pairs rotated
	// on the sliding and dense layers only, a dense first layer of its own width, softmax
	// routing with a shared expert averaged in, scaled logits. Without cohereCases' attention
	// biases: on the unrotated layers k_proj's bias adds the same q·b to every score of a
	// query, so its gradient is zero up to rounding noise, which
	// TestMoEDevicePathMatchesComposition cannot scale; the reference test covers the biases.
	{"cohere2_moe", "cohere2_moe", func(c *config.Config) { cohereCases[0].mod(c); c.AttentionBias = false }},
	// RMSNorms, sigmoid routing without renormalisation (top 3), the shared expert summed, an
	// unrotated dense layer.
	{"cohere2_moe_sigmoid", "cohere2_moe", cohereCases[1].mod},
	{"ernie4_5_moe", "ernie4_5_moe", func(c *config.Config) {
		c.NumHiddenLayers, c.MoELayerStartIndex, c.MoELayerEndIndex = 3, 1, 2
	}},
	// Latent attention with q LoRA, interleaved rotary dims, sigmoid routing over 2 groups of 3
	// with a correction bias, scaled weights and a shared expert; the first layer dense.
	{"deepseek_v3", "deepseek_v3", latentMoE(nil)},
	// A plain q_proj, attention biases, rotate-half rotary dims, value heads wider than the
	// query heads, two sparse layers after the dense one.
	{"deepseek_v3_q_proj", "deepseek_v3", latentMoE(func(c *config.Config) {
		c.QLoRARank, c.AttentionBias, c.RopeInterleave, c.NumHiddenLayers, c.VHeadDim = 0, true, false, 3, 11
	})},
	// GLM-4.7-Flash: mlp_layer_types with a dense layer between sparse ones.
	{"glm4_moe_lite", "glm4_moe_lite", latentMoE(func(c *config.Config) {
		c.NumHiddenLayers, c.MLPLayerTypes = 3, []string{"sparse", "dense", "sparse"}
	})},
	// A gated shared expert beside the routed ones, a dense layer, q/k/v biases.
	{"qwen2_moe_shared_gate", "qwen2_moe", func(c *config.Config) { c.MLPOnlyLayers, c.NumHiddenLayers = []int{1}, 3 }},
	// Sigmoid router with groups and scaling, a dense first layer, one shared expert, per-head
	// q/k norms, partial rotary; the correction bias is set by perturb.
	{"glm4_moe_sigmoid_groups", "glm4_moe", func(c *config.Config) { c.NumHiddenLayers = 3 }},
	// LFM2-MoE: short-convolution layers (3 taps, biases) around an attention layer with
	// per-head q/k norms, a dense first layer, the sigmoid router with its expert_bias
	// (set by perturb) and scaled weights.
	// A smaller init keeps the gated products of the conv layers (cubic in their input) from
	// saturating the sigmoid router into near-ties.
	{"lfm2_moe_conv", "lfm2_moe", func(c *config.Config) { c.InitializerRange = 0.15 }},
	// Four taps without biases, every layer sparse, raw weights, no expert bias.
	{"lfm2_moe_raw", "lfm2_moe", func(c *config.Config) {
		c.ConvLCache, c.ConvBias, c.NumDenseLayers, c.NormTopKProb, c.UseExpertBias = 4, false, 0, false, false
		c.InitializerRange = 0.1
		c.LayerTypes = []string{config.FullAttention, config.ConvLayer, config.ConvLayer}
	}},
}

// latentMoE adjusts tinyMoE's cut of a latent-attention family (deepseek_v3, glm4_moe_lite):
// one key and value per query head, small latent ranks and head dims, a non-zero correction
// bias (its random start is zero), then mod.
func latentMoE(mod func(*config.Config)) func(*config.Config) {
	return func(c *config.Config) {
		c.NumKeyValueHeads = c.NumAttentionHeads
		c.QLoRARank, c.KVLoRARank, c.QKNopeHeadDim, c.QKRopeHeadDim, c.VHeadDim = 6, 10, 4, 4, 5
		c.NGroup, c.TopKGroup = 2, 1
		c.RoutedScalingFactor = 1.7
		if mod != nil {
			mod(c)
		}
	}
}

// composed makes every MoE layer of m run the host composition (whose routing the tests
// below inspect on the host); TestMoEDevicePathMatchesComposition ties the device path to it.
func composed(m *Model) {
	for _, l := range m.MoELayers() {
		l.Composed = true
	}
}

// selections snapshots every MoE layer's top-k choice of the latest forward.
func selections(m *Model) [][]int32 {
	var s [][]int32
	for _, l := range m.moe.layers {
		s = append(s, slices.Clone(l.Routing().Sel))
		// The sparsemixer's kept sets are choices too: a change of one is a discontinuity.
		if sets := l.SparseMixerSets(); sets != nil {
			kept := make([]int32, len(sets))
			for i, k := range sets {
				if k {
					kept[i] = 1
				}
			}
			s = append(s, kept)
		}
	}
	return s
}

// TestMoEGradientMatchesFiniteDifferences checks every parameter's gradient of CE mean +
// scale*aux of whole MoE models (through the router) against central differences along random
// directions; a direction whose perturbation changes any top-k choice crosses a tie and is
// redrawn, so the check never straddles a routing discontinuity.
func TestMoEGradientMatchesFiniteDifferences(t *testing.T) {
	for _, tc := range moeCases {
		t.Run(tc.name, func(t *testing.T) {
			auxScale := 0.1
			if tc.fam == "glm4_moe" || tc.fam == "lfm2_moe" || tc.fam == "minimax_m2" || tc.fam == "laguna" || tc.fam == "cohere2_moe" {
				// transformers' GLM-4.5 and LFM2-MoE have no load-balancing loss, and its top-k of the
				// unbiased scores (which the aux loss counts) is not the routing's, so a flip
				// of it would go unnoticed by the tie check below. MiniMax-M2's is refused
				// (its softmax over the sigmoid router's logits is not implemented). transformers'
				// Cohere2-MoE computes none.
				auxScale = 0
			}
			m := tinyMoE(t, tc.fam, tc.mod)
			m.SetAuxLossScale(auxScale)
			batch := packedBatch(m.Arch.Vocab, []int{6, 7}, 2)
			if err := m.ZeroGrads(); err != nil {
				t.Fatal(err)
			}
			composed(m) // the tie check reads the selection on the host (after ZeroGrads rebuilt the layers)
			_, n, err := m.ForwardBackward(batch, 1/float32(11))
			if err != nil {
				t.Fatal(err)
			}
			if n != 11 {
				t.Fatalf("targets = %d, want 11", n)
			}
			grads := allGrads(t, m)
			base := selections(m)
			loss := func() (float64, bool) {
				l, _, err := m.Forward(batch)
				if err != nil {
					t.Fatal(err)
				}
				same := true
				for j, s := range selections(m) {
					same = same && slices.Equal(s, base[j])
				}
				return l/11 + auxScale*m.AuxLoss(), same
			}
			rng := rand.New(rand.NewPCG(3, 3))
			redrawn := 0
			for _, s := range m.Specs {
				p0, _ := m.ParamFloat32(s.Name)
				if isBuffer(s.Name) {
					// It only chooses the experts: the loss is flat in it between top-k
					// changes, and it gets no gradient.
					if slices.ContainsFunc(grads[s.Name], func(g float32) bool { return g != 0 }) {
						t.Errorf("%s has a gradient %v; the correction bias only selects", s.Name, grads[s.Name])
					}
					continue
				}
				checked := false
				for attempt := 0; attempt < 4 && !checked; attempt++ {
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
					shifted := func(sign float64) (float64, bool) {
						p := make([]float32, len(p0))
						for i := range p {
							p[i] = p0[i] + float32(sign*eps)*dir[i]
						}
						if err := m.SetParam(s.Name, p); err != nil {
							t.Fatal(err)
						}
						return loss()
					}
					lp, okp := shifted(1)
					lm, okm := shifted(-1)
					if err := m.SetParam(s.Name, p0); err != nil {
						t.Fatal(err)
					}
					if !okp || !okm {
						redrawn++
						continue
					}
					checked = true
					numeric := (lp - lm) / (2 * eps)
					if d := math.Abs(numeric - analytic); d > 1e-3+1e-2*math.Abs(numeric) {
						t.Errorf("%s: directional derivative %.6g, gradient gives %.6g", s.Name, numeric, analytic)
					}
				}
				if !checked {
					t.Errorf("%s: every direction tried crosses a top-k tie", s.Name)
				}
			}
			t.Logf("%d parameters, %d directions redrawn at a top-k tie", len(m.Specs), redrawn)
		})
	}
}

// TestMoERecomputeGivesIdenticalGradients: recomputation re-runs the routing in backward and
// must not change the loss, the aux loss or any gradient.
func TestMoERecomputeGivesIdenticalGradients(t *testing.T) {
	m := tinyMoE(t, "qwen3_moe", nil)
	m.SetAuxLossScale(0.05)
	batch := packedBatch(m.Arch.Vocab, []int{7, 5}, 7)
	run := func(recompute bool) (float64, float64, map[string][]float32) {
		m.SetRecompute(recompute)
		if err := m.ZeroGrads(); err != nil {
			t.Fatal(err)
		}
		l, _, err := m.ForwardBackward(batch, 0.25)
		if err != nil {
			t.Fatal(err)
		}
		return l, m.AuxLoss(), allGrads(t, m)
	}
	l0, a0, g0 := run(false)
	l1, a1, g1 := run(true)
	if l0 != l1 || a0 != a1 {
		t.Errorf("loss, aux %v, %v without recompute; %v, %v with", l0, a0, l1, a1)
	}
	for name, g := range g0 {
		if !slices.Equal(g, g1[name]) {
			t.Errorf("%s: gradient differs with recompute (max abs %g)", name, maxAbsDiff(g, g1[name]))
		}
	}
}

// TestExpertLoad checks the per-layer load metrics against the routing they summarise.
func TestExpertLoad(t *testing.T) {
	m := tinyMoE(t, "qwen3_moe", func(c *config.Config) { c.DecoderSparseStep, c.NumHiddenLayers = 2, 4 })
	batch := packedBatch(m.Arch.Vocab, []int{9, 8}, 3)
	if _, _, err := m.Forward(batch); err != nil {
		t.Fatal(err)
	}
	loads := m.ExpertLoad()
	if len(loads) != 2 || loads[0].Layer != 1 || loads[1].Layer != 3 {
		t.Fatalf("loads for layers %+v, want layers 1 and 3 (decoder_sparse_step 2)", loads)
	}
	for _, l := range loads {
		sum, dead := 0, 0
		sorted := slices.Clone(l.Tokens)
		sort.Ints(sorted)
		for _, v := range l.Tokens {
			sum += v
			if v == 0 {
				dead++
			}
		}
		if sum != 17*2 {
			t.Errorf("layer %d: %d assignments for 17 tokens top-2", l.Layer, sum)
		}
		if l.Max != sorted[len(sorted)-1] || l.Min != sorted[0] || l.Dead != dead {
			t.Errorf("layer %d: max %d min %d dead %d for loads %v", l.Layer, l.Max, l.Min, l.Dead, l.Tokens)
		}
		mean := float64(sum) / float64(len(l.Tokens))
		ss := 0.0
		for _, v := range l.Tokens {
			ss += (float64(v) - mean) * (float64(v) - mean)
		}
		if cv := math.Sqrt(ss/float64(len(l.Tokens))) / mean; math.Abs(cv-l.CV) > 1e-12 {
			t.Errorf("layer %d: CV %v, want %v", l.Layer, l.CV, cv)
		}
	}
	if s := loadStats(0, []int{0, 0, 4, 0}); s.Dead != 3 || s.Max != 4 || s.Min != 0 || math.Abs(s.CV-math.Sqrt(3)) > 1e-12 {
		t.Errorf("loadStats of one busy expert: %+v", s)
	}
	dense := newTiny(t, newCPU(), tinyArch("llama", nil), Options{}, 1)
	if dense.ExpertLoad() != nil || dense.IsMoE() || dense.AuxLoss() != 0 {
		t.Error("a dense model reports expert loads or an aux loss")
	}
}

// TestExpertBalancingEvensLoad runs aux-loss-free balancing on a model whose router favours
// a few experts and checks that the bias evens the load without training any weight.
func TestExpertBalancingEvensLoad(t *testing.T) {
	m := tinyMoE(t, "mixtral", func(c *config.Config) { c.NumHiddenLayers = 1 })
	// Skew the router: expert rows 0 and 1 get a large copy of a common direction.
	name := "model.layers.0.block_sparse_moe.gate.weight"
	w, _ := m.ParamFloat32(name)
	h := m.Arch.Hidden
	for i := 0; i < h; i++ {
		w[i] += 3 * w[2*h+i]
		w[h+i] += 3 * w[2*h+i]
	}
	if err := m.SetParam(name, w); err != nil {
		t.Fatal(err)
	}
	batch := packedBatch(m.Arch.Vocab, []int{20, 20, 24}, 9)
	step := func() ExpertLoad {
		if err := m.ZeroGrads(); err != nil {
			t.Fatal(err)
		}
		if _, _, err := m.ForwardBackward(batch, 1); err != nil {
			t.Fatal(err)
		}
		return m.ExpertLoad()[0]
	}
	before := step()
	if err := m.SetExpertBalancing(0.01); err != nil {
		t.Fatal(err)
	}
	var after ExpertLoad
	for i := 0; i < 60; i++ {
		after = step()
		m.BalanceExperts()
	}
	after = step()
	t.Logf("load before %v (CV %.3f), after balancing %v (CV %.3f), bias %v", before.Tokens, before.CV, after.Tokens, after.CV, m.ExpertBias()[0])
	if !(after.CV < before.CV/2) || after.Dead > 0 {
		t.Errorf("balancing did not even the load: CV %.3f -> %.3f, dead experts %d", before.CV, after.CV, after.Dead)
	}
	if err := m.SetExpertBalancing(-1); err == nil {
		t.Error("negative balancing rate accepted")
	}
	if err := m.SetExpertBalancing(0); err != nil || m.ExpertBias() != nil {
		t.Errorf("turning balancing off: %v, bias %v", err, m.ExpertBias())
	}
	if off := step(); !slices.Equal(off.Tokens, before.Tokens) {
		t.Errorf("load with balancing off %v, want the unbiased %v", off.Tokens, before.Tokens)
	}
}

// TestMoEHubLayoutRoundTrip loads each transformers fixture, saves it and checks that the
// saved checkpoint has exactly the fixture's tensor names (one tensor per expert, the Hub
// layout) with identical values.
func TestMoEHubLayoutRoundTrip(t *testing.T) {
	for _, name := range []string{"qwen3_moe", "qwen3_moe_sparse", "mixtral", "olmoe"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("testdata", "parity", name)
			b := newCPU()
			m, err := Load(dir, b, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if len(m.Unused) != 0 {
				t.Errorf("fixture tensors not used: %v", m.Unused)
			}
			out := t.TempDir()
			if err := m.Save(out, SaveOptions{}); err != nil {
				t.Fatal(err)
			}
			src, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			got, err := safetensors.OpenCheckpoint(out)
			if err != nil {
				t.Fatal(err)
			}
			defer got.Close()
			a, c := slices.Sorted(slices.Values(src.Names())), slices.Sorted(slices.Values(got.Names()))
			if !slices.Equal(a, c) {
				t.Fatalf("saved tensor names differ from transformers'\nfixture %v\nsaved   %v", a, c)
			}
			for _, n := range a {
				i1, _ := src.Tensor(n)
				i2, _ := got.Tensor(n)
				v1, _ := safetensors.ToFloat32(i1)
				v2, _ := safetensors.ToFloat32(i2)
				if !slices.Equal(v1, v2) {
					t.Errorf("%s changed in the round trip", n)
				}
			}
			if !slices.ContainsFunc(a, func(s string) bool { return strings.Contains(s, ".experts.1.") }) {
				t.Error("no per-expert tensors in the fixture")
			}
		})
	}
}

// TestMoEConfigErrors checks that impossible router settings are refused naming the key.
func TestMoEConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*config.Config)
		want string
	}{
		{"top-k above experts", func(c *config.Config) { c.NumExpertsPerTok = 9 }, "num_experts_per_tok"},
		{"top-k zero", func(c *config.Config) { c.NumExpertsPerTok = 0 }, "num_experts_per_tok"},
		{"no expert width", func(c *config.Config) { c.MoEIntermediateSize = 0; c.IntermediateSize = 0 }, "expert width"},
		{"mixtral router jitter", func(c *config.Config) { c.RouterJitterNoise = 0.01 }, "router_jitter_noise"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fam := "qwen3_moe"
			if strings.HasPrefix(tc.name, "mixtral") {
				fam = "mixtral"
			}
			c, err := config.Preset(fam, "tiny")
			if err != nil {
				t.Fatal(err)
			}
			tc.mod(c)
			m, err := New(c, newCPU(), Options{})
			if err == nil {
				m.Close()
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %q", err, tc.want)
			}
			t.Log(err)
		})
	}
}

// TestMoEGenerateCacheMatchesNoCache checks KV-cache greedy decoding of MoE models (routing
// one new token at a time) against re-running the whole sequence for every token.
func TestMoEGenerateCacheMatchesNoCache(t *testing.T) {
	for _, tc := range moeCases {
		t.Run(tc.name, func(t *testing.T) {
			m := tinyMoE(t, tc.fam, tc.mod)
			prompt := []int32{3, 9, 1, 22, 5}
			got, err := m.Generate(prompt, GenerateOptions{MaxNewTokens: 6})
			if err != nil {
				t.Fatal(err)
			}
			seq := slices.Clone(prompt)
			for i := 0; i < 6; i++ {
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

// TestMoEBF16TracksF32 checks the bf16 path of an MoE model: loss and aux loss follow the f32
// model within bf16 precision.
func TestMoEBF16TracksF32(t *testing.T) {
	m32 := tinyMoE(t, "qwen3_moe", nil)
	m16 := tinyMoEWith(t, "qwen3_moe", nil, Options{DType: tensor.BF16})
	batch := packedBatch(m32.Arch.Vocab, []int{9, 7}, 6)
	var loss, aux [2]float64
	for i, m := range []*Model{m32, m16} {
		if err := m.ZeroGrads(); err != nil {
			t.Fatal(err)
		}
		l, _, err := m.ForwardBackward(batch, 1)
		if err != nil {
			t.Fatal(err)
		}
		loss[i], aux[i] = l, m.AuxLoss()
	}
	if rel := math.Abs(loss[1]-loss[0]) / loss[0]; rel > 2e-2 {
		t.Errorf("bf16 loss %.5f vs f32 %.5f (relative %.3g)", loss[1], loss[0], rel)
	}
	if rel := math.Abs(aux[1]-aux[0]) / aux[0]; rel > 5e-2 {
		t.Errorf("bf16 aux loss %.5f vs f32 %.5f (relative %.3g)", aux[1], aux[0], rel)
	}
	g32, _ := m32.GradFloat32("model.layers.1.mlp.gate.weight")
	g16, _ := m16.GradFloat32("model.layers.1.mlp.gate.weight")
	if r := relDiff(g16, g32); r > 0.2 {
		t.Errorf("bf16 router gradient relative difference %.3g", r)
	}
}

// TestMoELoadsFusedExperts writes each fixture in transformers 5's fused in-memory layout
// (experts.gate_up_proj [E,2I,C] with gate rows first, experts.down_proj [E,C,I], the router as
// mlp.gate.weight) and checks that it loads into the same parameters as the Hub layout.
func TestMoELoadsFusedExperts(t *testing.T) {
	for _, name := range []string{"qwen3_moe_sparse", "mixtral", "olmoe"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("testdata", "parity", name)
			b := newCPU()
			ref, err := Load(dir, b, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			src, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			fused := map[string][][]byte{} // fused name -> per-expert chunks in order
			var shapes = map[string][]int{}
			var out []safetensors.Tensor
			for _, n := range src.Names() {
				info, _ := src.Tensor(n)
				sm := expertName.FindStringSubmatch(n)
				if sm == nil {
					out = append(out, safetensors.Tensor{Name: strings.Replace(n, ".block_sparse_moe.gate.", ".mlp.gate.", 1),
						DType: info.DType, Shape: info.Shape, Data: info.Data})
					continue
				}
				x, _ := strconv.Atoi(sm[2])
				kind := "gate_up_proj"
				if sm[3] == "down_proj" || sm[3] == "w2" {
					kind = "down_proj"
				}
				key := "model.layers." + sm[1] + ".mlp.experts." + kind
				slot := x
				if kind == "gate_up_proj" {
					slot = 2 * x
					if sm[3] == "up_proj" || sm[3] == "w3" {
						slot++
					}
				}
				for len(fused[key]) <= slot {
					fused[key] = append(fused[key], nil)
				}
				fused[key][slot] = info.Data
				shapes[key] = info.Shape
			}
			for key, chunks := range fused {
				var data []byte
				for _, c := range chunks {
					data = append(data, c...)
				}
				s := shapes[key]
				e := len(chunks)
				rows := s[0]
				if strings.HasSuffix(key, "gate_up_proj") {
					e, rows = len(chunks)/2, 2*s[0]
				}
				out = append(out, safetensors.Tensor{Name: key, DType: safetensors.F32, Shape: []int{e, rows, s[1]}, Data: data})
			}
			fdir := t.TempDir()
			if err := safetensors.Save(filepath.Join(fdir, "model.safetensors"), out, nil); err != nil {
				t.Fatal(err)
			}
			cfg, _ := os.ReadFile(filepath.Join(dir, "config.json"))
			if err := os.WriteFile(filepath.Join(fdir, "config.json"), cfg, 0o644); err != nil {
				t.Fatal(err)
			}
			m, err := Load(fdir, b, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if len(m.Unused) != 0 {
				t.Errorf("unused tensors %v", m.Unused)
			}
			for _, s := range ref.Specs {
				a, _ := ref.ParamFloat32(s.Name)
				c, _ := m.ParamFloat32(s.Name)
				if !slices.Equal(a, c) {
					t.Errorf("%s differs between the fused and the Hub layout", s.Name)
				}
			}
		})
	}
}

// TestMoEFusedExpertsBadShape: a fused tensor that cannot be split is not guessed at; the load
// fails naming the per-expert tensor it needed.
func TestMoEFusedExpertsBadShape(t *testing.T) {
	m := tinyMoE(t, "olmoe", func(c *config.Config) { c.NumHiddenLayers = 1 })
	var out []safetensors.Tensor
	ts, err := m.WeightTensors(0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tn := range ts {
		if strings.Contains(tn.Name, ".experts.") {
			continue
		}
		out = append(out, tn)
	}
	out = append(out, safetensors.Tensor{Name: "model.layers.0.mlp.experts.gate_up_proj", DType: safetensors.F32,
		Shape: []int{6, 3, 16}, Data: make([]byte, 6*3*16*4)})
	dir := t.TempDir()
	if err := m.Save(dir, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := safetensors.Save(filepath.Join(dir, "model.safetensors"), out, nil); err != nil {
		t.Fatal(err)
	}
	_, err = Load(dir, newCPU(), Options{})
	if err == nil || !strings.Contains(err.Error(), "model.layers.0.mlp.experts.0.gate_proj.weight") {
		t.Errorf("load error %v, want one naming the missing expert tensor", err)
	}
}

// MoELayers lists exactly the sparse blocks, in layer order, and they are the blocks the model
// runs (a runner set on one is used by the next forward).
func TestMoELayersAreTheSparseBlocks(t *testing.T) {
	m := tinyMoE(t, "qwen3_moe", func(c *config.Config) { c.DecoderSparseStep, c.NumHiddenLayers = 2, 4 })
	ls := m.MoELayers()
	var want []string
	for i := 0; i < m.Arch.Layers; i++ {
		if m.Config().IsMoELayer(i) {
			want = append(want, layerName(i, "mlp"))
		}
	}
	var got []string
	for _, l := range ls {
		got = append(got, l.Name)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) || len(want) == 0 {
		t.Fatalf("MoELayers = %v, want %v", got, want)
	}
	if dense := newTiny(t, newCPU(), tinyArch("llama", nil), Options{}, 1); dense.MoELayers() != nil {
		t.Errorf("a dense model has MoE layers %v", dense.MoELayers())
	}
}

// TestTakeExpertLoadCountsTrainingForwards checks the load counter that steps and plans read:
// it sums the training forwards since the last take (not evaluation forwards), restarts after
// a take, and BalanceExpertsWith and SetExpertBias refuse loads and biases of the wrong shape.
func TestTakeExpertLoadCountsTrainingForwards(t *testing.T) {
	m := tinyMoE(t, "qwen3_moe", func(c *config.Config) { c.DecoderSparseStep, c.NumHiddenLayers, c.NumExperts = 2, 4, 4 })
	if err := m.EnableGrads(); err != nil {
		t.Fatal(err)
	}
	batches := []Batch{packedBatch(m.Arch.Vocab, []int{9, 8}, 3), packedBatch(m.Arch.Vocab, []int{12}, 5)}
	want := [][]int{make([]int, 4), make([]int, 4)}
	for _, b := range batches {
		if _, _, err := m.ForwardBackward(b, 1); err != nil {
			t.Fatal(err)
		}
		for j, l := range m.ExpertLoad() {
			for e, n := range l.Tokens {
				want[j][e] += n
			}
		}
	}
	if _, _, err := m.Forward(batches[0]); err != nil {
		t.Fatal(err)
	}
	got := m.TakeExpertLoad()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("taken load %v, want the training forwards' sum %v", got, want)
	}
	if again := m.TakeExpertLoad(); !reflect.DeepEqual(again, [][]int{make([]int, 4), make([]int, 4)}) {
		t.Fatalf("load after a take %v, want zeros", again)
	}
	if st := m.ExpertLoadStats(got); len(st) != 2 || st[0].Layer != 1 || st[1].Layer != 3 || !slices.Equal(st[1].Tokens, want[1]) {
		t.Fatalf("stats %+v", st)
	}
	if err := m.SetExpertBias([][]float32{{1, 2, 3, 4}, {0, 0, 0, 0}}); err == nil {
		t.Error("bias accepted while balancing is off")
	}
	if err := m.SetExpertBalancing(0.5); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][][]float32{{{1, 2, 3, 4}}, {{1, 2, 3}, {0, 0, 0, 0}}, {{1, 2, 3, float32(math.NaN())}, {0, 0, 0, 0}}} {
		if err := m.SetExpertBias(bad); err == nil {
			t.Errorf("bias %v accepted for 2 layers of 4 experts", bad)
		}
	}
	for _, bad := range [][][]int{{{1, 2, 3, 4}}, {{1, 2, 3}, {0, 0, 0, 0}}} {
		if err := m.BalanceExpertsWith(bad); err == nil {
			t.Errorf("loads %v accepted for 2 layers of 4 experts", bad)
		}
	}
	if err := m.SetExpertBias([][]float32{{1, 2, 3, 4}, {0, 0, 0, 0}}); err != nil {
		t.Fatal(err)
	}
	if err := m.BalanceExpertsWith([][]int{{4, 0, 2, 2}, {1, 1, 1, 1}}); err != nil {
		t.Fatal(err)
	}
	if b := m.ExpertBias(); !reflect.DeepEqual(b, [][]float32{{0.5, 2.5, 3, 4}, {0, 0, 0, 0}}) {
		t.Fatalf("bias after one update %v", b)
	}
}
