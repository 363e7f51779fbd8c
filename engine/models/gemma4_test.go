package models

import (
	"strings"
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

// TestGemma4Refusals: the parts of the decoder the model does not build are refused naming the
// key; use_bidirectional_attention "vision" (image tokens only) is accepted for text.
func TestGemma4Refusals(t *testing.T) {
	base, err := config.Preset("gemma4_text", "tiny")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{[]string{"hidden_size_per_layer_input=8"}, "hidden_size_per_layer_input 8 is not supported"},
		{[]string{"num_kv_shared_layers=1"}, "num_kv_shared_layers 1 is not supported"},
		{[]string{"enable_moe_block=true", "num_experts=4", "top_k_experts=2", "moe_intermediate_size=8"}, "enable_moe_block is not supported"},
		{[]string{`use_bidirectional_attention="all"`}, `use_bidirectional_attention "all" is not supported`},
		{[]string{`use_bidirectional_attention="vision"`}, ""},
	} {
		c, err := ApplyOverrides(base, tc.set)
		if err != nil {
			t.Fatal(err)
		}
		m, err := New(c, newCPU(), Options{})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v", tc.set, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: got %v, want an error containing %q", tc.set, err, tc.want)
		}
		if m != nil {
			m.Close()
		}
	}
}
