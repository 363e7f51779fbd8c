package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/train"
)

const quickTok = "../../examples/quickstart/tokenizer"

// TestScoreCommand trains a small reward model, scores chat pairs with `run score` and checks
// the scores against the model's own on the same tokens; a causal LM is refused.
func TestScoreCommand(t *testing.T) {
	out := filepath.Join(t.TempDir(), "rm")
	y := fmt.Sprintf(`init:
  arch: qwen3
  preset: tiny
  overrides: {hidden_size: 32, intermediate_size: 64, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, num_hidden_layers: 1}
tokenizer_name_or_path: %s
dataset: {synthetic: {kind: arithmetic, max_operand: 9, train: 16, eval: 4}}
max_length: 32
max_steps: 2
device: cpu
save_steps: 0
output_dir: %s
`, quickTok, out)
	cfg, err := train.ParseConfig([]byte(y), "rm.yaml", train.MethodReward, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := train.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if _, err := train.Run(context.Background(), tr, train.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := runCLI(t, "run", "score", "--model", out, "--tokenizer", quickTok, "--chat",
		"--prompt", "What is 2+2?", "--response", "4", "--prompt", "What is 2+2?", "--response", "5")
	if err != nil {
		t.Fatalf("%v: %s", err, got)
	}
	var res struct{ Scores [][]float64 }
	if err := json.Unmarshal([]byte(got), &res); err != nil || len(res.Scores) != 2 || len(res.Scores[0]) != 1 {
		t.Fatalf("output %q: %v", got, err)
	}
	b := cpu.New(cpu.Options{})
	defer b.Close()
	m, err := models.Load(out, b, models.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for i, ans := range []string{"4", "5"} {
		ids, err := train.EncodeCompletion(quickTok,
			data.Turns{Chat: true, Messages: []data.Message{{Role: "user", Content: "What is 2+2?"}}},
			data.Turns{Chat: true, Messages: []data.Message{{Role: "assistant", Content: ans}}})
		if err != nil {
			t.Fatal(err)
		}
		want, err := m.Scores(models.Batch{Tokens: ids})
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(res.Scores[i][0]-float64(want[0])) > 1e-6 {
			t.Errorf("input %d: run score gave %v, the model %v", i+1, res.Scores[i][0], want[0])
		}
	}
	if _, err := runCLI(t, "run", "score", "--model", out, "--prompt", "a"); err == nil || !strings.Contains(err.Error(), "pairs") {
		t.Errorf("an unpaired --prompt: err = %v", err)
	}
	lm := filepath.Join(t.TempDir(), "lm")
	if _, err := runCLI(t, "run", "init-model", "--arch", "llama", "--preset", "tiny", "--tokenizer", "../../engine/models/testdata/tokenizer", "--out", lm, "--set", "num_hidden_layers=1"); err != nil {
		t.Fatal(err)
	}
	if _, err := runCLI(t, "run", "score", "--model", lm, "--text", "hello"); err == nil || !strings.Contains(err.Error(), "causal LM") {
		t.Errorf("scoring with a causal LM: err = %v", err)
	}
}

// TestPreferenceExampleDryRuns dry-runs the DPO and SMPO example over a small checkpoint in
// place of the quickstart's output.
func TestPreferenceExampleDryRuns(t *testing.T) {
	ck := filepath.Join(t.TempDir(), "ck")
	if _, err := runCLI(t, "run", "init-model", "--arch", "qwen3", "--preset", "tiny", "--tokenizer", quickTok, "--out", ck, "--set", "num_hidden_layers=1"); err != nil {
		t.Fatal(err)
	}
	for _, method := range []string{"dpo", "smpo"} {
		out, err := runRoot(t, "launch", method, "../../examples/preference/dpo.yaml", "--dry-run", "--model_name_or_path="+ck)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		if !strings.Contains(out, "total") {
			t.Fatalf("%s: no memory estimate in the dry run:\n%s", method, out)
		}
	}
}
