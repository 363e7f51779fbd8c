package parallel

import (
	"errors"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/mesh"
)

// Tiny models of the MoE families with shared experts: qwen2_moe (a gated shared expert, a
// dense first layer, q/k/v biases) and glm4_moe (sigmoid router with a correction bias, two
// groups of two experts of which the best one is kept, scaled weights, one shared expert, a
// dense first layer, per-head q/k norms).
func init() {
	tinyConfigs["qwen2_moe"] = `{"model_type": "qwen2_moe", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
		"moe_intermediate_size": 8, "shared_expert_intermediate_size": 12, "num_experts": 4, "num_experts_per_tok": 2,
		"mlp_only_layers": [0], "output_router_logits": true, "router_aux_loss_coef": 0.05,
		"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2}`
	tinyConfigs["glm4_moe"] = `{"model_type": "glm4_moe", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
		"moe_intermediate_size": 8, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
		"routed_scaling_factor": 2.0, "n_shared_experts": 1, "first_k_dense_replace": 1, "use_qk_norm": true,
		"attention_bias": true, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2}`
}

// sharedExpertLayouts are the MoE layouts without expert-tensor parallelism, which engine/mesh
// refuses for models with shared experts.
func sharedExpertLayouts() []struct {
	n      int
	layout string
} {
	var out []struct {
		n      int
		layout string
	}
	for _, l := range supportedMoE {
		if !strings.Contains(l.layout, "etp") {
			out = append(out, l)
		}
	}
	return out
}

func TestSharedExpertLayoutsMatchSingleDevice(t *testing.T) {
	checkLayouts(t, []string{"qwen2_moe", "glm4_moe"}, sharedExpertLayouts())
}

func TestSharedExpertETPIsRefused(t *testing.T) {
	for _, family := range []string{"qwen2_moe", "glm4_moe"} {
		l, err := mesh.ParseLayout("tp=2 etp=2")
		if err != nil {
			t.Fatal(err)
		}
		_, err = New(tinyModel(t, family, 1), cpuDevices(2), l, Options{})
		var le *mesh.LayoutError
		if !errors.As(err, &le) || le.Rule != mesh.RuleETP || !strings.Contains(err.Error(), "shared experts") {
			t.Errorf("%s tp=2 etp=2: got %v, want refusal by rule %s naming the shared experts", family, err, mesh.RuleETP)
		}
	}
}
