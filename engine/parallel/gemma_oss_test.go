package parallel

import (
	"errors"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/mesh"
)

// Tiny gemma3_text and gpt_oss models with their features on: Gemma's sandwich norms with
// 1 + w gains, scaled embeddings, GeGLU, a sliding layer with its own RoPE base beside a
// linearly scaled full one, query_pre_attn_scalar and a final-logit cap; gpt-oss's sinks,
// attention biases, alternating sliding and full layers, and its expert block (router and
// expert biases, clamped SwiGLU).
func init() {
	tinyConfigs["gemma3_text"] = `{"model_type": "gemma3_text", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
		"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2, "pad_token_id": null,
		"bos_token_id": null, "eos_token_id": null, "sliding_window": 5, "query_pre_attn_scalar": 6,
		"final_logit_softcapping": 3.0, "layer_types": ["sliding_attention", "full_attention"],
		"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
			"sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}}`
	tinyConfigs["gpt_oss"] = `{"model_type": "gpt_oss", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 8,
		"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
		"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 5, "swiglu_limit": 1.0,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-5, "initializer_range": 0.2,
		"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 10000.0, "truncate": false}}`
}

// gptOssLayouts are the layouts the support matrix accepts for gpt_oss: data parallelism and
// FSDP.
var gptOssLayouts = []struct {
	n      int
	layout string
}{
	{2, ""}, {2, "fsdp"}, {4, ""}, {4, "fsdp"}, {8, "fsdp"},
}

func TestGemmaAndGptOssLayoutsMatchSingleDevice(t *testing.T) {
	checkLayouts(t, []string{"gemma3_text"}, supported)
	checkLayouts(t, []string{"gpt_oss"}, gptOssLayouts)
}

// TestGptOssRefusedLayouts: tensor and expert parallelism are refused by rule expert-bias and
// context parallelism by the MoE rule, before any device is opened.
func TestGptOssRefusedLayouts(t *testing.T) {
	for _, tc := range []struct {
		n            int
		layout, rule string
	}{{2, "tp=2", mesh.RuleExpertBias}, {2, "ep=2", mesh.RuleExpertBias}, {2, "cp=2", mesh.RuleSupport}} {
		src := tinyModel(t, "gpt_oss", 1)
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
			t.Errorf("gpt_oss %s: got %v, want refusal by rule %s", tc.layout, err, tc.rule)
		}
		if opened != 0 {
			t.Errorf("gpt_oss %s: %d devices opened before the refusal", tc.layout, opened)
		}
	}
}
