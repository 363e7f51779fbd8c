package config

import (
	"strings"
	"testing"
)

func TestWriteSummary(t *testing.T) {
	for _, tc := range []struct {
		file string
		want []string
	}{
		{"qwen3-30b-a3b", []string{
			"model_type     qwen3_moe (Qwen3MoeForCausalLM)",
			"parameters     30.53B (30532122624) (3.35B (3353032704) active per token)",
			"rope           default, theta 1000000; context 40960",
			"attention      32 heads, 4 KV heads, head_dim 128 (q/k norm per head)",
			"experts        128 per layer, top-8, width 768, on 48 of 48 layers, renormalised, aux loss coef 0.001",
			"not understood max_window_layers (kept)",
		}},
		{"llama-3.2-1b", []string{
			"parameters     1.24B (1235814400)\n",
			"vocab          128256 (tied embeddings)",
			"rope           llama3, theta 500000, factor 32, low/high freq 1/4, original context 8192; context 131072",
		}},
		{"qwen3-0.6b-sliding", []string{"sliding window 4096 tokens on 8 of 28 layers"}},
		{"qwen2.5-0.5b", []string{"(qkv bias)", "not understood use_mrope (kept)"}},
		{`{"model_type":"llama","hidden_size":256,"num_attention_heads":8,"partial_rotary_factor":0.5,"max_length":20}`,
			[]string{"rotary dim 16", "dropped        max_length (generation parameters)"}},
	} {
		var c *Config
		if strings.HasPrefix(tc.file, "{") {
			var err error
			if c, err = Parse([]byte(tc.file), "inline"); err != nil {
				t.Fatal(err)
			}
		} else {
			c = mustParse(t, "testdata/hub/"+tc.file+".json")
		}
		var b strings.Builder
		if err := c.WriteSummary(&b); err != nil {
			t.Fatal(err)
		}
		for _, w := range tc.want {
			if !strings.Contains(b.String(), w) {
				t.Errorf("%s: summary lacks %q:\n%s", tc.file, w, b.String())
			}
		}
	}
}
