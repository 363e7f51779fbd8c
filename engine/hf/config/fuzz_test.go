package config

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse: any input either parses or gives an error, never a panic; what parses writes a
// config.json that parses back to the same bytes.
func FuzzParse(f *testing.F) {
	for _, pattern := range []string{"testdata/hub/*.json", "testdata/transformers/saved/*.json", "testdata/golden/*.json"} {
		paths, _ := filepath.Glob(pattern)
		for _, p := range paths {
			if b, err := os.ReadFile(p); err == nil {
				f.Add(b)
			}
		}
	}
	for _, s := range []string{
		``, `{}`, `[]`, `null`, `{"model_type":"llama"}`, `{"model_type":"qwen3","num_hidden_layers":1e9}`,
		`{"model_type":"qwen3_moe","num_experts":2,"num_experts_per_tok":3}`,
		`{"model_type":"llama","rope_scaling":{"type":"yarn","factor":2,"beta_fast":-1}}`,
		`{"model_type":"mixtral","head_dim":null,"x":{"__float__":"NaN"},"y":1e308}`,
		`{"model_type":"olmoe","eos_token_id":[],"clip_qkv":8}`,
		`{"architectures":["Qwen2ForCausalLM"],"use_sliding_window":true,"sliding_window":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data, "fuzz")
		if err != nil {
			if c != nil {
				t.Fatal("config returned with an error")
			}
			return
		}
		out, err := c.MarshalJSON()
		if err != nil {
			t.Fatalf("parsed config does not write: %v", err)
		}
		back, err := Parse(out, "written")
		if err != nil {
			t.Fatalf("written config does not parse: %v\n%s", err, out)
		}
		again, err := back.MarshalJSON()
		if err != nil {
			t.Fatalf("second write: %v", err)
		}
		if !bytes.Equal(out, again) {
			t.Fatalf("write is not stable at %s", diffLines(again, out))
		}
	})
}

func BenchmarkParseQwen3(b *testing.B) {
	data, err := os.ReadFile("testdata/transformers/saved/qwen3-0.6b.json")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := Parse(data, "bench"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMarshalQwen3(b *testing.B) {
	c, err := Preset("qwen3", "qwen3-0.6b")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := c.MarshalJSON(); err != nil {
			b.Fatal(err)
		}
	}
}
