package train

import (
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
)

// qwen3_4B is Qwen/Qwen3-4B's config.json (tied embeddings).
func qwen3_4B(t *testing.T) *config.Config {
	t.Helper()
	c, err := config.Preset("qwen3", "qwen3-0.6b")
	if err != nil {
		t.Fatal(err)
	}
	c.HiddenSize, c.IntermediateSize, c.NumHiddenLayers = 2560, 9728, 36
	c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim, c.MaxWindowLayers = 32, 8, 128, 36
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestQLoRAEstimateOfTheBenchmark is the dry-run estimate of scripts/gpu/qlora-bench.sh's
// QLoRA setting (Qwen3-4B, r 16, alpha 32, all-linear, bf16, gradient checkpointing, 1 x 4096
// tokens): each part is what the model and the backend hold (the NF4 base at its packed size,
// the bf16 embedding, adapters with bf16 gradients and fp32 master weights and moments, the
// frozen head's 768-row loss chunks) and the total stays under the 6.5 GiB target; bf16 LoRA on
// the same shape needs 5 GiB more for its bf16 linears.
func TestQLoRAEstimateOfTheBenchmark(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(4))
	flags := []string{"--use_peft=true", "--lora_r=16", "--lora_alpha=32", "--lora_target_modules=all-linear",
		"--bf16=true", "--gradient_checkpointing=true", "--per_device_train_batch_size=1", "--max_length=4096"}
	mc := qwen3_4B(t)
	q, err := EstimateMemory(tinyConfig(t, path, append(flags, "--load_in_4bit=true", "--use_bnb_nested_quant=true")...), mc)
	if err != nil {
		t.Fatal(err)
	}
	lora, err := EstimateMemory(tinyConfig(t, path, flags...), mc)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("QLoRA:\n%s", q)
	t.Logf("bf16 LoRA:\n%s", lora)
	const gib = 1 << 30
	const V, C, L = 151936, 2560, 36
	perLayer := int64(2560*4096 + 2*2560*1024 + 4096*2560 + 3*2560*9728)
	if q.Quantized != L*perLayer {
		t.Errorf("%d parameters in NF4, want the %d of the 7 linears of 36 layers", q.Quantized, L*perLayer)
	}
	// NF4: half a byte per weight, plus one u8 scale per 64 and the nested fp32 scales.
	if nf4 := q.ParamBytes - (q.Params-q.Quantized+q.Adapters)*2; nf4 < q.Quantized/2 || nf4 > q.Quantized/2+q.Quantized/50 {
		t.Errorf("the NF4 base takes %d bytes for %d weights: want 0.5 byte each plus about 1/64 for scales", nf4, q.Quantized)
	}
	if q.Adapters != L*16*int64(2*(2560+4096)+2*(2560+1024)+3*(2560+9728)) {
		t.Errorf("%d adapter parameters, want r 16 on every linear", q.Adapters)
	}
	if q.OptimBytes != 12*q.Adapters || q.GradBytes != 2*q.Adapters {
		t.Errorf("optimizer %d and gradient %d bytes for %d adapters: want 12 and 2 per parameter", q.OptimBytes, q.GradBytes, q.Adapters)
	}
	rows := backend.CrossEntropyChunkRows(4096, V, backend.CrossEntropyFrozenChunkBytes)
	if want := backend.CrossEntropyScratch(rows, V, C, true, 2, false); q.LogitsBytes != want || rows != 768 {
		t.Errorf("loss head %d bytes in %d-row chunks; want %d (768-row chunks of a frozen head)", q.LogitsBytes, rows, want)
	}
	if q.ScratchBytes != 9728*2560*2 {
		t.Errorf("NF4 scratch %d bytes, want the largest weight in bf16", q.ScratchBytes)
	}
	if q.Total() > 65*gib/10 {
		t.Errorf("the QLoRA estimate is %.2f GiB, over the 6.5 GiB target", float64(q.Total())/gib)
	}
	// bf16 linears (6.77 GiB) against their NF4 form (1.74 GiB) and its scratch.
	if d := lora.Total() - q.Total(); d < 49*gib/10 || d > 51*gib/10 {
		t.Errorf("bf16 LoRA needs %.2f GiB more than QLoRA; want about 5.0 (6.77 GiB of bf16 linears against 1.74 in NF4)", float64(d)/gib)
	}
}
