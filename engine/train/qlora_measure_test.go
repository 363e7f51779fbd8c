package train

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
)

// qloraPeak trains one step of a QLoRA run of an L-layer qwen3 (hidden 256, MLP 1024) over
// 1 x 256 packed tokens on the CPU and returns the backend's peak allocated bytes and the
// dry-run estimate of the same run.
func qloraPeak(t *testing.T, path string, layers int) (measured, estimated int64) {
	t.Helper()
	y := fmt.Sprintf(`init:
  arch: qwen3
  preset: tiny
  overrides: {hidden_size: 256, intermediate_size: 1024, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 64, num_hidden_layers: %d, tie_word_embeddings: true}
tokenizer_name_or_path: %s
dataset: {path: %s}
max_length: 256
packing: true
per_device_train_batch_size: 1
use_peft: true
lora_r: 16
lora_alpha: 32
lora_target_modules: all-linear
load_in_4bit: true
use_bnb_nested_quant: true
bf16: true
gradient_checkpointing: true
optim: adamw_torch
max_steps: 2
seed: 7
device: cpu
output_dir: %s
`, layers, quickTok, path, filepath.Join(t.TempDir(), "out"))
	return stepPeak(t, y)
}

// stepPeak trains one step of the SFT run config y describes (on the CPU) and returns the
// backend's peak allocated bytes and the dry-run estimate of the same run.
func stepPeak(t *testing.T, y string) (measured, estimated int64) {
	t.Helper()
	cfg, err := ParseConfig([]byte(y), "q.yaml", MethodSFT, nil)
	if err != nil {
		t.Fatal(err)
	}
	mc, err := ModelConfigFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	est, err := EstimateMemory(cfg, mc)
	if err != nil {
		t.Fatal(err)
	}
	tr := newTrainer(t, cfg)
	if _, err := tr.Step(context.Background()); err != nil {
		t.Fatal(err)
	}
	return tr.b.MemStats().Peak, est.Total()
}

// TestQLoRAEstimateTracksTheMeasuredPeak compares the dry-run estimate of a QLoRA run (NF4
// base, adapters, gradient checkpointing) with the peak the CPU backend measures, whose
// allocations are the device path's: each layer adds what the estimate says within 2%, and the
// whole run is estimated within 15% below to 5% above the measured peak (the estimate leaves
// out a few small backward buffers of the head and the last layer).
func TestQLoRAEstimateTracksTheMeasuredPeak(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(40))
	m1, e1 := qloraPeak(t, path, 1)
	m2, e2 := qloraPeak(t, path, 2)
	checkEstimateTracks(t, "1 layer", "2 layers", [2]int64{m1, e1}, [2]int64{m2, e2}, 0.85, 1.05)
}

// checkEstimateTracks checks (measured, estimated) peaks of a smaller and a larger run: the
// layers the larger adds grow the estimate within 2% of the measured growth, and each estimate
// lies within [lo, hi] of its measured peak.
func checkEstimateTracks(t *testing.T, smallName, largeName string, small, large [2]int64, lo, hi float64) {
	t.Helper()
	t.Logf("%s: measured %d, estimated %d; %s: measured %d, estimated %d", smallName, small[0], small[1], largeName, large[0], large[1])
	if dm, de := large[0]-small[0], large[1]-small[1]; float64(de) < 0.98*float64(dm) || float64(de) > 1.02*float64(dm) {
		t.Errorf("the layers %s adds over %s grow the measured peak by %d bytes and the estimate by %d; want them within 2%%", largeName, smallName, dm, de)
	}
	for _, c := range [][2]int64{small, large} {
		if r := float64(c[1]) / float64(c[0]); r < lo || r > hi {
			t.Errorf("estimate %d bytes for a measured peak of %d (%.3f); want %.2f to %.2f of it", c[1], c[0], r, lo, hi)
		}
	}
}
