package models

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
)

// TestInitCheckpoint checks init-model: vocabulary from the tokenizer, special ids from
// tokenizer_config.json, overrides applied (layer_types re-derived), tokenizer files copied,
// and the checkpoint loads and runs.
func TestInitCheckpoint(t *testing.T) {
	b := newCPU()
	out := t.TempDir()
	cfg, err := InitCheckpoint(b, InitSpec{
		Arch: "qwen3", Preset: "tiny", TokenizerDir: "testdata/tokenizer", OutDir: out, Seed: 7,
		Set: []string{"num_hidden_layers=3", "hidden_size=32", "head_dim=8", "tie_word_embeddings=true"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.VocabSize != 660 || cfg.NumHiddenLayers != 3 || cfg.HiddenSize != 32 || !cfg.TieWordEmbeddings {
		t.Errorf("config vocab %d layers %d hidden %d tied %v", cfg.VocabSize, cfg.NumHiddenLayers, cfg.HiddenSize, cfg.TieWordEmbeddings)
	}
	if len(cfg.LayerTypes) != 3 {
		t.Errorf("layer_types %v not re-derived for 3 layers", cfg.LayerTypes)
	}
	if len(cfg.EOSTokenIDs) != 1 || cfg.EOSTokenIDs[0] != 656 || cfg.PadTokenID == nil || *cfg.PadTokenID != 656 {
		t.Errorf("eos %v pad %v, want 656 from tokenizer_config.json", cfg.EOSTokenIDs, cfg.PadTokenID)
	}
	for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("missing %s: %v", f, err)
		}
	}
	m, err := Load(out, b, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if len(m.Unused) != 0 {
		t.Errorf("unused tensors %v", m.Unused)
	}
	lp, err := m.Logprobs([]int32{1, 2, 3, 659})
	if err != nil || len(lp) != 3 {
		t.Fatalf("logprobs %v, %v", lp, err)
	}
	// Same seed, same weights.
	out2 := t.TempDir()
	if _, err := InitCheckpoint(b, InitSpec{Arch: "qwen3", Preset: "tiny", TokenizerDir: "testdata/tokenizer", OutDir: out2, Seed: 7,
		Set: []string{"num_hidden_layers=3", "hidden_size=32", "head_dim=8", "tie_word_embeddings=true"}}); err != nil {
		t.Fatal(err)
	}
	w1, _ := os.ReadFile(filepath.Join(out, "model.safetensors"))
	w2, _ := os.ReadFile(filepath.Join(out2, "model.safetensors"))
	if string(w1) != string(w2) {
		t.Error("the same seed wrote different weights")
	}
}

// TestInitCheckpointErrors checks that bad requests name what is wrong.
func TestInitCheckpointErrors(t *testing.T) {
	b := newCPU()
	cases := []struct {
		name string
		spec InitSpec
		want string
	}{
		{"unknown family", InitSpec{Arch: "gpt9", Preset: "tiny", OutDir: t.TempDir()}, "gpt9"},
		{"unknown preset", InitSpec{Arch: "llama", Preset: "huge", OutDir: t.TempDir()}, "huge"},
		{"malformed set", InitSpec{Arch: "llama", Preset: "tiny", OutDir: t.TempDir(), Set: []string{"num_hidden_layers"}}, "key=value"},
		{"wrong type", InitSpec{Arch: "llama", Preset: "tiny", OutDir: t.TempDir(), Set: []string{"hidden_size=wide"}}, "hidden_size"},
		{"vocab too small", InitSpec{Arch: "llama", Preset: "tiny", OutDir: t.TempDir(), TokenizerDir: "testdata/tokenizer", Set: []string{"vocab_size=100"}}, "smaller than the tokenizer"},
		{"no output", InitSpec{Arch: "llama", Preset: "tiny"}, "output directory"},
		{"missing tokenizer", InitSpec{Arch: "llama", Preset: "tiny", OutDir: t.TempDir(), TokenizerDir: "testdata/nowhere"}, "nowhere"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := InitCheckpoint(b, tc.spec)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

// TestApplyOverridesKeepsOtherKeys checks that overrides change only what they name.
func TestApplyOverridesKeepsOtherKeys(t *testing.T) {
	c, err := config.Preset("mistral", "tiny")
	if err != nil {
		t.Fatal(err)
	}
	got, err := ApplyOverrides(c, []string{"sliding_window=8", `rope_parameters={"rope_type":"linear","factor":2.0,"rope_theta":10000.0}`})
	if err != nil {
		t.Fatal(err)
	}
	if got.SlidingWindow != 8 || got.Rope.Type != "linear" || got.Rope.Factor != 2 || got.HiddenSize != c.HiddenSize {
		t.Errorf("sliding_window %d rope %+v hidden %d", got.SlidingWindow, got.Rope, got.HiddenSize)
	}
}

// TestApplyOverridesByAlias checks that --set by another name of a field replaces the preset's
// value (qwen3_moe's config.json writes num_local_experts; transformers also reads num_experts),
// and that naming both names in one call is still refused.
func TestApplyOverridesByAlias(t *testing.T) {
	c, err := config.Preset("qwen3_moe", "tiny")
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"num_experts", "num_local_experts"} {
		got, err := ApplyOverrides(c, []string{key + "=12"})
		if err != nil {
			t.Fatalf("--set %s=12: %v", key, err)
		}
		if got.NumExperts != 12 {
			t.Errorf("--set %s=12: %d experts, want 12", key, got.NumExperts)
		}
	}
	if _, err := ApplyOverrides(c, []string{"num_experts=12", "num_local_experts=6"}); err == nil || !strings.Contains(err.Error(), "keep one") {
		t.Errorf("two names of one field in one call: got %v, want the both-set refusal", err)
	}
}
