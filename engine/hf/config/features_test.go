package config

import (
	"slices"
	"strings"
	"testing"
)

// Values transformers derives in the config classes of the families with Features, worked out
// by hand from their __post_init__ rules.
func TestFeatureFamiliesDerive(t *testing.T) {
	for _, tc := range []struct {
		name, json string
		check      func(t *testing.T, c *Config)
	}{
		{"olmo3 layer types", `{"model_type":"olmo3","num_hidden_layers":8}`, func(t *testing.T, c *Config) {
			want := []string{"sliding_attention", "sliding_attention", "sliding_attention", "full_attention",
				"sliding_attention", "sliding_attention", "sliding_attention", "full_attention"}
			if !slices.Equal(c.LayerTypes, want) || !c.IsSlidingLayer(0) || c.IsSlidingLayer(3) || c.SlidingWindow != 4096 {
				t.Errorf("layer_types %v window %d", c.LayerTypes, c.SlidingWindow)
			}
		}},
		{"olmo3 4.x rope", `{"model_type":"olmo3","rope_theta":10000,
			"rope_scaling":{"rope_type":"yarn","factor":8.0,"original_max_position_embeddings":8192}}`, func(t *testing.T, c *Config) {
			// Olmo3Config.convert_rope_params_to_dict: rope_scaling and the popped rope_theta go to
			// full_attention; sliding_attention keeps the default type and default_theta.
			if c.Rope.Type != "yarn" || c.Rope.Theta != 10000 || c.Rope.Factor != 8 {
				t.Errorf("full-attention rope %+v", c.Rope)
			}
			if c.SlidingRope.Type != "default" || c.SlidingRope.Theta != 500000 {
				t.Errorf("sliding-attention rope %+v", c.SlidingRope)
			}
		}},
		{"olmo3 rope per layer type", `{"model_type":"olmo3","rope_parameters":{"full_attention":{"rope_type":"default","rope_theta":1e6},"sliding_attention":{"rope_type":"default","rope_theta":1e4}}}`, func(t *testing.T, c *Config) {
			if c.Rope.Theta != 1e6 || c.SlidingRope.Theta != 1e4 {
				t.Errorf("full theta %g sliding theta %g", c.Rope.Theta, c.SlidingRope.Theta)
			}
		}},
		{"smollm3 kept keys", `{"model_type":"smollm3","max_window_layers":28,"pretraining_tp":2}`, func(t *testing.T, c *Config) {
			if u := c.Unknown(); len(u) != 0 {
				t.Errorf("not understood %v", u)
			}
			out := string(mustMarshal(t, c))
			if !strings.Contains(out, `"max_window_layers": 28`) || !strings.Contains(out, `"pretraining_tp": 2`) {
				t.Errorf("max_window_layers and pretraining_tp are written back as read:\n%s", out)
			}
		}},
		{"smollm3 nope layers", `{"model_type":"smollm3","num_hidden_layers":8,"use_sliding_window":true,"sliding_window":16}`, func(t *testing.T, c *Config) {
			if want := []int{1, 1, 1, 0, 1, 1, 1, 0}; !slices.Equal(c.NoRopeLayers, want) {
				t.Errorf("no_rope_layers %v, want %v", c.NoRopeLayers, want)
			}
			if c.UsesRoPE(3) || !c.UsesRoPE(2) || !c.IsSlidingLayer(7) || c.IsSlidingLayer(6) {
				t.Errorf("rope/sliding per layer wrong: %v %v", c.NoRopeLayers, c.LayerTypes)
			}
			if c.Rope.Theta != 2e6 || !c.TieWordEmbeddings {
				t.Errorf("theta %g tied %v", c.Rope.Theta, c.TieWordEmbeddings)
			}
		}},
		{"phi3 su is longrope", `{"model_type":"phi3","hidden_size":64,"num_attention_heads":4,"max_position_embeddings":128,"original_max_position_embeddings":32,
			"rope_scaling":{"type":"su","short_factor":[1,1,1,1,1,1,1,1],"long_factor":[2,2,2,2,2,2,2,2]}}`, func(t *testing.T, c *Config) {
			if c.Rope.Type != "longrope" || c.Rope.OriginalMaxPositionEmbeddings != 32 || c.Rope.PartialRotaryFactor != 1 {
				t.Errorf("rope %+v", c.Rope)
			}
		}},
		{"glm4 partial rotary", `{"model_type":"glm4","hidden_size":64,"num_attention_heads":4,"head_dim":16}`, func(t *testing.T, c *Config) {
			if c.RotaryDim() != 8 || !c.QKVBias() || c.OProjBias() {
				t.Errorf("rotary %d qkv bias %v o bias %v", c.RotaryDim(), c.QKVBias(), c.OProjBias())
			}
			out := string(mustMarshal(t, c))
			if strings.Count(out, `"partial_rotary_factor": 0.5`) != 2 {
				t.Errorf("partial_rotary_factor is written at the top level and in rope_parameters:\n%s", out)
			}
		}},
		{"glm4_moe head_dim floor", `{"model_type":"glm4_moe","partial_rotary_factor":0.5238095238095238}`, func(t *testing.T, c *Config) {
			// 4096 // 96 = 42 without head_dim, as transformers' getattr default gives.
			if c.HeadDim != 42 || c.RotaryDim() != 22 || c.IsMoELayer(0) || !c.IsMoELayer(1) || c.QKNorm() {
				t.Errorf("head_dim %d moe0 %v moe1 %v", c.HeadDim, c.IsMoELayer(0), c.IsMoELayer(1))
			}
			if s := c.Shape(); s.SharedExpert != 1408 || s.SharedExpertGate {
				t.Errorf("shared expert %d gated %v", s.SharedExpert, s.SharedExpertGate)
			}
		}},
		{"glm4_moe alias", `{"model_type":"glm4_moe","head_dim":128,"num_local_experts":16,"n_group":4,"topk_group":2,"use_qk_norm":true}`, func(t *testing.T, c *Config) {
			if c.NumExperts != 16 || c.QKNormKind() != QKNormPerHead {
				t.Errorf("experts %d qk norm %v", c.NumExperts, c.QKNormKind())
			}
		}},
		{"qwen2_moe unused window", `{"model_type":"qwen2_moe"}`, func(t *testing.T, c *Config) {
			if c.SlidingWindow != 0 || c.IsSlidingLayer(0) || !strings.Contains(string(mustMarshal(t, c)), `"sliding_window": 0,`) {
				t.Errorf("window %d, written as 0 expected:\n%s", c.SlidingWindow, mustMarshal(t, c))
			}
		}},
		{"qwen2_moe sliding on odd layers", `{"model_type":"qwen2_moe","num_hidden_layers":6,"max_window_layers":4,"use_sliding_window":true}`, func(t *testing.T, c *Config) {
			want := []string{"sliding_attention", "full_attention", "sliding_attention", "full_attention", "full_attention", "full_attention"}
			if !slices.Equal(c.LayerTypes, want) || !c.QKVBias() || c.OProjBias() {
				t.Errorf("layer_types %v", c.LayerTypes)
			}
			if s := c.Shape(); s.SharedExpert != 5632 || !s.SharedExpertGate {
				t.Errorf("shared expert %d gated %v", s.SharedExpert, s.SharedExpertGate)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.json), "test.json")
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
			again := mustParse2(t, mustMarshal(t, c))
			if got, want := string(mustMarshal(t, again)), string(mustMarshal(t, c)); got != want {
				t.Errorf("round trip changed the file at %s", diffLines([]byte(got), []byte(want)))
			}
		})
	}
}

