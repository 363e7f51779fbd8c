package config_test

import (
	"fmt"
	"os"

	"github.com/halo-shell/halo-shell/engine/hf/config"
)

// A transformers 4.x config.json (rope_theta + rope_scaling, torch_dtype) loads into the same
// typed Config as a 5.x one, with the family's defaults resolved.
func ExampleParse() {
	c, err := config.Parse([]byte(`{
		"model_type": "llama", "hidden_size": 2048, "num_attention_heads": 32,
		"num_key_value_heads": 8, "num_hidden_layers": 16, "vocab_size": 128256,
		"rope_theta": 500000.0, "torch_dtype": "bfloat16",
		"rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
			"high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
	}`), "config.json")
	if err != nil {
		fmt.Println(err)
		return
	}
	s := c.Shape()
	fmt.Println(c.ModelType, c.DType, s.HeadDim, s.KVDim(), c.Rope.Type, c.Rope.Theta, c.RMSNormEps)
	// Output: llama bfloat16 64 512 llama3 500000 1e-06
}

// Errors name the key and say what to change.
func ExampleParse_error() {
	_, err := config.Parse([]byte(`{"model_type": "qwen2", "num_attention_heads": 14, "num_key_value_heads": 4, "hidden_size": 896}`), "config.json")
	fmt.Println(err)
	// Output: config: config.json: num_attention_heads (14) is not a multiple of num_key_value_heads (4): set num_key_value_heads to one of [1 2 7 14]
}

// A preset, edited and written the way transformers 5.17 writes config.json.
func ExamplePreset() {
	c, err := config.Preset("qwen3_moe", "tiny")
	if err != nil {
		fmt.Println(err)
		return
	}
	c, err = c.Override(map[string]any{"vocab_size": 1000, "decoder_sparse_step": 2}, "example")
	if err != nil {
		fmt.Println(err)
		return
	}
	for i := 0; i < c.NumHiddenLayers; i++ {
		fmt.Println("layer", i, "MoE:", c.IsMoELayer(i))
	}
	fmt.Println(c.NumParameters(), "parameters,", c.ActiveParameters(), "active")
	dir, _ := os.MkdirTemp("", "cfg")
	defer os.RemoveAll(dir)
	fmt.Println(c.Write(dir))
	// Output:
	// layer 0 MoE: false
	// layer 1 MoE: true
	// 227200 parameters, 190336 active
	// <nil>
}
