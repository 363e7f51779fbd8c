package models

import (
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
)

// TestGemma4OverridesUnfoldPerLayerConfig: --set global_head_dim (a key transformers folds into
// per_layer_config) changes the full layers' head width and keeps their key/value heads.
func TestGemma4OverridesUnfoldPerLayerConfig(t *testing.T) {
	c, err := config.Preset("gemma4_text", "tiny")
	if err != nil {
		t.Fatal(err)
	}
	c, err = ApplyOverrides(c, []string{"global_head_dim=512", "sliding_window=5"})
	if err != nil {
		t.Fatal(err)
	}
	if hd, kv := c.Shape().LayerHeads(1); hd != 512 || kv != 1 {
		t.Errorf("full layer after --set global_head_dim=512: head_dim %d, kv heads %d; want 512, 1", hd, kv)
	}
	if hd, kv := c.Shape().LayerHeads(0); hd != 16 || kv != 2 {
		t.Errorf("sliding layer: head_dim %d, kv heads %d; want 16, 2", hd, kv)
	}
}
