package parallel

import (
	"errors"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/optim"
)

// The gated delta-net families (qwen3_next, qwen3_5_moe_text): a linear-attention layer (2 key
// heads serving 4 value heads) and a gated full-attention layer with partial rotary; 4 experts
// of 8 (top 2) and a gated shared expert.
func init() {
	tinyConfigs["qwen3_next"] = `{"model_type": "qwen3_next", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
		"moe_intermediate_size": 8, "shared_expert_intermediate_size": 12, "num_experts": 4, "num_experts_per_tok": 2,
		"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4,
		"layer_types": ["linear_attention", "full_attention"], "linear_num_key_heads": 2, "linear_num_value_heads": 4,
		"linear_key_head_dim": 4, "linear_value_head_dim": 3, "linear_conv_kernel_dim": 3, "partial_rotary_factor": 0.5,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2}`
	tinyConfigs["qwen3_5_moe_text"] = `{"model_type": "qwen3_5_moe_text", "vocab_size": 41, "hidden_size": 16,
		"moe_intermediate_size": 8, "shared_expert_intermediate_size": 12, "num_experts": 4, "num_experts_per_tok": 2,
		"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
		"layer_types": ["full_attention", "linear_attention"], "linear_num_key_heads": 1, "linear_num_value_heads": 2,
		"linear_key_head_dim": 4, "linear_value_head_dim": 5, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
		"initializer_range": 0.2}`
}

// TestLinearAttentionLayoutsMatchSingleDevice runs the gated delta-net families under every
// layout they support — data parallelism, FSDP, expert parallelism with and without FSDP —
// against the single-device loss and gradients.
func TestLinearAttentionLayoutsMatchSingleDevice(t *testing.T) {
	checkLayouts(t, []string{"qwen3_next", "qwen3_5_moe_text"}, []struct {
		n      int
		layout string
	}{{1, ""}, {2, ""}, {2, "fsdp"}, {4, "fsdp"}, {2, "ep=2"}, {4, "ep=4"}, {4, "ep=2 fsdp"}})
}

// TestLinearAttentionLayoutsRefused: tensor parallelism (rule tp-linear), context parallelism
// (rule cp-linear) and expert-tensor parallelism (rule etp, the shared expert) are refused
// before any device opens.
func TestLinearAttentionLayoutsRefused(t *testing.T) {
	src := tinyModel(t, "qwen3_next", 1)
	for _, tc := range []struct {
		n      int
		layout string
		rule   string
	}{
		{2, "tp=2", mesh.RuleTPLinear},
		{4, "ep=2 tp=2 etp=2", mesh.RuleTPLinear},
		{2, "cp=2", mesh.RuleCPLinear},
		{2, "etp=2", mesh.RuleETP},
	} {
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
			t.Errorf("%s on %d: got %v, want refusal by rule %s", tc.layout, tc.n, err, tc.rule)
			continue
		}
		if opened != 0 {
			t.Errorf("%s: %d devices were opened before the refusal", tc.layout, opened)
		}
	}
}

// TestLinearAttentionMemoryEstimateMatchesAllocatedState: mesh.Estimate's parameters,
// gradients and optimizer state (whole linear layers, q_proj's gate rows) equal what each rank
// allocates.
func TestLinearAttentionMemoryEstimateMatchesAllocatedState(t *testing.T) {
	for _, family := range []string{"qwen3_next", "qwen3_5_moe_text"} {
		src := tinyModel(t, family, 1)
		for _, tc := range []struct {
			n      int
			layout string
		}{{1, ""}, {2, "fsdp"}, {2, "ep=2"}, {4, "ep=2 fsdp"}} {
			p := newPlan(t, src, tc.n, tc.layout, optim.Config{})
			est := mesh.Estimate(p.Mesh.Layout, ShapeOf(src), mesh.Workload{SeqLen: 16})
			want := est.Params + est.Grads + est.Optimizer
			for _, rk := range p.ranks {
				got := rk.dev.MemStats().Allocated - rk.shard.pack.Bytes()
				if d := got - want; d < -256 || d > 256+3*arenaPad(rk.m) {
					t.Errorf("%s %d %q rank %d: allocated %d bytes, estimate of params+grads+optimizer %d (%s)", family, tc.n, tc.layout, rk.id, got, want, est)
				}
			}
		}
	}
}
