package parallel

import (
	"errors"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/mesh"
)

// Tiny gemma4_text and lfm2_moe models with their features on: Gemma 4's sliding layer of
// 4-wide heads beside a full layer of 8-wide heads over two key/value heads shared with the
// values, v_norm, proportional RoPE and layer scalars; LFM2-MoE's short-convolution layer
// (3 taps, biases) before an attention layer with q/k layernorms, whose feed-forward is the
// sigmoid-routed MoE with the expert bias.
func init() {
	tinyConfigs["gemma4_text"] = `{"model_type": "gemma4_text", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
		"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
		"global_head_dim": 8, "num_global_key_value_heads": 2, "attention_k_eq_v": true,
		"hidden_size_per_layer_input": 0, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
		"initializer_range": 0.2, "pad_token_id": null, "bos_token_id": null, "eos_token_id": null,
		"sliding_window": 5, "final_logit_softcapping": 3.0, "layer_types": ["sliding_attention", "full_attention"],
		"rope_parameters": {"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 10000.0},
			"sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}}`
	// Gemma 4's optional parts: per-layer inputs, the last two layers attending over the
	// first two layers' keys and values with double-wide MLPs, the MoE block beside each MLP.
	// Weights of std 0.1: at 0.2 this four-layer model's gradients amplify the rounding of the
	// chunked context-parallel attention to about 1e-5 of their scale (the routing and the
	// loss agree), the comparison's tolerance.
	tinyConfigs["gemma4_text_parts"] = `{"model_type": "gemma4_text", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
		"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4, "global_head_dim": 8,
		"hidden_size_per_layer_input": 4, "vocab_size_per_layer_input": 41, "num_kv_shared_layers": 2, "use_double_wide_mlp": true,
		"enable_moe_block": true, "num_experts": 3, "top_k_experts": 2, "moe_intermediate_size": 8,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.1, "pad_token_id": null,
		"bos_token_id": null, "eos_token_id": null, "sliding_window": 5, "final_logit_softcapping": 3.0,
		"layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
		"rope_parameters": {"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 10000.0},
			"sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}}`
	tinyConfigs["lfm2_moe"] = `{"model_type": "lfm2_moe", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
		"moe_intermediate_size": 8, "num_experts": 4, "num_experts_per_tok": 2, "num_dense_layers": 1,
		"use_expert_bias": true, "routed_scaling_factor": 1.5, "conv_bias": true, "conv_L_cache": 3,
		"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "layer_types": ["conv", "full_attention"],
		"max_position_embeddings": 64, "norm_eps": 1e-5, "initializer_range": 0.2, "pad_token_id": null}`
}

// TestGemma4AndLFM2LayoutsMatchSingleDevice runs both families under the layouts they support
// against the single-device loss and gradients: Gemma 4 under data, FSDP, tensor (2: the
// full layers' two key/value heads) and context parallelism; LFM2-MoE under data, FSDP and
// expert parallelism; Gemma 4 with its optional parts under data, FSDP and context
// parallelism.
func TestGemma4AndLFM2LayoutsMatchSingleDevice(t *testing.T) {
	checkLayouts(t, []string{"gemma4_text"}, []struct {
		n      int
		layout string
	}{{1, ""}, {2, ""}, {2, "fsdp"}, {2, "tp=2"}, {2, "cp=2"}, {4, "fsdp"}, {4, "tp=2 fsdp"}, {4, "tp=2 cp=2"}, {8, "tp=2 cp=2 fsdp"}})
	checkLayouts(t, []string{"gemma4_text_parts"}, []struct {
		n      int
		layout string
	}{{1, ""}, {2, ""}, {2, "fsdp"}, {2, "cp=2"}, {4, "cp=2 fsdp"}})
	checkLayouts(t, []string{"lfm2_moe"}, []struct {
		n      int
		layout string
	}{{1, ""}, {2, ""}, {2, "fsdp"}, {4, "fsdp"}, {2, "ep=2"}, {4, "ep=4"}, {4, "ep=2 fsdp"}, {8, "ep=4 fsdp"}})
}

// TestGemma4AndLFM2LayoutsRefused: the layouts outside both families' support are refused by
// their rules before any device opens.
func TestGemma4AndLFM2LayoutsRefused(t *testing.T) {
	for _, tc := range []struct {
		family, layout string
		n              int
		rule           string
	}{
		{"gemma4_text", "tp=4", 4, mesh.RuleTPHeads}, // 2 key/value heads on the full layers
		{"gemma4_text_parts", "tp=2", 2, mesh.RuleGemma4Parts},
		{"lfm2_moe", "tp=2", 2, mesh.RuleTPConv},
		{"lfm2_moe", "cp=2", 2, mesh.RuleCPConv},
		{"lfm2_moe", "ep=2 tp=2 etp=2", 4, mesh.RuleTPConv},
	} {
		src := tinyModel(t, tc.family, 1)
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
			t.Errorf("%s %s: got %v, want refusal by rule %s", tc.family, tc.layout, err, tc.rule)
		}
		if opened != 0 {
			t.Errorf("%s %s: %d devices opened before the refusal", tc.family, tc.layout, opened)
		}
	}
}