func mustParse2(t *testing.T, data []byte) *Config {
	t.Helper()
	c, err := Parse(data, "again.json")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestFeatureFamiliesRefuse(t *testing.T) {
	for _, tc := range []struct{ name, json, want string }{
		{"granite zero logits scaling", `{"model_type":"granite","logits_scaling":0}`, "logits_scaling (0) must be a positive number"},
		{"phi3 other rope", `{"model_type":"phi3","rope_parameters":{"rope_type":"linear","factor":2.0}}`, `rope_type "linear" is not one phi3 has`},
		{"phi3 dropout", `{"model_type":"phi3","resid_pdrop":1.5}`, "resid_pdrop (1.5) must be a probability"},
		{"smollm3 short nope list", `{"model_type":"smollm3","num_hidden_layers":4,"no_rope_layers":[1,0]}`, "no_rope_layers has 2 entries but num_hidden_layers is 4"},
		{"smollm3 bad nope entry", `{"model_type":"smollm3","num_hidden_layers":2,"no_rope_layers":[1,2]}`, "no_rope_layers[1] is 2"},
		{"smollm3 sliding without switch", `{"model_type":"smollm3","num_hidden_layers":2,"sliding_window":8,"layer_types":["full_attention","sliding_attention"]}`, "use_sliding_window is false"},
		{"glm4_moe groups", `{"model_type":"glm4_moe","head_dim":128,"n_group":3}`, "n_group (3) must be at least 1 and divide n_routed_experts (128)"},
		{"glm4_moe topk groups", `{"model_type":"glm4_moe","head_dim":128,"n_routed_experts":8,"num_experts_per_tok":4,"n_group":4,"topk_group":1}`, "hold fewer than num_experts_per_tok"},
		{"olmo3 local base freq", `{"model_type":"olmo3","rope_local_base_freq":10000}`, `key "rope_local_base_freq" is not a olmo3 key`},
		{"olmo3 no window", `{"model_type":"olmo3","sliding_window":null}`, "sliding_window must be a positive number"},
		{"qwen2_moe bad mlp_only", `{"model_type":"qwen2_moe","num_hidden_layers":2,"mlp_only_layers":[5]}`, "mlp_only_layers[0] = 5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.json), "cfg.json")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// Parameter counts of the new structures, counted by hand from the weight tables of
// transformers' modules.
func TestFeatureFamiliesParameters(t *testing.T) {
	h, v, q, kv, f := int64(64), int64(256), int64(64), int64(32), int64(128)
	attn := h*q + 2*h*kv + q*h
	for _, tc := range []struct {
		family string
		want   int64
	}{
		// embed, lm_head, final norm; per layer attention, q/k norms over the projections, MLP, two norms
		{"olmo2", 2*v*h + h + 2*(attn+q+kv+3*h*f+2*h)},
		// four norms per layer, q/k/v biases
		{"glm4", 2*v*h + h + 2*(attn+q+2*kv+3*h*f+4*h)},
		// tied embeddings
		{"smollm3", v*h + h + 2*(attn+3*h*f+2*h)},
		// layer 0 dense; layer 1 router, 8 experts of 32, one shared expert of 32; q/k/v biases, per-head q/k norms
		{"glm4_moe", 2*v*h + h + 2*(attn+q+2*kv+2*16+2*h) + 3*h*f + (h*8 + 8*3*h*32 + 3*h*32)},
		// two sparse layers with a gated shared expert of 48
		{"qwen2_moe", 2*v*h + h + 2*(attn+q+2*kv+2*h) + 2*(h*8+8*3*h*32+3*h*48+h)},
	} {
		c, err := Preset(tc.family, "tiny")
		if err != nil {
			t.Fatal(err)
		}
		if got := c.NumParameters(); got != tc.want {
			t.Errorf("%s tiny: %d parameters, want %d", tc.family, got, tc.want)
		}
	}
}

// Keys a family does not know are refused with the key named, as they could change the model;
// metadata keys are not.
func TestFeatureFamiliesRefuseUnknownKeys(t *testing.T) {
	for _, fam := range []string{"olmo2", "olmo3", "phi3", "granite", "smollm3", "glm4", "qwen2_moe", "glm4_moe"} {
		extra := ""
		if fam == "glm4_moe" {
			extra = `, "head_dim": 128`
		}
		_, err := Parse([]byte(`{"model_type": "`+fam+`"`+extra+`, "use_post_norm": true}`), "cfg.json")
		if err == nil || !strings.Contains(err.Error(), `key "use_post_norm" is not a `+fam+` key`) {
			t.Errorf("%s: unknown key: %v", fam, err)
		}
		if _, err := Parse([]byte(`{"model_type": "`+fam+`"`+extra+`, "auto_map": {"AutoConfig": "x.Y"}}`), "cfg.json"); err != nil {
			t.Errorf("%s: auto_map refused: %v", fam, err)
		}
	}
	if _, err := Parse([]byte(`{"model_type": "phi3", "attention_bias": false}`), "cfg.json"); err != nil {
		t.Errorf("phi3 attention_bias (Phi-3.5 files) refused: %v", err)
	}
}
