package config

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"
)

// The config.json transformers 5.17 wrote for the deepseek_v4 parity fixture is read and
// written back byte for byte, and its parameter count is transformers' (the sum of the
// fixture's named_parameters shapes in reference.json).
func TestDeepseekV4FixtureRoundTrip(t *testing.T) {
	raw, err := os.ReadFile("../../models/testdata/parity/deepseek_v4/config.json")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(raw, "fixture")
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, raw) {
		t.Errorf("written config differs from transformers' at %s", diffLines(got, raw))
	}
	if n := c.Shape().NumParameters(); n != 100373 {
		t.Errorf("%d parameters, transformers counts 100373", n)
	}
	if c.RotaryDim() != 8 || c.SlidingRope.Theta != 10000 || c.Rope.Theta != 160000 {
		t.Errorf("rotary %d, main theta %g, compress theta %g", c.RotaryDim(), c.SlidingRope.Theta, c.Rope.Theta)
	}
}

// A file without the derived keys gets them as DeepseekV4Config.__post_init__ derives them.
func TestDeepseekV4Derives(t *testing.T) {
	c, err := Parse([]byte(`{"model_type": "deepseek_v4", "num_hidden_layers": 5, "head_dim": 128,
		"qk_rope_head_dim": 64, "rope_theta": 50000.0, "compress_rope_theta": 80000.0}`), "t")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{DSV4HCA, DSV4HCA, DSV4HCA, DSV4CSA, DSV4HCA}; !slices.Equal(c.LayerTypes, want) {
		t.Errorf("layer_types %v, want %v", c.LayerTypes, want)
	}
	if want := []string{DSV4HashMoE, DSV4HashMoE, DSV4HashMoE, DSV4MoE, DSV4MoE}; !slices.Equal(c.MLPLayerTypes, want) {
		t.Errorf("mlp_layer_types %v, want %v", c.MLPLayerTypes, want)
	}
	if c.Rope.PartialRotaryFactor != 0.5 || c.SlidingRope.PartialRotaryFactor != 0.5 || c.RotaryDim() != 64 {
		t.Errorf("partial rotary %g / %g, rotary %d; want 0.5 from qk_rope_head_dim 64 of 128", c.Rope.PartialRotaryFactor, c.SlidingRope.PartialRotaryFactor, c.RotaryDim())
	}
	if c.SlidingRope.Theta != 50000 || c.Rope.Theta != 80000 {
		t.Errorf("main theta %g, compress theta %g; want rope_theta 50000 and compress_rope_theta 80000", c.SlidingRope.Theta, c.Rope.Theta)
	}
	if c.CompressRates[DSV4CSA] != 4 || c.CompressRates[DSV4HCA] != 128 {
		t.Errorf("compress_rates %v", c.CompressRates)
	}
	out, err := c.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{`"main": {`, `"compress": {`, `"qk_rope_head_dim": 64`, `"partial_rotary_factor": 0.5`} {
		if !strings.Contains(string(out), s) {
			t.Errorf("written config lacks %s:\n%s", s, out)
		}
	}
}

func TestDeepseekV4Refusals(t *testing.T) {
	base := `"model_type": "deepseek_v4", "num_hidden_layers": 2`
	for _, tc := range []struct{ name, json, want string }{
		{"scoring", `{` + base + `, "scoring_func": "softmax"}`, `scoring_func "softmax"`},
		{"kv heads", `{` + base + `, "num_key_value_heads": 2}`, "one shared key/value head"},
		{"layer type", `{` + base + `, "layer_types": ["sliding_attention", "full_attention"]}`, "layer_types"},
		{"layer count", `{` + base + `, "mlp_layer_types": ["moe"]}`, "mlp_layer_types has 1 entries"},
		{"rate", `{` + base + `, "compress_rates": {"compressed_sparse_attention": 4}}`, "no positive rate"},
		{"flat rope", `{` + base + `, "rope_parameters": {"rope_type": "default", "rope_theta": 1.0}}`, "one dictionary per layer type"},
		{"groups", `{` + base + `, "o_groups": 3}`, "o_groups (3) must divide"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.json), "t")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// Overriding another key keeps layer_types that were given, not derived.
func TestDeepseekV4OverrideKeepsLayerTypes(t *testing.T) {
	c, err := Preset("deepseek_v4", "tiny")
	if err != nil {
		t.Fatal(err)
	}
	o, err := c.Override(map[string]any{"sliding_window": 4, "num_hidden_layers": 3}, "t")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{DSV4Sliding, DSV4CSA, DSV4HCA}; !slices.Equal(o.LayerTypes, want) {
		t.Errorf("layer_types %v after the override, want %v", o.LayerTypes, want)
	}
	d, err := New("deepseek_v4")
	if err != nil {
		t.Fatal(err)
	}
	o, err = d.Override(map[string]any{"num_hidden_layers": 4}, "t")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{DSV4HCA, DSV4HCA, DSV4HCA, DSV4CSA}; !slices.Equal(o.LayerTypes, want) {
		t.Errorf("derived layer_types %v for 4 layers, want %v", o.LayerTypes, want)
	}
}
