package parallel

import (
	"errors"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/mesh"
)

// A tiny cohere2_moe: parallel layers with LayerNorms without bias, interleaved rotary pairs on
// the sliding and dense layers only (the full sparse layer attends unrotated), a dense first
// layer of its own width, softmax routing with a shared expert averaged in, scaled logits, an
// untied head. No attention biases: on the unrotated layer k_proj's bias adds the same q·b to
// every score of a query, so its gradient is zero up to rounding noise, which differs between
// layouts; engine/models' reference test checks the biases.
func init() {
	tinyConfigs["cohere2_moe"] = `{"model_type": "cohere2_moe", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 8,
		"prefix_dense_intermediate_size": 24, "num_experts": 4, "num_experts_per_tok": 2, "num_shared_experts": 1,
		"layer_types": ["full_attention", "sliding_attention", "full_attention"],
		"mlp_layer_types": ["dense", "sparse", "sparse"], "sliding_window": 5,
		"logit_scale": 0.5, "tie_word_embeddings": false, "pad_token_id": null, "bos_token_id": null, "eos_token_id": null,
		"num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
		"max_position_embeddings": 64, "initializer_range": 0.2}`
}

// TestCohere2MoELayoutsMatchSingleDevice: the MoE layouts without expert-tensor parallelism
// give the single device's loss and gradients; under tensor parallelism each rank's parallel
// layer adds its partial attention and MLP outputs, reduced in their row-parallel projections.
func TestCohere2MoELayoutsMatchSingleDevice(t *testing.T) {
	checkLayouts(t, []string{"cohere2_moe"}, sharedExpertLayouts())
}

// TestCohere2MoERefusedLayouts: expert-tensor parallelism is refused for its shared expert
// (rule etp) and context parallelism of an MoE model by rule support.
func TestCohere2MoERefusedLayouts(t *testing.T) {
	for _, tc := range []struct {
		n      int
		layout string
		rule   string
	}{{2, "tp=2 etp=2", mesh.RuleETP}, {2, "cp=2", mesh.RuleSupport}} {
		l, err := mesh.ParseLayout(tc.layout)
		if err != nil {
			t.Fatal(err)
		}
		_, err = New(tinyModel(t, "cohere2_moe", 1), cpuDevices(tc.n), l, Options{})
		var le *mesh.LayoutError
		if !errors.As(err, &le) || le.Rule != tc.rule {
			t.Errorf("cohere2_moe %s: got %v, want refusal by rule %s", tc.layout, err, tc.rule)
		}
		if tc.rule == mesh.RuleETP && (err == nil || !strings.Contains(err.Error(), "shared experts")) {
			t.Errorf("cohere2_moe %s: %v does not name the shared experts", tc.layout, err)
		}
	}
}
