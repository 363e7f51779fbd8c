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

// TestMemoryEstimateCountsKeptQK: with HALO_ATTN_QK=keep, attention with q/k norms keeps the
// pre-norm q and k beside the normed ones, and the estimate counts them in every layer
// (L x tokens x (q + kv) widths); by default (recompute) it keeps neither. On the H200 the
// Qwen3-30B-A3B shape at 8 layers, 2 x 4096 tokens, peaked 0.56 GiB higher with keep
// (engine/bench/testdata/h200-2026-12-02c-moe), which is this formula's 8 x 8192 x 4608 x 2 bytes.
func TestMemoryEstimateCountsKeptQK(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(8))
	cfg := tinyConfig(t, path)
	mc, err := config.Parse([]byte(`{"model_type": "qwen3", "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64,
		"num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-6}`), filepath.Join("test", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	est := func(qk string) MemoryEstimate {
		t.Helper()
		t.Setenv("HALO_ATTN_QK", qk)
		e, err := EstimateMemory(cfg, mc)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	T := int64(cfg.Batch.PerDeviceTrainBatchSize * cfg.Batch.MaxLength)
	if got, want := est("keep").ActBytes-est("recompute").ActBytes, 3*T*(4*8+2*8)*4; got != want {
		t.Fatalf("keeping the pre-norm q/k adds %d activation bytes, want 3 layers x %d tokens x 48 x 4 = %d", got, T, want)
	}
}
