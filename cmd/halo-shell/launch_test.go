package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/train"
)

// runRoot runs the halo-shell command line with args and returns what it wrote to stdout.
func runRoot(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	rootCmd.SetOut(&out)
	rootCmd.SetArgs(args)
	defer func() { rootCmd.SetArgs(nil); rootCmd.SetOut(nil) }()
	err := rootCmd.Execute()
	return out.String(), err
}

// quickstartArgs shrinks the quickstart to a few steps of a tiny model.
func quickstartArgs(out string, extra ...string) []string {
	return append([]string{"launch", "sft", "../../examples/quickstart.yaml",
		"--tokenizer_name_or_path=../../examples/quickstart/tokenizer",
		"--init.overrides={hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, tie_word_embeddings: true}",
		"--dataset.synthetic.train=200", "--dataset.synthetic.eval=10",
		"--max_steps=3", "--warmup_steps=1", "--eval_steps=0", "--device=cpu",
		"--generation_eval.max_samples=3", "--output_dir=" + out}, extra...)
}

func TestLaunchQuickstartEndToEnd(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	trace := filepath.Join(t.TempDir(), "steps.json")
	_, stderr, err := runRootErr(t, "", append(quickstartArgs(out), "--trace", trace)...)
	if err != nil {
		t.Fatal(err)
	}
	// --trace says where the trace goes and, at the end, that it was written there.
	if !strings.Contains(stderr, "it is written to "+trace+" at the end") || !strings.Contains(stderr, "launch: wrote the trace (") ||
		!strings.Contains(stderr, ") to "+trace+"; open it in") {
		t.Errorf("stderr does not say where the trace went:\n%s", stderr)
	}
	if raw, err := os.ReadFile(trace); err != nil || !strings.Contains(string(raw), "traceEvents") {
		t.Errorf("trace %s: %v (%d bytes)", trace, err, len(raw))
	}
	raw, err := os.ReadFile(filepath.Join(out, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if len(lines) != 3 {
		t.Fatalf("metrics.jsonl has %d lines, want 3", len(lines))
	}
	var last struct {
		Step     int      `json:"step"`
		Loss     float64  `json:"loss"`
		EvalLoss *float64 `json:"eval_loss"`
	}
	if err := json.Unmarshal([]byte(lines[2]), &last); err != nil || last.Step != 3 || last.EvalLoss == nil {
		t.Fatalf("last metrics line %s (%v)", lines[2], err)
	}
	for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_eval.json", "checkpoint-3/trainer_state.json"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("missing %s", f)
		}
	}
}

func TestLaunchDryRunAndRefusals(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	stdout, err := runRoot(t, append(quickstartArgs(out), "--dry-run")...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# resolved config", "learning_rate:", "max_steps: 3", "memory estimate per device", "optimizer state", "activations", "total"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, stdout)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("dry run created output_dir")
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"launch", "dop", "x.yaml"}, `unknown method "dop"`},
		{[]string{"launch", "sft"}, "want a method and a config file"},
		{append(quickstartArgs(out), "--learning_rat=1"), `did you mean "learning_rate"?`},
		{append(quickstartArgs(out), "--max_steps=-3"), "max_steps: -3 must be positive"},
	} {
		if _, err := runRoot(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestExamplesWorkAsTheyAre dry-runs every YAML config under examples/ unchanged (from
// another directory, so their relative paths must hold), and trains the expert-parallel
// example for a few steps: the bundled configs are valid and their layouts accepted.
func TestExamplesWorkAsTheyAre(t *testing.T) {
	files, err := filepath.Glob("../../examples/*.yaml")
	if err != nil || len(files) < 2 {
		t.Fatalf("examples: %v %v", files, err)
	}
	var ckpt string // a checkpoint for the examples that start from another run's output
	parent := t
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			// An example named METHOD-*.yaml is for that method; the others are for sft.
			args := []string{"launch", "sft", f, "--dry-run"}
			if m, _, _ := strings.Cut(filepath.Base(f), "-"); m == train.MethodGRPO {
				args[1] = m
			}
			if raw, _ := os.ReadFile(f); strings.Contains(string(raw), "\nmodel_name_or_path: out/") {
				if ckpt == "" {
					ckpt = sftCheckpoint(parent) // lives until the whole test ends
				}
				args = append(args, "--model_name_or_path="+ckpt)
			}
			stdout, err := runRoot(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(stdout, "total") {
				t.Fatalf("no memory estimate in the dry run:\n%s", stdout)
			}
		})
	}
	out := filepath.Join(t.TempDir(), "moe")
	if _, err := runRoot(t, "launch", "sft", "../../examples/moe-expert-parallel.yaml", "--max_steps=4",
		"--warmup_steps=1", "--dataset.synthetic.train=200", "--generation_eval.max_samples=2", "--output_dir="+out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, "model.safetensors")); err != nil {
		t.Fatalf("the expert-parallel run wrote no gathered checkpoint: %v", err)
	}
}
