package models

import (
	"encoding/json"
	"flag"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

var updateSaved = flag.Bool("update-saved", false, "write the checkpoints under testdata/saved that transformers has not checked yet (then run testdata/saved/check_transformers.py with transformers); delete a case's transformers.json to rewrite it")

// savedCases are small checkpoints that halo-shell trains for a few steps and saves; the
// committed script testdata/saved/check_transformers.py loads each with transformers and
// records its logprobs in transformers.json.
var savedCases = []struct {
	name, family string
	set          []string
}{
	{"llama_tied", "llama", []string{"tie_word_embeddings=true", "attention_bias=true"}},
	{"mistral_window", "mistral", []string{"sliding_window=4"}},
	{"qwen2", "qwen2", nil},
	{"qwen3_bf16", "qwen3", []string{`rope_parameters={"rope_type":"linear","factor":2.0,"rope_theta":1000000.0}`}},
	{"olmo2", "olmo2", nil},
	{"olmo3_window", "olmo3", []string{"sliding_window=4"}},
	// 12 ids past the original context of 8: the long factors apply.
	{"phi3_longrope", "phi3", []string{"original_max_position_embeddings=8", "sliding_window=6",
		`rope_parameters={"rope_type":"longrope","rope_theta":10000.0,"partial_rotary_factor":0.5,"short_factor":[1.0,1.5],"long_factor":[2.0,4.0]}`}},
	{"granite", "granite", []string{"attention_bias=true", "mlp_bias=true"}},
	{"smollm3_nope", "smollm3", []string{"no_rope_layers=[1,0]", "use_sliding_window=true", "sliding_window=5"}},
	{"glm4", "glm4", nil},
	// Latent attention with q LoRA, interleaved rotary dims, yarn with mscale_all_dim (so the
	// softmax scale moves too) and attention biases; a sigmoid-routed MoE layer after a dense
	// one, with a non-zero correction bias.
	{"deepseek_v3_yarn", "deepseek_v3", []string{"attention_bias=true",
		`rope_parameters={"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":8,"mscale":1.0,"mscale_all_dim":0.8,"rope_theta":10000.0}`}},
	// A plain q_proj, rotate-half rotary dims, a sparse layer before a dense one.
	{"glm4_moe_lite_qproj", "glm4_moe_lite", []string{"q_lora_rank=null", "rope_interleave=false", `mlp_layer_types=["sparse","dense"]`}},
	// swiglu_limit 1.0, which transformers' experts ignore (they clamp at 7.0), as the model does.
	{"gpt_oss_clamped", "gpt_oss", []string{"swiglu_limit=1.0", "sliding_window=4", "initializer_range=0.2"}},
	{"gemma3_softcap", "gemma3_text", []string{"final_logit_softcapping=3.0", "sliding_window=4", "query_pre_attn_scalar=12",
		`rope_parameters={"full_attention":{"rope_type":"linear","factor":2.0,"rope_theta":1000000.0},"sliding_attention":{"rope_type":"default","rope_theta":1000.0}}`}},
	// Post-norms and projection-wide q/k norms around renormalised experts, attention biases.
	{"flex_olmo", "flex_olmo", []string{"attention_bias=true", "norm_topk_prob=true"}},
	// Granite's multipliers (the tiny preset's) and experts written fused (input_linear,
	// output_linear), attention biases.
	{"granitemoe", "granitemoe", []string{"attention_bias=true"}},
	// The mixture of attention heads (its experts' tensors whole, kv_proj) and the experts
	// written fused with the block's output bias.
	{"jetmoe", "jetmoe", nil},
	// Per-head q/k norms after RoPE, a shared MLP beside the experts, attention biases.
	{"hunyuan_v1_moe", "hunyuan_v1_moe", []string{"attention_bias=true"}},
	// Gated delta-net layers (grouped in_proj_qkvz / in_proj_ba) beside gated attention with
	// biases; layer 1 dense.
	{"qwen3_next", "qwen3_next", []string{"attention_bias=true", "mlp_only_layers=[1]"}},
	// The split projections (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a), tied embeddings,
	// layer types given explicitly.
	{"qwen3_5_moe_text", "qwen3_5_moe_text", []string{"tie_word_embeddings=true",
		`layer_types=["full_attention","linear_attention","linear_attention","full_attention"]`}},
	// Interleaved rotary pairs, a dense layer before a sparse one with a non-zero correction
	// bias and a shared expert.
	{"ernie4_5_moe", "ernie4_5_moe", []string{"moe_layer_start_index=1", "tie_word_embeddings=false"}},
	// Sliding heads of 8 beside full heads of 32 over one key/value projection shared with the
	// values, proportional RoPE over a quarter of the full heads, layer scalars, a softcap.
	{"gemma4_kv_shared_proj", "gemma4_text", []string{"final_logit_softcapping=3.0", "sliding_window=4"}},
	// A conv layer of 3 taps with biases, an attention layer, a conv layer; a dense layer,
	// then two sigmoid-routed MoE layers with a non-zero expert bias.
	{"lfm2_moe_conv", "lfm2_moe", []string{"routed_scaling_factor=1.5"}},
	// Projection-wide q/k norms, sigmoid routing with a non-zero correction bias.
	{"minimax_m2", "minimax_m2", nil},
	// Per-head q/k norms and output gates, a sliding layer with its own rotary base and width, a
	// dense layer before a sigmoid-routed one with a non-zero correction bias, a shared expert.
	{"laguna", "laguna", []string{"mlp_layer_types=[\"dense\",\"sparse\"]", "attention_bias=true"}},
	// The parallel layer with LayerNorms without bias, interleaved pairs on the sliding layer
	// and the dense one, a dense layer of its own width before a sparse one, softmax routing
	// with two shared experts averaged in, attention biases, scaled logits, an untied head.
	{"cohere2_moe", "cohere2_moe", []string{"mlp_layer_types=[\"dense\",\"sparse\"]", "attention_bias=true",
		"num_shared_experts=2", "prefix_dense_intermediate_size=40", "logit_scale=0.5", "tie_word_embeddings=false"}},
	// LayerNorms with biases, attention and lm_head biases, the sparsemixer router with its
	// threshold widened so that its stages keep several experts.
	{"phimoe", "phimoe", []string{"attention_bias=true", "lm_head_bias=true", "router_jitter_noise=0.3"}},
	// A sliding, a compressed sparse (indexer over 3 windows) and a heavily compressed layer
	// under a 4-token window, clamped SwiGLU, shared-expert biases, a hash layer with its own
	// token table and two routed layers with a non-zero correction bias.
	{"deepseek_v4", "deepseek_v4", []string{"sliding_window=4", "swiglu_limit=0.5", "mlp_bias=true",
		`layer_types=["sliding_attention","compressed_sparse_attention","heavily_compressed_attention"]`}},
}

// savedIDs is the sequence whose logprobs both sides compute.
var savedIDs = []int32{3, 17, 40, 8, 8, 21, 63, 1, 30, 12, 5, 44}

// TestSavedCheckpointsLoadInTransformers checks that checkpoints written by Save after
// training are read by transformers as the same model: its logprobs (transformers.json,
// produced by the committed script on a machine with transformers) match ours within 1e-4.
func TestSavedCheckpointsLoadInTransformers(t *testing.T) {
	if *updateSaved {
		writeSavedCheckpoints(t)
	}
	for _, tc := range savedCases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join("testdata", "saved", tc.name)
			raw, err := os.ReadFile(filepath.Join(dir, "transformers.json"))
			if os.IsNotExist(err) {
				t.Skipf("no %s/transformers.json yet: run testdata/saved/check_transformers.py where transformers is installed", dir)
			}
			if err != nil {
				t.Fatal(err)
			}
			var ref struct {
				IDs      []int32   `json:"input_ids"`
				Logprobs []float64 `json:"logprobs"`
			}
			if err := json.Unmarshal(raw, &ref); err != nil {
				t.Fatal(err)
			}
			m, err := Load(dir, newCPU(), Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			lp, err := m.Logprobs(ref.IDs)
			if err != nil {
				t.Fatal(err)
			}
			if len(lp) != len(ref.Logprobs) {
				t.Fatalf("%d logprobs, transformers gave %d", len(lp), len(ref.Logprobs))
			}
			for i := range lp {
				if d := math.Abs(float64(lp[i]) - ref.Logprobs[i]); d > 1e-4 {
					t.Errorf("token %d: logprob %.6f, transformers %.6f", i+1, lp[i], ref.Logprobs[i])
				}
			}
		})
	}
}

