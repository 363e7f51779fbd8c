package train

import "testing"

// TestInitModelConfigAppliesOverrides checks that init.overrides reach the model config the
// way config.json keys do: rope_theta lands in the rope parameters, a new depth re-derives the
// per-layer types, the tokenizer's vocabulary size wins over the preset's, and a bad value is
// refused with the key named.
func TestInitModelConfigAppliesOverrides(t *testing.T) {
	c, err := InitModelConfig(&InitConfig{Arch: "qwen3", Preset: "tiny", Overrides: map[string]any{
		"rope_theta":        50000.0,
		"num_hidden_layers": 5,
		"hidden_size":       96,
	}}, 300)
	if err != nil {
		t.Fatal(err)
	}
	if c.Rope.Theta != 50000 {
		t.Errorf("rope theta = %v, want 50000", c.Rope.Theta)
	}
	if c.NumHiddenLayers != 5 || len(c.LayerTypes) != 5 {
		t.Errorf("layers = %d with %d layer types, want 5 and 5", c.NumHiddenLayers, len(c.LayerTypes))
	}
	if c.HiddenSize != 96 || c.VocabSize != 300 {
		t.Errorf("hidden %d vocab %d, want 96 and 300", c.HiddenSize, c.VocabSize)
	}
	if len(c.Architectures) == 0 || c.Architectures[0] != "Qwen3ForCausalLM" {
		t.Errorf("architectures = %v", c.Architectures)
	}
	if _, err := InitModelConfig(&InitConfig{Arch: "qwen3", Preset: "tiny", Overrides: map[string]any{
		"num_key_value_heads": 3,
	}}, 300); err == nil {
		t.Error("kv heads that do not divide the heads were accepted")
	}
}
