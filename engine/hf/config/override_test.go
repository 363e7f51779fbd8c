package config

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestOverride(t *testing.T) {
	base, err := Preset("qwen3", "qwen3-0.6b")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		over map[string]any
		// check returns what is wrong, or "".
		check func(c *Config) string
	}{
		{"vocab and depth", map[string]any{"vocab_size": 1000, "num_hidden_layers": 3}, func(c *Config) string {
			if c.VocabSize != 1000 || c.NumHiddenLayers != 3 || len(c.LayerTypes) != 3 {
				return "vocab/depth/layer_types not applied"
			}
			return ""
		}},
		{"rope_theta", map[string]any{"rope_theta": 5e5}, func(c *Config) string {
			if c.Rope.Theta != 5e5 || c.Rope.Type != "default" {
				return "theta not applied"
			}
			return ""
		}},
		{"rope_scaling keeps theta", map[string]any{"rope_scaling": map[string]any{"rope_type": "linear", "factor": 2.0}}, func(c *Config) string {
			if c.Rope.Type != "linear" || c.Rope.Factor != 2 || c.Rope.Theta != 1e6 {
				return "rope_scaling not applied with the base theta"
			}
			return ""
		}},
		{"rope_scaling with rope_theta", map[string]any{"rope_theta": 2e4, "rope_scaling": map[string]any{"rope_type": "dynamic", "factor": 2.0}}, func(c *Config) string {
			if c.Rope.Type != "dynamic" || c.Rope.Theta != 2e4 {
				return "rope_theta lost next to rope_scaling"
			}
			return ""
		}},
		{"torch_dtype", map[string]any{"torch_dtype": "float32"}, func(c *Config) string {
			if c.DType != "float32" {
				return "dtype " + c.DType
			}
			return ""
		}},
		{"sliding", map[string]any{"use_sliding_window": true, "sliding_window": 128, "max_window_layers": 26}, func(c *Config) string {
			if !c.IsSlidingLayer(27) || c.IsSlidingLayer(25) {
				return "layer_types not re-derived"
			}
			return ""
		}},
		{"unknown key kept", map[string]any{"my_key": []int{1, 2}}, func(c *Config) string {
			if !slices.Equal(c.Unknown(), []string{"my_key"}) {
				return "Unknown() = " + strings.Join(c.Unknown(), ",")
			}
			return ""
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := base.Override(tc.over, "test")
			if err != nil {
				t.Fatal(err)
			}
			if msg := tc.check(c); msg != "" {
				t.Error(msg)
			}
			out := string(mustMarshal(t, c))
			if !strings.Contains(out, `"attention_dropout": 0.0,`) {
				t.Error("base float lost its form")
			}
		})
	}
	if _, err := base.Override(map[string]any{"num_key_value_heads": 3}, "over.yaml"); err == nil ||
		!strings.Contains(err.Error(), "config: over.yaml: num_attention_heads (16) is not a multiple of num_key_value_heads (3)") {
		t.Errorf("bad override: %v", err)
	}
	if _, err := base.Override(map[string]any{"hidden_size": "big"}, "over.yaml"); err == nil ||
		!strings.Contains(err.Error(), `key "hidden_size": expected an integer, got string "big"`) {
		t.Errorf("bad override type: %v", err)
	}
	if base.NumHiddenLayers != 28 || base.VocabSize != 151936 {
		t.Error("Override changed its receiver")
	}
}

// A Config inside another JSON document goes out and comes back through encoding/json.
func TestEncodingJSON(t *testing.T) {
	type doc struct {
		Name   string  `json:"name"`
		Config *Config `json:"config"`
	}
	c, err := Preset("llama", "llama-3.2-1b")
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(doc{Name: "x", Config: c})
	if err != nil {
		t.Fatal(err)
	}
	var back doc
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if back.Config == nil || !bytes.Equal(mustMarshal(t, back.Config), mustMarshal(t, c)) {
		t.Error("config changed through encoding/json")
	}
	err = json.Unmarshal([]byte(`{"config": {"model_type": "gpt2"}}`), &back)
	if err == nil || !strings.Contains(err.Error(), `config: json: unsupported model_type "gpt2"`) {
		t.Errorf("bad embedded config: %v", err)
	}
}

// TestOverrideUnderAnAlias checks that an override written under another name of a field
// (qwen3_moe reads both num_experts and num_local_experts) replaces the base value instead of
// being refused as a duplicate.
func TestOverrideUnderAnAlias(t *testing.T) {
	for _, tc := range []struct {
		family, key string
	}{
		{"qwen3_moe", "num_experts"},
		{"qwen3_moe", "num_local_experts"},
		{"mixtral", "num_local_experts"},
	} {
		base, err := Preset(tc.family, "tiny")
		if err != nil {
			t.Fatal(err)
		}
		n, err := base.Override(map[string]any{tc.key: 6}, "test")
		if err != nil {
			t.Errorf("%s %s: %v", tc.family, tc.key, err)
			continue
		}
		if n.NumExperts != 6 {
			t.Errorf("%s %s=6: NumExperts = %d", tc.family, tc.key, n.NumExperts)
		}
	}
}
