package cuda

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// familyCases are tiny random models of the families whose decoders depart from Llama's, every
// feature on (as scripts/gpu/make_fixtures.py makes them for transformers): post-norms and
// projection-wide q/k norms (olmo2, olmo3 with sliding layers), fused qkv_proj / gate_up_proj
// with longrope past its original context and a sliding window (phi3), the four multipliers
// (granite's tiny preset), a NoPE sliding layer with biases, whose key bias has no gradient in
// exact arithmetic (smollm3), sandwich norms with interleaved partial rotary (glm4), a gated
// shared expert (qwen2_moe) and the sigmoid grouped router with a shared expert (glm4_moe).
var familyCases = []struct {
	name, family string
	set          []string
	moe          bool
}{
	{"olmo2", "olmo2", nil, false},
	{"olmo3_window", "olmo3", []string{"num_hidden_layers=4", "sliding_window=5"}, false},
	{"phi3_longrope", "phi3", []string{"original_max_position_embeddings=8", "sliding_window=11",
		`rope_parameters={"rope_type":"longrope","rope_theta":10000.0,"partial_rotary_factor":0.5,"short_factor":[1.0,1.2,1.5,2.0],"long_factor":[2.0,3.0,5.0,8.0]}`}, false},
	{"granite", "granite", []string{"attention_bias=true", "mlp_bias=true"}, false},
	{"smollm3_nope", "smollm3", []string{"no_rope_layers=[1,0]", "use_sliding_window=true", "sliding_window=5",
		"attention_bias=true", "mlp_bias=true"}, false},
	{"glm4", "glm4", nil, false},
	{"qwen2_moe", "qwen2_moe", []string{"output_router_logits=true"}, true},
	{"glm4_moe", "glm4_moe", nil, true},
	// Gemma 3: sandwich norms with 1 + w gains, scaled embeddings, GeGLU, a sliding layer with
	// its own RoPE base beside a linearly scaled full one, query_pre_attn_scalar, final-logit
	// softcapping (the CE kernel's cap).
	{"gemma3_softcap", "gemma3_text", []string{"final_logit_softcapping=3.0", "query_pre_attn_scalar=12",
		`rope_parameters={"full_attention":{"rope_type":"linear","factor":2.0,"rope_theta":1000000.0},"sliding_attention":{"rope_type":"default","rope_theta":1000.0}}`}, false},
	// gpt-oss: attention sinks and biases, alternating windows, the expert block with clamps
	// that hold (routing on the host; float32 only, as the other MoE cases).
	{"gpt_oss_clamped", "gpt_oss", []string{"swiglu_limit=1.0"}, true},
	// FlexOlmo: post-norms and projection-wide q/k norms around renormalised experts.
	{"flex_olmo", "flex_olmo", []string{"attention_bias=true", "norm_topk_prob=true", "output_router_logits=true"}, true},
	// Granite MoE: the four multipliers around experts held fused in the checkpoint.
	{"granitemoe", "granitemoe", []string{"attention_bias=true", "output_router_logits=true"}, true},
	// HunYuan MoE: per-head q/k norms after RoPE, a shared MLP beside the experts.
	{"hunyuan_v1_moe", "hunyuan_v1_moe", []string{"attention_bias=true"}, true},
	// Gated delta-net layers (their conv and gated norm run on the host, the recurrence in
	// kernels/gated_delta.cu) beside
	// gated full attention with partial rotary and per-head q/k norms, experts with a gated
	// shared expert; qwen3_next with attention biases and a dense layer, qwen3_5_moe_text with
	// tied embeddings.
	{"qwen3_next", "qwen3_next", []string{"attention_bias=true", "mlp_only_layers=[2]", "output_router_logits=true"}, true},
	{"qwen3_5_moe_text", "qwen3_5_moe_text", []string{"tie_word_embeddings=true", "output_router_logits=true"}, true},
	// ERNIE 4.5 MoE: interleaved rotary pairs, a dense layer, softmax routing with a correction
	// bias, a shared expert.
	{"ernie4_5_moe", "ernie4_5_moe", []string{"moe_layer_start_index=1", "output_router_logits=true"}, true},
	// Gemma 4: sliding heads of 16 beside full heads of 512 (the generic attention kernel) over
	// one key/value projection shared with the values, v_norm, unscaled scores, proportional
	// RoPE on the full layers, layer scalars, a final-logit cap.
	{"gemma4_global512", "gemma4_text", []string{"global_head_dim=512", "final_logit_softcapping=3.0", "sliding_window=5"}, false},
	// Gemma 4's optional parts (the gemma4_text_ple fixture's): per-layer input embeddings,
	// two layers sharing the first two layers' keys and values with double-wide MLPs, the MoE
	// block beside every MLP (routed on the host), full heads of 24 under partial RoPE.
	{"gemma4_all_parts", "gemma4_text", []string{"num_hidden_layers=4",
		`layer_types=["sliding_attention","full_attention","sliding_attention","full_attention"]`,
		"global_head_dim=24", "hidden_size_per_layer_input=8", "num_kv_shared_layers=2", "use_double_wide_mlp=true",
		"enable_moe_block=true", "num_experts=4", "top_k_experts=2", "moe_intermediate_size=24",
		"final_logit_softcapping=3.0", "sliding_window=5"}, true},
	// LFM2-MoE: short-convolution layers (their gating and convolution in kernels/shortconv.cu
	// between the projections) around an attention layer, the sigmoid router with expert_bias.
	{"lfm2_moe_conv", "lfm2_moe", []string{"routed_scaling_factor=1.5"}, true},
	// MiniMax-M2: projection-wide q/k norms, sigmoid routing with a correction bias.
	{"minimax_m2", "minimax_m2", nil, true},
	// Laguna: per-head q/k norms and softplus output gates, per-layer-type rotary bases and
	// widths, a sliding layer, sigmoid routing with a correction bias, a shared expert.
	{"laguna", "laguna", []string{"attention_bias=true"}, true},
	// Cohere2-MoE: the parallel layer with LayerNorms without bias (composed of the backend's
	// ops), interleaved rotary pairs on the sliding and dense layers only, a dense layer of its
	// own width, softmax routing with a shared expert averaged in, scaled logits.
	{"cohere2_moe", "cohere2_moe", []string{`mlp_layer_types=["dense","sparse"]`, "prefix_dense_intermediate_size=40",
		"logit_scale=0.5"}, true},
	// PhiMoE: LayerNorms with biases (composed of the backend's ops), attention and lm_head
	// biases (the head's bias as an extra column of the fused cross-entropy), the sparsemixer
	// router on the host.
	{"phimoe", "phimoe", []string{"attention_bias=true", "lm_head_bias=true", "router_jitter_noise=0.3"}, true},
	// DeepSeek-V4 through the backend's ops (nn.DSV4Device) against the CPU's float64 host
	// tape: four hyper-connection streams, a sliding, a compressed sparse (the indexer keeps 2
	// of the rate-4 entries) and a heavily compressed layer (rate 8), hash and score routing,
	// clamps that hold.
	{"deepseek_v4", "deepseek_v4", []string{"hc_mult=4", "sliding_window=5", "swiglu_limit=1.0"}, true},
	// JetMoE: the mixture of attention heads (host routing, per-expert query and output
	// products around the backend's grouped attention) and GLU experts with an output bias.
	{"jetmoe", "jetmoe", nil, true},
}

