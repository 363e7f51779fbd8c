package parallel

import (
	"errors"
	"testing"

	"github.com/halo-shell/halo-shell/engine/mesh"
)

// Tiny models of further MoE families: flex_olmo (OLMo 2's post-norms and projection-wide q/k
// norms around OLMoE's experts, renormalised top 2 of 4) and granitemoe (Granite's multipliers
// around experts its checkpoints hold fused, attention biases) and hunyuan_v1_moe (per-head q/k
// norms after RoPE, a shared MLP beside the experts) and ernie4_5_moe (interleaved rotary pairs,
// a dense first layer, softmax routing with a correction bias, a shared expert) and minimax_m2
// (projection-wide q/k norms, sigmoid routing with a correction bias) and laguna (per-head q/k
// norms and output gates, a sliding layer with its own rotary base and width, a dense layer,
// sigmoid routing with a correction bias and scaling, a shared expert).
func init() {
	tinyConfigs["flex_olmo"] = `{"model_type": "flex_olmo", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 8,
		"num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": true, "output_router_logits": true,
		"router_aux_loss_coef": 0.05, "attention_bias": true,
		"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2}`
	tinyConfigs["granitemoe"] = `{"model_type": "granitemoe", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 8,
		"num_local_experts": 4, "num_experts_per_tok": 2, "output_router_logits": true, "router_aux_loss_coef": 0.05,
		"attention_bias": true, "embedding_multiplier": 3.0, "residual_multiplier": 0.4, "attention_multiplier": 0.3,
		"logits_scaling": 2.0,
		"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2}`
	tinyConfigs["hunyuan_v1_moe"] = `{"model_type": "hunyuan_v1_moe", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 8,
		"num_experts": 4, "moe_topk": 2, "attention_bias": true,
		"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2}`
	tinyConfigs["ernie4_5_moe"] = `{"model_type": "ernie4_5_moe", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
		"moe_intermediate_size": 8, "moe_num_experts": 4, "moe_k": 2, "moe_num_shared_experts": 1,
		"moe_layer_start_index": 1, "output_router_logits": true, "router_aux_loss_coef": 0.05, "tie_word_embeddings": false,
		"num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2}`
	tinyConfigs["minimax_m2"] = `{"model_type": "minimax_m2", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 8,
		"num_local_experts": 4, "num_experts_per_tok": 2,
		"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2}`
	tinyConfigs["laguna"] = `{"model_type": "laguna", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
		"moe_intermediate_size": 8, "shared_expert_intermediate_size": 12, "num_experts": 4, "num_experts_per_tok": 2,
		"moe_routed_scaling_factor": 1.5, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
		"mlp_layer_types": ["dense", "sparse", "sparse"], "sliding_window": 5, "attention_bias": true,
		"num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2}`
}

// TestLagunaLayoutsMatchSingleDevice: the MoE layouts without expert-tensor parallelism give
// the single device's loss and gradients; under tensor parallelism each rank gates its own
// heads with its rows of g_proj.
func TestLagunaLayoutsMatchSingleDevice(t *testing.T) {
	checkLayouts(t, []string{"laguna"}, sharedExpertLayouts())
}

// TestMiniMaxM2LayoutsMatchSingleDevice: data parallelism, FSDP and expert parallelism give the
// single device's loss and gradients; tensor parallelism is refused by rule tp-qknorm.
func TestMiniMaxM2LayoutsMatchSingleDevice(t *testing.T) {
	checkLayouts(t, []string{"minimax_m2"}, []struct {
		n      int
		layout string
	}{{2, ""}, {2, "fsdp"}, {2, "ep=2"}, {4, "ep=4"}, {4, "ep=2 fsdp"}})
	l, err := mesh.ParseLayout("tp=2")
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(tinyModel(t, "minimax_m2", 1), cpuDevices(2), l, Options{})
	var le *mesh.LayoutError
	if !errors.As(err, &le) || le.Rule != mesh.RuleTPQKNorm {
		t.Errorf("minimax_m2 tp=2: got %v, want refusal by rule %s", err, mesh.RuleTPQKNorm)
	}
}

// TestErnieMoELayoutsMatchSingleDevice: the MoE layouts without expert-tensor parallelism give
// the single device's loss, aux loss and gradients.
func TestErnieMoELayoutsMatchSingleDevice(t *testing.T) {
	checkLayouts(t, []string{"ernie4_5_moe"}, sharedExpertLayouts())
}

// TestHunYuanMoELayoutsMatchSingleDevice: the MoE layouts without expert-tensor parallelism
// (refused for shared experts) give the single device's loss and gradients.
func TestHunYuanMoELayoutsMatchSingleDevice(t *testing.T) {
	checkLayouts(t, []string{"hunyuan_v1_moe"}, sharedExpertLayouts())
}

// TestGraniteMoELayoutsMatchSingleDevice: every MoE layout Mixtral supports (dp, fsdp, tp, ep,
// etp and their mixes) gives the single device's loss, aux loss and gradients.
func TestGraniteMoELayoutsMatchSingleDevice(t *testing.T) {
	checkLayouts(t, []string{"granitemoe"}, supportedMoE)
}

// TestFlexOlmoLayoutsMatchSingleDevice: data parallelism, FSDP and expert parallelism give the
// single device's loss, aux loss and gradients.
func TestFlexOlmoLayoutsMatchSingleDevice(t *testing.T) {
	checkLayouts(t, []string{"flex_olmo"}, []struct {
		n      int
		layout string
	}{{2, ""}, {2, "fsdp"}, {2, "ep=2"}, {4, "ep=4"}, {4, "ep=2 fsdp"}})
}

// TestFlexOlmoTensorParallelIsRefused: the projection-wide q/k norms cannot follow a split of
// the heads, so tensor parallelism is refused by rule tp-qknorm.
func TestFlexOlmoTensorParallelIsRefused(t *testing.T) {
	l, err := mesh.ParseLayout("tp=2")
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(tinyModel(t, "flex_olmo", 1), cpuDevices(2), l, Options{})
	var le *mesh.LayoutError
	if !errors.As(err, &le) || le.Rule != mesh.RuleTPQKNorm {
		t.Errorf("flex_olmo tp=2: got %v, want refusal by rule %s", err, mesh.RuleTPQKNorm)
	}
}