// writeSavedCheckpoints trains each case for a few plain gradient steps and saves it. Cases
// that transformers has checked (a transformers.json beside them) are kept as they are: their
// reference holds for those weights only.
func writeSavedCheckpoints(t *testing.T) {
	for _, tc := range savedCases {
		if _, err := os.Stat(filepath.Join("testdata", "saved", tc.name, "transformers.json")); err == nil {
			continue
		}
		cfg, err := config.Preset(tc.family, "tiny")
		if err != nil {
			t.Fatal(err)
		}
		cfg.VocabSize, cfg.HiddenSize, cfg.IntermediateSize, cfg.HeadDim = 64, 32, 48, 8
		cfg.PadTokenID = nil
		if cfg, err = ApplyOverrides(cfg, tc.set); err != nil {
			t.Fatal(err)
		}
		m, err := New(cfg, newCPU(), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.InitRandom(11); err != nil {
			t.Fatal(err)
		}
		for _, s := range m.Specs {
			// Routers' correction biases start at zero and Gemma 4's layer scalars at one;
			// give them values to carry.
			if strings.HasSuffix(s.Name, ".layer_scalar") {
				if err := m.SetParam(s.Name, []float32{0.8}); err != nil {
					t.Fatal(err)
				}
			}
			if strings.HasSuffix(s.Name, ".e_score_correction_bias") || strings.HasSuffix(s.Name, ".expert_bias") {
				v := make([]float32, s.Numel())
				for i := range v {
					v[i] = 0.01 * float32(i%5-2)
				}
				if err := m.SetParam(s.Name, v); err != nil {
					t.Fatal(err)
				}
			}
		}
		for name, tab := range m.hostBufs {
			// deepseek_v4's tid2eid starts at zero: give each token two distinct experts.
			if !strings.HasSuffix(name, ".tid2eid") {
				continue
			}
			for i := range tab {
				tab[i] = int64((3*(i/cfg.NumExpertsPerTok) + 5*(i%cfg.NumExpertsPerTok)) % cfg.NumExperts)
			}
		}
		batch := packedBatch(cfg.VocabSize, []int{12, 9}, 12)
		for step := 0; step < 5; step++ {
			if err := m.ZeroGrads(); err != nil {
				t.Fatal(err)
			}
			if _, _, err := m.ForwardBackward(batch, 1.0/19); err != nil {
				t.Fatal(err)
			}
			for _, s := range m.Specs {
				p, _ := m.ParamFloat32(s.Name)
				g, _ := m.GradFloat32(s.Name)
				for i := range p {
					p[i] -= 0.5 * g[i]
				}
				if err := m.SetParam(s.Name, p); err != nil {
					t.Fatal(err)
				}
			}
		}
		dir := filepath.Join("testdata", "saved", tc.name)
		so := SaveOptions{}
		if tc.name == "qwen3_bf16" {
			so.DType = tensor.BF16
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if err := m.Save(dir, so); err != nil {
			t.Fatal(err)
		}
		ids, _ := json.Marshal(map[string]any{"input_ids": savedIDs})
		if err := os.WriteFile(filepath.Join(dir, "ids.json"), ids, 0o644); err != nil {
			t.Fatal(err)
		}
		m.Close()
	}
}
