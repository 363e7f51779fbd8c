package parallel

import (
	"errors"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/mesh"
)

// Tiny models of the dense families whose decoders depart from Llama's, every feature on:
// granite's four multipliers, smollm3's NoPE layer with a sliding window, olmo2's post-norms
// and projection-wide q/k norms, olmo3's sliding layers, phi3's fused qkv_proj and gate_up_proj
// over a partial rotary embedding, glm4's four norms, q/k/v biases, fused gate_up_proj and
// interleaved partial rotary embedding.
func init() {
	for name, cfg := range map[string]string{
		"granite": `{"model_type": "granite", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
			"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
			"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2, "attention_bias": true,
			"embedding_multiplier": 3.0, "residual_multiplier": 0.5, "attention_multiplier": 0.3, "logits_scaling": 2.0}`,
		"smollm3": `{"model_type": "smollm3", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
			"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
			"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2,
			"no_rope_layers": [1, 0], "use_sliding_window": true, "sliding_window": 5}`,
		"olmo2": `{"model_type": "olmo2", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
			"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
			"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2, "pad_token_id": null}`,
		"olmo3": `{"model_type": "olmo3", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
			"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
			"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2, "pad_token_id": null,
			"sliding_window": 5}`,
		"phi3": `{"model_type": "phi3", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
			"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
			"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2, "pad_token_id": null,
			"partial_rotary_factor": 0.5}`,
		"glm4": `{"model_type": "glm4", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
			"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
			"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2, "pad_token_id": null}`,
	} {
		tinyConfigs[name] = cfg
	}
}

// noTP are the layouts without tensor parallelism, for the families that refuse it.
var noTP = []struct {
	n      int
	layout string
}{
	{2, ""}, {2, "fsdp"}, {2, "cp=2"}, {4, "cp=2 fsdp"}, {4, "cp=4"}, {8, "cp=4 fsdp"},
}

func TestDenseVariantLayoutsMatchSingleDevice(t *testing.T) {
	checkLayouts(t, []string{"granite", "smollm3"}, supported)
	checkLayouts(t, []string{"olmo2", "olmo3", "phi3", "glm4"}, noTP)
}

func TestDenseVariantTensorParallelismIsRefused(t *testing.T) {
	for _, tc := range []struct {
		family, rule string
	}{
		{"olmo2", mesh.RuleTPQKNorm}, {"olmo3", mesh.RuleTPQKNorm}, {"phi3", mesh.RuleTPFused}, {"glm4", mesh.RuleTPFused},
	} {
		src := tinyModel(t, tc.family, 1)
		l, err := mesh.ParseLayout("tp=2")
		if err != nil {
			t.Fatal(err)
		}
		opened := 0
		_, err = New(src, cpuDevices(2), l, Options{NewBackend: func(int) (backend.Backend, error) {
			opened++
			return cpu.New(cpu.Options{Workers: 1}), nil
		}})
		var le *mesh.LayoutError
		if !errors.As(err, &le) || le.Rule != tc.rule {
			t.Errorf("%s tp=2: got %v, want refusal by rule %s", tc.family, err, tc.rule)
		}
		if opened != 0 {
			t.Errorf("%s: %d devices opened before the refusal", tc.family, opened)
		}
	}
}
