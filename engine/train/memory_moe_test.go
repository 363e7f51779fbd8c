package train

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/nn"
)

// TestMemoryEstimateCountsMoEActivations: the estimate's activations count, for each sparse
// layer, what the device path of the MoE block keeps (nn.MoEKeptBytes, which engine/nn tests
// against the block's real allocations) instead of a dense MLP; a dense layer (mlp_only_layers)
// keeps its MLP's gate, up and SwiGLU output.
func TestMemoryEstimateCountsMoEActivations(t *testing.T) {
	t.Setenv("HALO_MOE_EXPERT_OUTPUTS", "keep") // the experts' outputs are among the kept bytes
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(8))
	cfg := tinyConfig(t, path)
	const C, I, EI, E, K, L = 32, 64, 24, 8, 2, 3
	parse := func(onlyDense string) *config.Config {
		t.Helper()
		js := fmt.Sprintf(`{"model_type": "qwen3_moe", "vocab_size": 300, "hidden_size": %d, "intermediate_size": %d,
			"moe_intermediate_size": %d, "num_experts": %d, "num_experts_per_tok": %d, "norm_topk_prob": true,
			"mlp_only_layers": [%s], "num_hidden_layers": %d, "num_attention_heads": 2, "num_key_value_heads": 1,
			"head_dim": 16, "max_position_embeddings": 64, "rms_norm_eps": 1e-6}`, C, I, EI, E, K, onlyDense, L)
		mc, err := config.Parse([]byte(js), filepath.Join("test", "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		return mc
	}
	est := func(mc *config.Config) MemoryEstimate {
		t.Helper()
		e, err := EstimateMemory(cfg, mc)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	T := cfg.Batch.PerDeviceTrainBatchSize * cfg.Batch.MaxLength
	allSparse, oneDense := est(parse("")), est(parse("1"))
	moe := nn.MoEKeptBytes(T, C, E, K, EI, 4)
	dense := int64(T) * 3 * I * 4
	backward := int64(T) * I * 4 // the dense MLP's backward buffer, counted once there is a dense layer
	if got := oneDense.ActBytes - allSparse.ActBytes; got != dense-moe+backward {
		t.Fatalf("turning one sparse layer dense changes the activations by %d bytes, want the dense MLP's %d minus the MoE layer's %d plus the dense backward's %d",
			got, dense, moe, backward)
	}
	// The sorted rows and the SwiGLU output are not among the kept activations.
	kept := moe - int64(T)*int64(E)*4 - 3*int64(T*K)*4 - (E+1)*4
	if want := int64(T*K) * (2*EI + C) * 4; kept != want {
		t.Fatalf("per-slot activations %d bytes, want gate|up and the expert output, %d", kept, want)
	}
}
