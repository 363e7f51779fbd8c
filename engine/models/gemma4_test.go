package models

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
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

// TestGemma4Refusals: the parts of the decoder the model does not build, and the
// combinations of its optional parts that cannot be built, are refused naming the key; the
// per-layer inputs, the MoE block, shared KV layers and use_bidirectional_attention "vision"
// (image tokens only) are accepted for text.
func TestGemma4Refusals(t *testing.T) {
	base, err := config.Preset("gemma4_text", "tiny")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{[]string{"hidden_size_per_layer_input=8"}, ""},
		{[]string{"hidden_size_per_layer_input=8", "vocab_size_per_layer_input=0"}, "needs vocab_size_per_layer_input > 0"},
		// The tiny model's two layers are sliding then full: the full one has no earlier
		// full layer to share.
		{[]string{"num_kv_shared_layers=1"}, "layer 1 (full_attention) shares keys and values but no layer before"},
		{[]string{"enable_moe_block=true", "num_experts=4", "top_k_experts=2", "moe_intermediate_size=8"}, ""},
		{[]string{"enable_moe_block=true", "num_experts=4", "top_k_experts=5", "moe_intermediate_size=8"}, "top_k_experts 5 must be between 1 and num_experts 4"},
		{[]string{"enable_moe_block=true", "top_k_experts=2", "moe_intermediate_size=8"}, "enable_moe_block needs num_experts >= 1"},
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

// TestGemma4PartsLoRATargets: all-linear adapters reach the attention and the dense MLP beside
// the experts of every layer, and a shared KV layer's only projections (q_proj, o_proj); a
// training step runs through them.
func TestGemma4PartsLoRATargets(t *testing.T) {
	var a Arch
	for _, tc := range familyCases {
		if tc.name == "gemma4_all_parts" {
			a = tc.arch
		}
	}
	m := newTiny(t, newCPU(), a, Options{}, 5)
	if err := m.AttachLoRA(LoRAConfig{R: 2, Alpha: 4, Targets: []string{AllLinear}}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mod := range m.lora.Modules {
		got = append(got, mod.Name)
	}
	for _, want := range []string{"model.layers.0.self_attn.k_proj", "model.layers.2.self_attn.q_proj",
		"model.layers.2.self_attn.o_proj", "model.layers.2.mlp.gate_proj", "model.layers.1.mlp.down_proj"} {
		if !slices.Contains(got, want) {
			t.Errorf("no adapter on %s; adapters: %v", want, got)
		}
	}
	if slices.Contains(got, "model.layers.2.self_attn.k_proj") {
		t.Errorf("an adapter on the shared KV layer's k_proj, which it does not have")
	}
	b := Batch{Tokens: []int32{1, 2, 3, 4, 5, 6}, Targets: []int32{2, 3, 4, 5, 6, -100}}
	if _, _, err := m.ForwardBackward(b, 1); err != nil {
		t.Fatal(err)
	}
}

// TestGemma4PartsCountAsTransformers: config.Shape counts the optional parts' parameters as
// transformers does: the gemma4_text_ple fixture's parameter shapes (written by transformers)
// sum to NumParameters of the model loaded from it.
func TestGemma4PartsCountAsTransformers(t *testing.T) {
	dir := filepath.Join("testdata", "parity", "gemma4_text_ple")
	raw, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if os.IsNotExist(err) {
		t.Skipf("no fixture %s", dir)
	}
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		Shapes map[string][]int `json:"param_shapes"`
	}
	if err := json.Unmarshal(raw, &ref); err != nil {
		t.Fatal(err)
	}
	want := int64(0)
	for _, s := range ref.Shapes {
		n := int64(1)
		for _, d := range s {
			n *= int64(d)
		}
		want += n
	}
	m, err := Load(dir, newCPU(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if got := m.Arch.NumParameters(); got != want || want == 0 {
		t.Errorf("NumParameters %d, transformers' parameters %d", got, want)
	}
}
