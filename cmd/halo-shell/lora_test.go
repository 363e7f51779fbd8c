package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/models"
)

const (
	loraBase    = "../../engine/models/testdata/saved/qwen2"
	loraAdapter = "../../engine/models/testdata/lora/qwen2_all_linear"
)

func loraGolden(t *testing.T) (ids []int32, adapted, merged []float32) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(loraAdapter, "halo.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		IDs     []int32   `json:"input_ids"`
		Adapted []float32 `json:"logprobs"`
		Merged  []float32 `json:"merged_logprobs"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	return g.IDs, g.Adapted, g.Merged
}

func cliLogprobs(t *testing.T, args ...string) []float32 {
	t.Helper()
	out, err := runCLI(t, append([]string{"run", "logprobs"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	var got struct{ Logprobs []float32 }
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output %q: %v", out, err)
	}
	return got.Logprobs
}

func idList(ids []int32) string {
	s := make([]string, len(ids))
	for i, v := range ids {
		s[i] = jsonInt(v)
	}
	return strings.Join(s, " ")
}

func jsonInt(v int32) string { b, _ := json.Marshal(v); return string(b) }

// TestLoRACommands runs logprobs --adapter and merge-lora on the committed adapter golden.
func TestLoRACommands(t *testing.T) {
	ids, adapted, merged := loraGolden(t)
	if got := cliLogprobs(t, "--model", loraBase, "--adapter", loraAdapter, "--ids", idList(ids)); !slices.Equal(got, adapted) {
		t.Fatalf("logprobs --adapter %v, golden %v", got, adapted)
	}
	out := filepath.Join(t.TempDir(), "merged")
	if _, err := runCLI(t, "run", "merge-lora", "--base", loraBase, "--adapter", loraAdapter, "--out", out, "--dtype", ""); err != nil {
		t.Fatal(err)
	}
	got := cliLogprobs(t, "--model", out, "--adapter", "", "--ids", idList(ids))
	if !slices.Equal(got, merged) {
		t.Fatalf("merged checkpoint logprobs %v, golden %v", got, merged)
	}
	if d := maxDiff(got, adapted); d > 1e-5 {
		t.Fatalf("merged checkpoint differs from base+adapter by %g", d)
	}
	if _, err := runCLI(t, "run", "merge-lora", "--base", loraBase, "--adapter", loraBase, "--out", filepath.Join(t.TempDir(), "x")); err == nil || !strings.Contains(err.Error(), "no adapter_config.json") {
		t.Fatalf("merge-lora with a checkpoint as adapter: %v", err)
	}
}

func maxDiff(a, b []float32) float64 {
	d := 0.0
	for i := range a {
		d = max(d, float64(max(a[i]-b[i], b[i]-a[i])))
	}
	return d
}

// TestGenerateWithAdapter generates with an adapter over a fresh checkpoint: a zero-B adapter
// changes nothing, a trained one is applied.
func TestGenerateWithAdapter(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt")
	if _, err := runCLI(t, "run", "init-model", "--arch", "llama", "--preset", "tiny",
		"--tokenizer", "../../engine/models/testdata/tokenizer", "--out", dir, "--seed", "4",
		"--set", "num_hidden_layers=1"); err != nil {
		t.Fatal(err)
	}
	b, _ := backend.Open("cpu")
	m, err := models.Load(dir, b, models.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.AttachLoRA(models.LoRAConfig{R: 2, Alpha: 4, Targets: []string{models.AllLinear}, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	ad := filepath.Join(t.TempDir(), "adapter")
	if err := m.SaveAdapter(ad, dir); err != nil {
		t.Fatal(err)
	}
	gen := func(adapter string) string {
		out, err := runCLI(t, "run", "generate", "--model", dir, "--adapter", adapter, "--prompt", "hello world", "--max-new-tokens", "6")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if a, b := gen(""), gen(ad); a != b {
		t.Fatalf("a zero-initialised adapter changed greedy generation: %q vs %q", a, b)
	}
	if _, err := runCLI(t, "run", "generate", "--model", dir, "--adapter", loraAdapter, "--prompt", "hi", "--max-new-tokens", "2"); err == nil {
		t.Fatal("an adapter of another model's shapes was accepted")
	}
}

// TestLoRADryRunOnALayout checks that a dry run of a use_peft run on a parallel layout says
// what it needs with the base frozen, and that a sharded layout is refused with the rule.
func TestLoRADryRunOnALayout(t *testing.T) {
	out, err := runRoot(t, "launch", "sft", "../../examples/quickstart.yaml", "--dry-run", "--use_peft=true", "--devices=cpu:2", "--gradient_accumulation_steps=2")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "use_peft: with the base frozen") {
		t.Fatalf("dry run lacks the LoRA estimate:\n%s", out)
	}
	_, err = runRoot(t, "launch", "sft", "../../examples/quickstart.yaml", "--dry-run", "--use_peft=true", "--devices=cpu:2", "--fsdp=true", "--gradient_accumulation_steps=2")
	if err == nil || !strings.Contains(err.Error(), "rule adapters") {
		t.Fatalf("fsdp with use_peft: %v", err)
	}
}
