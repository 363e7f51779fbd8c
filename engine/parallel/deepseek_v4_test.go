package parallel

import (
	"testing"

	"github.com/halo-shell/halo-shell/engine/mesh"
)

// A tiny deepseek_v4: two hyper-connection streams, a sliding, a compressed sparse (rate 4,
// the indexer keeping 2) and a heavily compressed layer (rate 8), the first hash-routed, four
// experts of 8 with a shared one, clamps that hold.
func init() {
	tinyConfigs["deepseek_v4"] = `{"model_type": "deepseek_v4", "vocab_size": 41, "hidden_size": 16,
		"moe_intermediate_size": 8, "num_hidden_layers": 3, "num_attention_heads": 2, "num_key_value_heads": 1,
		"head_dim": 8, "q_lora_rank": 8, "o_groups": 2, "o_lora_rank": 4, "sliding_window": 5,
		"compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
		"layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
		"mlp_layer_types": ["hash_moe", "moe", "moe"], "n_routed_experts": 4, "num_experts_per_tok": 2,
		"n_shared_experts": 1, "hc_mult": 2, "hc_sinkhorn_iters": 3, "index_n_heads": 2, "index_head_dim": 4,
		"index_topk": 2, "swiglu_limit": 1.0, "num_nextn_predict_layers": 0, "max_position_embeddings": 64,
		"initializer_range": 0.2, "pad_token_id": null, "bos_token_id": null, "eos_token_id": null,
		"partial_rotary_factor": 0.5}`
}

// TestDeepseekV4LayoutsMatchSingleDevice: deepseek_v4 (its own decoder, on the host tape and
// through the backend's ops) under data parallelism and FSDP gives the single device's loss
// and gradients; the layouts that would split its parameters or documents are refused by the
// host-decoder rule.
func TestDeepseekV4LayoutsMatchSingleDevice(t *testing.T) {
	for _, path := range []string{"host", "device"} {
		t.Run(path, func(t *testing.T) {
			t.Setenv("HALO_DSV4_PATH", path)
			checkWholeLayouts(t, tinyModel(t, "deepseek_v4", 3), mesh.RuleHostDecoder)
		})
	}
}
