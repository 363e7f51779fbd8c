package parallel

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/optim"
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
			src := tinyModel(t, "deepseek_v4", 3)
			rows := tinyRows(4, 16, 41, 4)
			wantLoss, wantGrads, _ := referenceAux(t, src, rows)
			for _, tc := range []struct {
				n      int
				layout string
			}{{2, ""}, {2, "fsdp"}, {4, "fsdp"}} {
				t.Run(fmt.Sprintf("%d/%s", tc.n, strings.ReplaceAll(tc.layout, " ", ",")), func(t *testing.T) {
					p := newPlan(t, src, tc.n, tc.layout, optim.Config{})
					loss, _, err := p.ForwardBackward(rows)
					if err != nil {
						t.Fatal(err)
					}
					if math.Abs(loss-wantLoss) > 1e-6*math.Abs(wantLoss) {
						t.Errorf("loss %.9g, single device %.9g", loss, wantLoss)
					}
					grads, err := p.Grads()
					if err != nil {
						t.Fatal(err)
					}
					for _, s := range src.Specs {
						if err := closeTo(grads[s.Name], wantGrads[s.Name], 1e-5); err != nil {
							t.Errorf("gradient %s (%s): %v", s.Name, p.Placement(s.Name), err)
						}
					}
				})
			}
		})
	}
	src := tinyModel(t, "deepseek_v4", 3)
	for _, layout := range []string{"tp=2", "cp=2", "ep=2"} {
		l, err := mesh.ParseLayout(layout)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := New(src, cpuDevices(2), l, Options{}); err == nil || !strings.Contains(err.Error(), mesh.RuleHostDecoder) {
			t.Errorf("%s: %v, want a refusal naming rule %s", layout, err, mesh.RuleHostDecoder)
		}
	}
}
