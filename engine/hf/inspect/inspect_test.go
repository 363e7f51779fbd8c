package inspect

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from this package's output")

const qwen3MoEConfig = `{
  "architectures": ["Qwen3MoeForCausalLM"],
  "model_type": "qwen3_moe",
  "torch_dtype": "bfloat16",
  "vocab_size": 32,
  "hidden_size": 8,
  "intermediate_size": 16,
  "moe_intermediate_size": 4,
  "num_hidden_layers": 12,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "head_dim": 2,
  "max_position_embeddings": 128,
  "num_experts": 8,
  "num_experts_per_tok": 2,
  "rope_theta": 1000000.0,
  "tie_word_embeddings": true
}
`

// writeCheckpoint writes a small sharded checkpoint whose layer numbers test natural ordering.
func writeCheckpoint(t *testing.T, cfg string) string {
	t.Helper()
	dir := t.TempDir()
	tensors := []safetensors.Tensor{
		{Name: "model.embed_tokens.weight", DType: safetensors.BF16, Shape: []int{32, 8}, Data: make([]byte, 2*32*8)},
	}
	for _, l := range []string{"0", "2", "10", "11"} {
		tensors = append(tensors, safetensors.Tensor{Name: "model.layers." + l + ".input_layernorm.weight", DType: safetensors.F32, Shape: []int{8}, Data: make([]byte, 32)})
	}
	tensors = append(tensors, safetensors.Tensor{Name: "model.layers.2.mlp.experts.gate_up_proj", DType: safetensors.F8_E4M3, Shape: []int{8, 8, 8}, Data: make([]byte, 512)})
	if _, err := safetensors.SaveCheckpoint(dir, tensors, safetensors.CheckpointOptions{MaxShardSize: 600}); err != nil {
		t.Fatal(err)
	}
	if cfg != "" {
		if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		os.MkdirAll("testdata", 0o755)
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s:\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

func TestInspectShardedWithTypedConfig(t *testing.T) {
	dir := writeCheckpoint(t, qwen3MoEConfig)
	r, err := Inspect(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, x := range r.Tensors {
		names = append(names, x.Name)
	}
	want := []string{
		"model.embed_tokens.weight",
		"model.layers.0.input_layernorm.weight",
		"model.layers.2.input_layernorm.weight",
		"model.layers.2.mlp.experts.gate_up_proj",
		"model.layers.10.input_layernorm.weight",
		"model.layers.11.input_layernorm.weight",
	}
	if !slices.Equal(names, want) {
		t.Errorf("tensor order = %q, want %q", names, want)
	}
	if r.Parameters != 256+4*8+512 || r.Bytes != 512+4*32+512 {
		t.Errorf("Parameters = %d, Bytes = %d", r.Parameters, r.Bytes)
	}
	c := r.Config
	if c == nil || !c.Typed || c.ModelType != "qwen3_moe" || c.Layers != 12 || c.KVHeads != 2 || c.Experts != 8 || c.ExpertWidth != 4 || c.RopeTheta != 1e6 || !c.TieWordEmbeddings {
		t.Errorf("config summary = %+v", c)
	}
	if r.Index != safetensors.IndexName || len(r.Files) < 2 {
		t.Errorf("Index = %q, Files = %+v", r.Index, r.Files)
	}
	var text bytes.Buffer
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "sharded.txt.golden", bytes.ReplaceAll(text.Bytes(), []byte(dir), []byte("CKPT")))
	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Parameters != r.Parameters || len(back.Tensors) != len(r.Tensors) {
		t.Errorf("JSON does not round-trip: %v", err)
	}
	checkGolden(t, "sharded.json.golden", bytes.ReplaceAll(js.Bytes(), []byte(dir), []byte("CKPT")))
}

func TestInspectUntypedConfigAndSingleFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "model.safetensors")
	err := safetensors.Save(p, []safetensors.Tensor{{Name: "wte", DType: safetensors.F16, Shape: []int{4, 2}, Data: make([]byte, 16)}}, map[string]string{"format": "pt"})
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"model_type":"gpt2","n_embd":2,"n_layer":3,"n_head":1,"vocab_size":4,"architectures":["GPT2LMHeadModel"]}`), 0o644)
	r, err := Inspect(p)
	if err != nil {
		t.Fatal(err)
	}
	c := r.Config
	if c == nil || c.Typed || c.ModelType != "gpt2" || c.Hidden != 2 || c.Layers != 3 || c.Vocab != 4 || !strings.Contains(c.Note, "unsupported model_type") {
		t.Errorf("config summary = %+v", c)
	}
	if len(r.Files) != 1 || r.Files[0].Metadata["format"] != "pt" || r.Index != "" {
		t.Errorf("files = %+v", r.Files)
	}
	var text bytes.Buffer
	r.WriteText(&text)
	// The list of supported families grows with every family added; the golden names it FAMILIES.
	out := bytes.ReplaceAll(text.Bytes(), []byte(dir), []byte("CKPT"))
	out = bytes.ReplaceAll(out, []byte(strings.Join(config.Families(), ", ")), []byte("FAMILIES"))
	checkGolden(t, "single.txt.golden", out)
}

func TestInspectErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Inspect(dir); err == nil || !strings.Contains(err.Error(), "no .safetensors files") {
		t.Errorf("empty dir: %v", err)
	}
	ck := writeCheckpoint(t, `{"model_type": `)
	if _, err := Inspect(ck); err == nil || !strings.Contains(err.Error(), "config.json: invalid JSON") {
		t.Errorf("bad config.json: %v", err)
	}
}

func TestNaturalCompare(t *testing.T) {
	in := []string{"a10", "a2", "a02", "b", "a", "a2b", "a2a", "layers.10.x", "layers.9.x", "layers.9"}
	slices.SortFunc(in, naturalCompare)
	want := []string{"a", "a2", "a2a", "a2b", "a02", "a10", "b", "layers.9", "layers.9.x", "layers.10.x"}
	if !slices.Equal(in, want) {
		t.Errorf("natural order = %q, want %q", in, want)
	}
}

func TestHumanUnits(t *testing.T) {
	for _, tt := range []struct {
		got, want string
	}{
		{groupDigits(1234567), "1,234,567"}, {groupDigits(999), "999"}, {groupDigits(-1000), "-1,000"},
		{humanCount(596049920), "596.05M"}, {humanCount(7_000_000_000), "7.00B"}, {humanCount(12), "12"},
		{humanBytes(1023), "1023 B"}, {humanBytes(1536), "1.50 KiB"}, {humanBytes(3 << 30), "3.00 GiB"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}