// TestGPUFamiliesMatchCPU runs each of familyCases on the GPU and on the CPU backend from the
// same random weights, saved and loaded as a checkpoint: logprobs, packed documents, the loss
// and every gradient of one step, in float32 (and in bfloat16 for the dense ones), with
// TestGPUModelParity's tolerances against the CPU. Routing near-ties would make bf16 MoE runs
// choose other experts, so the MoE cases run in float32 only.
func TestGPUFamiliesMatchCPU(t *testing.T) {
	g := gpu(t)
	for _, tc := range familyCases {
		c, err := config.Preset(tc.family, "tiny")
		if err != nil {
			t.Fatal(err)
		}
		if c, err = models.ApplyOverrides(c, append([]string{"initializer_range=0.2"}, tc.set...)); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		dir := t.TempDir()
		ref := randomCheckpoint(t, c, dir, 17)
		dts := []tensor.DType{tensor.F32, tensor.BF16}
		if tc.moe {
			dts = dts[:1]
		}
		for _, dt := range dts {
			t.Run(tc.name+"/"+dt.String(), func(t *testing.T) {
				c := cpu.New(cpu.Options{})
				defer c.Close()
				want := runFixture(t, c, dir, ref, dt)
				got := runFixture(t, g, dir, ref, dt)
				lpTol, lossTol, gradTol := 1e-4, 1e-5, 1e-3
				if dt == tensor.BF16 {
					lpTol, lossTol, gradTol = 0.05, 1e-2, 5e-2
				}
				worst := 0.0
				for r := range got.logprobs {
					for i := range got.logprobs[r] {
						worst = math.Max(worst, math.Abs(float64(got.logprobs[r][i]-want.logprobs[r][i])))
					}
				}
				if worst > lpTol {
					t.Errorf("logprobs differ from the CPU by %.3g (tolerance %.3g)", worst, lpTol)
				}
				if d := math.Abs(got.loss-want.loss) / math.Abs(want.loss); d > lossTol {
					t.Errorf("loss %.7g, CPU %.7g (relative %.3g, tolerance %.3g)", got.loss, want.loss, d, lossTol)
				}
				worst = 0
				for i := range got.packed {
					worst = math.Max(worst, math.Abs(float64(got.packed[i]-want.packed[i])))
				}
				if worst > lpTol {
					t.Errorf("packed logprobs differ from the CPU by %.3g", worst)
				}
				gradChecks(t, "grads_vs_cpu", got.grads, want.grads, dt, gradTol)
			})
		}
	}
}

// randomCheckpoint saves a model of config c with random weights (norms, biases and routing
// correction biases away from their initial values) into dir and returns rows of ids to run,
// with two packed documents.
func randomCheckpoint(t *testing.T, c *config.Config, dir string, seed uint64) parityRef {
	t.Helper()
	b := cpu.New(cpu.Options{})
	defer b.Close()
	m, err := models.New(c, b, models.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.InitRandom(seed); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 3))
	for _, s := range m.Specs {
		if s.Init == models.InitNormal {
			continue
		}
		v := make([]float32, s.Numel())
		for i := range v {
			v[i] = 0.1 * float32(rng.NormFloat64())
			if s.Init == models.InitOnes || s.Init == models.InitUnit {
				v[i]++
			}
		}
		if err := m.SetParam(s.Name, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Save(dir, models.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	ids := func(n int) []int32 {
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(3 + rng.IntN(c.VocabSize-3))
		}
		return out
	}
	ref := parityRef{Family: c.ModelType, InputIDs: [][]int32{ids(16), ids(16)}}
	docs := [][]int32{ids(10), ids(14)}
	ref.Packed = &struct {
		DocLengths []int       `json:"doc_lengths"`
		InputIDs   []int32     `json:"input_ids"`
		Logprobs   [][]float64 `json:"logprobs"`
	}{DocLengths: []int{10, 14}, InputIDs: append(append([]int32{}, docs[0]...), docs[1]...)}
	return ref
}
