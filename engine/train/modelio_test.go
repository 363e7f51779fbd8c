package train

import (
	"strings"
	"testing"
	"time"
)

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

func TestInitModelConfigRefusesWhatItWouldNotRead(t *testing.T) {
	for _, c := range []struct {
		name      string
		overrides map[string]any
		want      string
	}{
		{"misspelt key", map[string]any{"num_hiden_layers": 8}, `init.overrides: unknown key "num_hiden_layers": the qwen3 model reads no such config.json key (did you mean "num_hidden_layers"?)`},
		{"a key of another family", map[string]any{"num_local_experts": 8}, `unknown key "num_local_experts"`},
		{"a generation parameter", map[string]any{"temperature": 0.7}, `unknown key "temperature"`},
		{"a huge key", map[string]any{strings.Repeat("k", 1<<20): 1}, `unknown key "kkkkkkkk`},
		{"vocab_size below the tokenizer's", map[string]any{"vocab_size": 100}, "vocab_size 100 is smaller than the tokenizer's 300 tokens"},
	} {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			_, err := InitModelConfig(&InitConfig{Arch: "qwen3", Preset: "tiny", Overrides: c.overrides}, 300)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
			if len(err.Error()) > 400 {
				t.Errorf("the error is %d bytes long", len(err.Error()))
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %v", d)
			}
		})
	}
	// A vocab_size above the tokenizer's is honoured (a padded embedding), not replaced.
	c, err := InitModelConfig(&InitConfig{Arch: "qwen3", Preset: "tiny", Overrides: map[string]any{"vocab_size": 512, "max_position_embeddings": 4096}}, 300)
	if err != nil || c.VocabSize != 512 || c.MaxPositionEmbeddings != 4096 {
		t.Fatalf("vocab_size 512 over a 300-token tokenizer: %v, %v", c, err)
	}
}
