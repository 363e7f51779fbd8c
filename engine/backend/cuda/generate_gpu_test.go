package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/tensor"
	"github.com/halo-shell/halo-shell/internal/switches"
)

// Batched generation on the GPU: the decoding ops (DecodeAttention, SampleTokens) against the
// CPU backend; models.GenerateBatch's device decoder against uncached decoding on the same GPU
// and against the CPU token for token; its host waits per decoding step; the host decoder's
// KV-cache gather; and the sampling throughput of the Qwen3-0.6B shape.

// TestGPUGenerateBatchMatchesUncached decodes prompts of different lengths greedily, batched
// with the KV cache, on an f32 model with GQA and a sliding window, and checks every row
// against the argmax of full uncached forwards on the same GPU.
func TestGPUGenerateBatchMatchesUncached(t *testing.T) {
	for _, dec := range []string{"device", "host"} {
		t.Run(dec, func(t *testing.T) {
			t.Setenv("HALO_GENERATE", dec)
			checkGenerateMatchesUncached(t, gpu(t), dec)
		})
	}
}

func checkGenerateMatchesUncached(t *testing.T, g *Backend, dec string) {
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
	report.addCheck("generate ("+dec+" decoder): batched KV-cache greedy decoding equals uncached argmax (mistral GQA + window, f32)", !t.Failed(), "")
}

// TestGPUDecodeAttentionMatchesCPU runs one decoding step over a slotted cache on both backends:
// GQA groups of 1, 4 and 16 heads, head dims 64 and 128, rows at the first, last and middle
// positions of their slots, with and without a sliding window, f32 and bf16. The whole caches
// are compared (the appended rows written, every other row untouched), with Out and LSE.
func TestGPUDecodeAttentionMatchesCPU(t *testing.T) {
	g := gpu(t)
	for _, s := range []struct {
		B, Cap, NH, NKV, HD, Window int
		dt                          tensor.DType
		pos                         []int32
	}{
		{5, 40, 8, 2, 64, 0, tensor.F32, []int32{0, 5, 39, 17, 1}},
		{5, 40, 8, 2, 64, 7, tensor.F32, []int32{0, 5, 39, 17, 1}},
		{3, 300, 16, 16, 128, 0, tensor.F32, []int32{299, 128, 255}},
		{4, 290, 16, 8, 128, 0, tensor.BF16, []int32{31, 287, 130, 0}},
		{2, 64, 32, 2, 128, 5, tensor.BF16, []int32{63, 2}},
	} {
		abs, rel := 1e-4, 1e-4
		if s.dt == tensor.BF16 {
			abs, rel = 1e-2, 2*bf16Eps
		}
		kw, qw := s.NKV*s.HD, s.NH*s.HD
		c := opCase{
			Name: fmt.Sprintf("decode_attention/%s/B%d_cap%d_h%d_kv%d_d%d_w%d", s.dt, s.B, s.Cap, s.NH, s.NKV, s.HD, s.Window),
			Tensors: []tspec{
				{Name: "q", DType: s.dt, Shape: []int{s.B, qw}, Gen: gen{Scale: 1}},
				{Name: "k", DType: s.dt, Shape: []int{s.B, kw}, Gen: gen{Scale: 1}},
				{Name: "v", DType: s.dt, Shape: []int{s.B, kw}, Gen: gen{Scale: 1}},
				{Name: "pos", DType: tensor.I32, Shape: []int{s.B}, Gen: gen{Ints: s.pos}},
				{Name: "ck", DType: s.dt, Shape: []int{s.B * s.Cap, kw}, Gen: gen{Scale: 1}, Out: true, AbsFrac: 0, Rel: 0},
				{Name: "cv", DType: s.dt, Shape: []int{s.B * s.Cap, kw}, Gen: gen{Scale: 1}, Out: true, AbsFrac: 0, Rel: 0},
				{Name: "out", DType: s.dt, Shape: []int{s.B, qw}, Out: true, AbsFrac: abs, Rel: rel},
				{Name: "lse", DType: tensor.F32, Shape: []int{s.B, s.NH}, Out: true, AbsFrac: 1e-5, Rel: 1e-5},
			},
			Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
				return be.Optional().DecodeAttention(backend.DecodeAttentionArgs{
					Out: ts["out"], LSE: ts["lse"], Q: ts["q"], K: ts["k"], V: ts["v"], CacheK: ts["ck"], CacheV: ts["cv"],
					Positions: ts["pos"], Cap: s.Cap, NH: s.NH, NKV: s.NKV, HD: s.HD, Window: s.Window,
				})
			},
		}
		t.Run(c.Name, func(t *testing.T) { runCase(t, g, c) })
	}
}

