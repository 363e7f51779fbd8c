package cuda

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Batched generation on the GPU: the KV-cache gather of models.GenerateBatch (Embedding on the
// cache rows) and decoding attention with separate key boundaries, against uncached decoding
// on the same GPU, and the sampling throughput of the Qwen3-0.6B shape.

// TestGPUGenerateBatchMatchesUncached decodes prompts of different lengths greedily, batched
// with the KV cache, on an f32 model with GQA and a sliding window, and checks every row
// against the argmax of full uncached forwards on the same GPU.
func TestGPUGenerateBatchMatchesUncached(t *testing.T) {
	g := gpu(t)
	raw := []byte(`{"architectures": ["MistralForCausalLM"], "model_type": "mistral",
  "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
  "vocab_size": 97, "max_position_embeddings": 512, "rope_theta": 10000,
  "rms_norm_eps": 1e-6, "sliding_window": 6, "hidden_act": "silu", "torch_dtype": "float32"}`)
	cfg, err := config.Parse(raw, "mistral-test")
	if err != nil {
		t.Fatal(err)
	}
	m, err := models.New(cfg, g, models.Options{DType: tensor.F32})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.InitRandom(3); err != nil {
		t.Fatal(err)
	}
	prompts := [][]int32{{3, 9, 1, 22, 5}, {7, 2}, {11, 4, 30, 6, 8, 19, 2, 40, 41}, {5}}
	const n = 12
	got, err := m.GenerateBatch(prompts, models.BatchGenerateOptions{GenerateOptions: models.GenerateOptions{MaxNewTokens: n}})
	if err != nil {
		t.Fatal(err)
	}
	for r, p := range prompts {
		seq := slices.Clone(p)
		for range n {
			lg, err := m.NextLogits(seq)
			if err != nil {
				t.Fatal(err)
			}
			seq = append(seq, models.Argmax(lg))
		}
		if want := seq[len(p):]; !slices.Equal(got[r], want) {
			t.Errorf("row %d: batched cached greedy %v, uncached %v", r, got[r], want)
		}
	}
	report.addCheck("generate: batched KV-cache greedy decoding equals uncached argmax (mistral GQA + window, f32)", !t.Failed(), "")
}

// TestGPUGenerateThroughput samples 64 prompts x 256 new tokens (32-token prompts, temperature
// 1, no stop token) from the Qwen3-0.6B shape in bf16 and reports new tokens/s.
// scripts/gpu/generate-bench.sh runs transformers' generate on the same shape in the same call
// and writes the ratio.
func TestGPUGenerateThroughput(t *testing.T) {
	g := gpu(t)
	m := qwen3ShapeModel(t, g)
	defer m.Close()
	const B, P, New = 64, 32, 256
	prompts := make([][]int32, B)
	for r := range prompts {
		for i := range P {
			prompts[r] = append(prompts[r], int32((r*7919+i*104729+13)%151936))
		}
	}
	o := models.BatchGenerateOptions{GenerateOptions: models.GenerateOptions{MaxNewTokens: New, Temperature: 1, Seed: 1}}
	// A short warm-up builds the kernels.
	warm := o
	warm.MaxNewTokens = 4
	if _, err := m.GenerateBatch(prompts, warm); err != nil {
		t.Fatal(err)
	}
	g.ResetPeak()
	start := time.Now()
	out, err := m.GenerateBatch(prompts, o)
	if err == nil {
		err = g.Sync()
	}
	if err != nil {
		t.Fatal(err)
	}
	sec := time.Since(start).Seconds()
	tokens := 0
	for _, r := range out {
		tokens += len(r)
	}
	tokps := float64(tokens) / sec
	ms := g.MemStats()
	t.Logf("qwen3-0.6B shape, bf16, %d prompts x %d new tokens: %.0f new tokens/s (%.2f s), peak %.1f GiB",
		B, New, tokps, sec, float64(ms.Peak)/(1<<30))
	report.addBench(benchmark{Name: "generate_qwen3_0.6b_shape_b64_p32_new256_bf16", Values: map[string]float64{
		"new_tokens_per_s": tokps, "seconds": sec, "new_tokens": float64(tokens),
		"peak_allocated_gib": float64(ms.Peak) / (1 << 30),
	}, Note: fmt.Sprintf("models.GenerateBatch, temperature 1, prefill included; %d rows", B)})
}
