package train

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// gemma4MoEPeak trains one step of an L-layer (L even) gemma4_text with the MoE block beside every MLP
// (hidden 256, MLP 512, 16 GeGLU experts of 256, top-4, bf16) over 1 x 256 packed tokens on the
// CPU and returns the backend's peak allocated bytes and the dry-run estimate of the same run.
func gemma4MoEPeak(t *testing.T, path string, layers int) (measured, estimated int64) {
	t.Helper()
	types := strings.Repeat("sliding_attention, full_attention, ", layers/2)
	ov := fmt.Sprintf("{hidden_size: 256, intermediate_size: 512, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 64, "+
		"global_head_dim: 64, num_hidden_layers: %d, layer_types: [%s], "+
		"enable_moe_block: true, num_experts: 16, top_k_experts: 4, moe_intermediate_size: 256}", layers, strings.TrimSuffix(types, ", "))
	y := fmt.Sprintf(`init:
  arch: gemma4_text
  preset: tiny
  overrides: %s
tokenizer_name_or_path: %s
dataset: {path: %s}
max_length: 256
packing: true
per_device_train_batch_size: 1
bf16: true
optim: adamw_torch
max_steps: 2
seed: 7
device: cpu
output_dir: %s
`, ov, quickTok, path, filepath.Join(t.TempDir(), "out"))
	return stepPeak(t, y)
}

// TestGemma4MoEEstimateTracksTheMeasuredPeak compares the dry-run estimate of a full fine-tune
// of gemma4_text with the MoE block beside the MLP with the peak the CPU backend measures (its
// allocations are the device path's): two more layers add what the estimate says within 2%, and
// the whole run is estimated within 3% below to 5% above the measured peak. Without the block's
// activations (router and experts' norms, its routing and gate|up rows) a layer was 2.8% short.
func TestGemma4MoEEstimateTracksTheMeasuredPeak(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(40))
	m2, e2 := gemma4MoEPeak(t, path, 2)
	m4, e4 := gemma4MoEPeak(t, path, 4)
	checkEstimateTracks(t, "2 layers", "4 layers", [2]int64{m2, e2}, [2]int64{m4, e4}, 0.97, 1.05)
}
