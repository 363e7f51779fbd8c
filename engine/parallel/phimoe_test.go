package parallel

import "testing"

// A tiny PhiMoE: LayerNorms with biases, attention and lm_head biases, the sparsemixer router
// over 4 experts (its threshold widened to 0.3 so that its stages keep several experts).
func init() {
	tinyConfigs["phimoe"] = `{"model_type": "phimoe", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 8,
		"num_local_experts": 4, "num_experts_per_tok": 2, "router_jitter_noise": 0.3, "output_router_logits": true,
		"router_aux_loss_coef": 0.05, "attention_bias": true, "lm_head_bias": true,
		"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2}`
}

// TestPhimoeLayoutsMatchSingleDevice: every MoE layout the support matrix accepts gives the
// single device's loss, aux loss and gradients, the norms' and the head's biases included.
func TestPhimoeLayoutsMatchSingleDevice(t *testing.T) {
	checkLayouts(t, []string{"phimoe"}, supportedMoE)
}