// TestGPUSampleTokensMatchesCPU samples from the same logits on both backends: greedy, the full
// vocabulary, top-k, top-p, both, and soft-capped logits, f32 and bf16, over a vocabulary the
// size of Qwen3's. The two draw the same uniforms, so every id must agree; a row with a NaN
// logit must be flagged on both.
func TestGPUSampleTokensMatchesCPU(t *testing.T) {
	g := gpu(t)
	ref := cpu.New(cpu.Options{})
	defer ref.Close()
	const B, V = 6, 151936
	rng := rand.New(rand.NewPCG(5, 6))
	logits := make([]float32, B*V)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 3)
	}
	logits[4*V+77] = float32(math.NaN())
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		for _, a := range []backend.SampleArgs{
			{Temperature: 0},
			{Temperature: 1},
			{Temperature: 0.7, TopK: 50},
			{Temperature: 1, TopP: 0.9},
			{Temperature: 1.2, TopK: 1000, TopP: 0.5},
			{Temperature: 1, TopK: 1},
			{Temperature: 0.8, Softcap: 5},
		} {
			a.Seed, a.Step = 11, 3
			name := fmt.Sprintf("sample/%s/T%v_k%d_p%v_cap%v", dt, a.Temperature, a.TopK, a.TopP, a.Softcap)
			t.Run(name, func(t *testing.T) {
				var ids, bad [2][]int32
				for i, be := range []backend.Backend{ref, g} {
					lg, err := backend.FromFloat32(be, logits, dt, B, V)
					if err != nil {
						t.Fatal(err)
					}
					out, _ := be.Alloc(tensor.I32, B)
					flags, _ := be.Alloc(tensor.I32, B)
					a := a
					a.Logits, a.Out, a.Bad = lg, out, flags
					if err := be.Optional().SampleTokens(a); err != nil {
						t.Fatalf("%s: %v", be.Name(), err)
					}
					if ids[i], err = backend.ToInt32(be, out); err != nil {
						t.Fatal(err)
					}
					if bad[i], err = backend.ToInt32(be, flags); err != nil {
						t.Fatal(err)
					}
					be.Free(lg)
					be.Free(out)
					be.Free(flags)
				}
				ok := slices.Equal(ids[0], ids[1]) && slices.Equal(bad[0], bad[1]) && bad[1][4] == 1
				report.addCheck(name+": the same ids as the CPU", ok, fmt.Sprintf("cpu %v bad %v, cuda %v bad %v", ids[0], bad[0], ids[1], bad[1]))
				if !ok {
					t.Errorf("cpu ids %v (NaN rows %v), cuda ids %v (NaN rows %v); row 4 holds a NaN", ids[0], bad[0], ids[1], bad[1])
				}
			})
		}
	}
}

// tinyF32 is a small f32 Qwen3 with random weights from seed on be.
func tinyF32(t *testing.T, be backend.Backend, seed uint64) *models.Model {
	t.Helper()
	cfg, err := config.Parse(qwen3JSON(64, 128, 2, 4, 2, 16, 500), "qwen3-tiny")
	if err != nil {
		t.Fatal(err)
	}
	m, err := models.New(cfg, be, models.Options{DType: tensor.F32})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.InitRandom(seed); err != nil {
		m.Close()
		t.Fatal(err)
	}
	return m
}

