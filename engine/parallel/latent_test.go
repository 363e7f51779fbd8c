package parallel

import (
	"errors"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/optim"
)

// The latent-attention families (deepseek_v3, glm4_moe_lite): 8 heads with q rank 6 (or a
// plain q_proj), kv rank 8, 4+4 query/key dims and 3 value dims; 4 experts of 8 (top 2) in 2
// groups (the best one kept) under the sigmoid router, a shared expert, a dense first layer.
func init() {
	tinyConfigs["deepseek_v3"] = `{"model_type": "deepseek_v3", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
		"moe_intermediate_size": 8, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
		"n_shared_experts": 1, "routed_scaling_factor": 2.0, "first_k_dense_replace": 1,
		"q_lora_rank": 6, "kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 3,
		"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2}`
	tinyConfigs["glm4_moe_lite"] = `{"model_type": "glm4_moe_lite", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
		"moe_intermediate_size": 8, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
		"n_shared_experts": 1, "routed_scaling_factor": 1.8, "mlp_layer_types": ["sparse", "dense"],
		"q_lora_rank": null, "kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 10,
		"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8, "rope_interleave": false,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-5, "initializer_range": 0.2}`
	// Every layer dense: latent attention alone, for context parallelism.
	tinyConfigs["deepseek_v3_dense"] = `{"model_type": "deepseek_v3", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
		"moe_intermediate_size": 8, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
		"first_k_dense_replace": 2, "q_lora_rank": 6, "kv_lora_rank": 8, "qk_nope_head_dim": 4,
		"qk_rope_head_dim": 4, "v_head_dim": 3, "num_hidden_layers": 2, "num_attention_heads": 8,
		"num_key_value_heads": 8, "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2}`
}

// TestLatentLayoutsMatchSingleDevice runs the latent-attention families under every layout
// they support — data parallelism, FSDP, expert parallelism with and without FSDP, and for a
// model without experts context parallelism — against the single-device loss and gradients.
func TestLatentLayoutsMatchSingleDevice(t *testing.T) {
	checkLayouts(t, []string{"deepseek_v3", "glm4_moe_lite"}, []struct {
		n      int
		layout string
	}{{1, ""}, {2, ""}, {2, "fsdp"}, {4, "fsdp"}, {2, "ep=2"}, {4, "ep=4"}, {4, "ep=2"}, {4, "ep=2 fsdp"}, {8, "ep=4 fsdp"}})
	checkLayouts(t, []string{"deepseek_v3_dense"}, []struct {
		n      int
		layout string
	}{{2, "cp=2"}, {4, "cp=4"}, {4, "cp=2 fsdp"}, {8, "cp=2 fsdp"}})
}

// TestLatentLayoutsRefused: tensor parallelism (rule tp-latent, also under expert-tensor
// parallelism) and context parallelism of the MoE layers are refused before any device opens.
func TestLatentLayoutsRefused(t *testing.T) {
	moe, dense := tinyModel(t, "deepseek_v3", 1), tinyModel(t, "deepseek_v3_dense", 1)
	for _, tc := range []struct {
		name   string
		n      int
		layout string
		rule   string
	}{
		{"deepseek_v3", 2, "tp=2", mesh.RuleTPLatent},
		{"deepseek_v3", 4, "ep=2 tp=2 etp=2", mesh.RuleTPLatent},
		{"deepseek_v3_dense", 4, "tp=2 cp=2", mesh.RuleTPLatent},
		{"deepseek_v3", 2, "cp=2", mesh.RuleSupport},
		{"deepseek_v3", 2, "etp=2", mesh.RuleETP},
	} {
		src := moe
		if tc.name == "deepseek_v3_dense" {
			src = dense
		}
		l, err := mesh.ParseLayout(tc.layout)
		if err != nil {
			t.Fatal(err)
		}
		opened := 0
		_, err = New(src, cpuDevices(tc.n), l, Options{NewBackend: func(int) (backend.Backend, error) {
			opened++
			return cpu.New(cpu.Options{Workers: 1}), nil
		}})
		var le *mesh.LayoutError
		if !errors.As(err, &le) || le.Rule != tc.rule {
			t.Errorf("%s on %d (%s): got %v, want refusal by rule %s", tc.layout, tc.n, tc.name, err, tc.rule)
			continue
		}
		if opened != 0 {
			t.Errorf("%s: %d devices were opened before the refusal", tc.layout, opened)
		}
	}
}

// TestLatentMemoryEstimateMatchesAllocatedState: mesh.Estimate's parameters, gradients and
// optimizer state for the latent families (whole latent attention, shared experts, the
// routers' correction biases) equal what each rank allocates.
func TestLatentMemoryEstimateMatchesAllocatedState(t *testing.T) {
	for _, family := range []string{"deepseek_v3", "glm4_moe_lite", "deepseek_v3_dense"} {
		src := tinyModel(t, family, 1)
		layouts := []struct {
			n      int
			layout string
		}{{1, ""}, {2, "fsdp"}, {8, "fsdp"}}
		if src.IsMoE() {
			layouts = append(layouts, []struct {
				n      int
				layout string
			}{{2, "ep=2"}, {4, "ep=4"}, {4, "ep=2 fsdp"}}...)
		}
		for _, tc := range layouts {
			p := newPlan(t, src, tc.n, tc.layout, optim.Config{})
			est := mesh.Estimate(p.Mesh.Layout, ShapeOf(src), mesh.Workload{SeqLen: 16})
			want := est.Params + est.Grads + est.Optimizer
			for _, rk := range p.ranks {
				got := rk.dev.MemStats().Allocated - rk.shard.pack.Bytes()
				// The rank also holds its RoPE table (a few bytes); under FSDP the last rank's
				// shard may be a few elements shorter than the even share the estimate counts.
				if d := got - want; d < -256 || d > 256 {
					t.Errorf("%s %d %q rank %d: allocated %d bytes, estimate of params+grads+optimizer %d (%s)", family, tc.n, tc.layout, rk.id, got, want, est)
				}
			}
		}
	}
}