// TestGPUGenerateMatchesCPU decodes greedily on the GPU (the device decoder) and on the CPU
// (the host decoder, the reference) from the same f32 weights and checks every row token for
// token. Where they part, the CPU's two best logits at that step must be closer than the f32
// GEMMs can resolve (a tie), else the test fails.
func TestGPUGenerateMatchesCPU(t *testing.T) {
	g := gpu(t)
	ref := cpu.New(cpu.Options{})
	defer ref.Close()
	mg, mc := tinyF32(t, g, 9), tinyF32(t, ref, 9)
	defer mg.Close()
	defer mc.Close()
	prompts := [][]int32{{3, 9, 1, 22, 5}, {7, 2}, {11, 4, 30, 6, 8, 19, 2, 40, 41}, {5}, {100, 200, 300, 400}}
	o := models.BatchGenerateOptions{GenerateOptions: models.GenerateOptions{MaxNewTokens: 24, StopIDs: []int32{7}}}
	t.Setenv("HALO_GENERATE", "device")
	got, err := mg.GenerateBatch(prompts, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("HALO_GENERATE", "host")
	want, err := mc.GenerateBatch(prompts, o)
	if err != nil {
		t.Fatal(err)
	}
	same, ties := 0, 0
	for r := range prompts {
		if slices.Equal(got[r], want[r]) {
			same++
			continue
		}
		k := 0
		for k < min(len(got[r]), len(want[r])) && got[r][k] == want[r][k] {
			k++
		}
		if k == len(got[r]) || k == len(want[r]) {
			t.Errorf("row %d: cuda %v, cpu %v: one stops where the other goes on", r, got[r], want[r])
			continue
		}
		lg, err := mc.NextLogits(append(slices.Clone(prompts[r]), want[r][:k]...))
		if err != nil {
			t.Fatal(err)
		}
		if gap := lg[want[r][k]] - lg[got[r][k]]; gap > 1e-4 {
			t.Errorf("row %d parts at new token %d: cuda %d, cpu %d, whose logits differ by %g on the CPU (not a tie)", r, k, got[r][k], want[r][k], gap)
			continue
		}
		ties++
	}
	report.addCheck("generate: the cuda device decoder equals the cpu host decoder token for token at temperature 0 (f32 qwen3, stop id)", !t.Failed(),
		fmt.Sprintf("%d of %d rows identical, %d part at a tie of the two best logits", same, len(prompts), ties))
}

// TestGPUDecodeStepHostWaits counts the host's waits for the GPU over a whole GenerateBatch of
// the device decoder: the only ones allowed are the reads of the sampled ids, one every
// HALO_GENERATE_CHECK_EVERY steps and one at the end, so a decoding step waits 1/8 times.
func TestGPUDecodeStepHostWaits(t *testing.T) {
	g := gpu(t)
	m := qwen3Model(t, g, qwen3JSON(128, 256, 2, 4, 2, 32, 1000), 3)
	defer m.Close()
	t.Setenv("HALO_GENERATE", "device")
	t.Setenv("HALO_GENERATE_CHECK_EVERY", "8")
	prompts := make([][]int32, 8)
	for r := range prompts {
		for i := range 5 + 3*r {
			prompts[r] = append(prompts[r], int32((r*31+i*17+1)%1000))
		}
	}
	const steps = 33
	o := models.BatchGenerateOptions{GenerateOptions: models.GenerateOptions{MaxNewTokens: steps, Temperature: 1, TopK: 20, TopP: 0.9, Seed: 2}}
	if _, err := m.GenerateBatch(prompts, o); err != nil { // builds the kernels and GEMM plans
		t.Fatal(err)
	}
	before := g.Syncs()
	out, err := m.GenerateBatch(prompts, o)
	if err != nil {
		t.Fatal(err)
	}
	delta := syncDelta(before, g.Syncs())
	reads := int64((steps-1)/8 + 1) // at steps 8, 16, 24, 32 and the end
	ok := len(delta) == 1 && delta["Download"] == reads
	for r := range out {
		ok = ok && len(out[r]) == steps
	}
	report.addCheck("generate: the device decoder waits for the GPU only to read the ids every 8 steps", ok,
		fmt.Sprintf("waits by op over %d steps: %v (want Download x%d: %.3f per decoding step)", steps, delta, reads, float64(reads)/steps))
	if !ok {
		t.Fatalf("GenerateBatch of %d steps made the host wait %v; want only %d Downloads (the id reads)", steps, delta, reads)
	}
}

// benchModel is the Qwen3-0.6B-shaped model of the sampling benchmark: the checkpoint that
// HALO_GENERATE_BENCH_MODEL names (transformers' weights, scripts/gpu/generate-bench.sh), or
// random weights.
func benchModel(t *testing.T, g *Backend) (*models.Model, string) {
	dir := switches.GenerateBenchModel.Value()
	if dir == "" {
		return qwen3ShapeModel(t, g), "random weights"
	}
	m, err := models.Load(dir, g, models.Options{DType: tensor.BF16})
	if err != nil {
		t.Fatalf("HALO_GENERATE_BENCH_MODEL=%s: %v", dir, err)
	}
	return m, "the weights of " + dir
}

// TestGPUGenerateThroughput samples 64 prompts x 256 new tokens (32-token prompts, temperature
// 1 over the whole vocabulary, no stop token) from the Qwen3-0.6B shape in bf16 and reports new
// tokens/s, with the device decoder and, for comparison, the host decoder, and the host waits
// per decoding step. scripts/gpu/generate-bench.sh runs transformers' generate on the same
// weights and prompts in the same call and writes the ratio.
func TestGPUGenerateThroughput(t *testing.T) {
	g := gpu(t)
	m, weights := benchModel(t, g)
	defer m.Close()
	const B, P, New = 64, 32, 256
	prompts := make([][]int32, B)
	for r := range prompts {
		for i := range P {
			prompts[r] = append(prompts[r], int32((r*7919+i*104729+13)%151936))
		}
	}
	o := models.BatchGenerateOptions{GenerateOptions: models.GenerateOptions{MaxNewTokens: New, Temperature: 1, Seed: 1}}
	for _, dec := range []string{"device", "host"} {
		t.Run(dec, func(t *testing.T) {
			t.Setenv("HALO_GENERATE", dec)
			// A short warm-up builds the kernels.
			warm := o
			warm.MaxNewTokens = 4
			if _, err := m.GenerateBatch(prompts, warm); err != nil {
				t.Fatal(err)
			}
			g.ResetPeak()
			before := g.Syncs()
			start := time.Now()
			out, err := m.GenerateBatch(prompts, o)
			if err == nil {
				err = g.Sync()
			}
			if err != nil {
				t.Fatal(err)
			}
			sec := time.Since(start).Seconds()
			waits := g.Syncs().Total - before.Total
			tokens := 0
			for _, r := range out {
				tokens += len(r)
			}
			tokps := float64(tokens) / sec
			ms := g.MemStats()
			t.Logf("%s decoder, qwen3-0.6B shape (%s), bf16, %d prompts x %d new tokens: %.0f new tokens/s (%.2f s), %d host waits, peak %.1f GiB",
				dec, weights, B, New, tokps, sec, waits, float64(ms.Peak)/(1<<30))
			name := "generate_qwen3_0.6b_shape_b64_p32_new256_bf16"
			if dec == "host" {
				name += "_host_decoder"
			}
			report.addBench(benchmark{Name: name, Values: map[string]float64{
				"new_tokens_per_s": tokps, "seconds": sec, "new_tokens": float64(tokens),
				"host_waits": float64(waits), "host_waits_per_step": float64(waits) / New,
				"peak_allocated_gib": float64(ms.Peak) / (1 << 30),
			}, Note: fmt.Sprintf("models.GenerateBatch, %s decoder, %s, temperature 1, prefill included; %d rows", dec, weights, B)})
		})
	}
}
