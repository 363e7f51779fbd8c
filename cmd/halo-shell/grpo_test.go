package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sftCheckpoint trains the shrunken quickstart for a few steps and returns its output
// directory: a Hugging Face checkpoint with its tokenizer, for the examples that start from
// another run's output.
func sftCheckpoint(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "sft")
	if _, _, err := runRootErr(t, "", quickstartArgs(out, "--generation_eval.max_samples=0")...); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestLaunchGRPORewardRises runs `launch grpo` on the bundled example as it is (on the CPU,
// with a short held-out eval): metrics.jsonl has one line per step with the GRPO metrics, and
// the format reward of the last steps is clearly above that of the first, as the example says.
func TestLaunchGRPORewardRises(t *testing.T) {
	out := filepath.Join(t.TempDir(), "grpo")
	_, stderr, err := runRootErr(t, "", "launch", "grpo", "../../examples/grpo-arithmetic.yaml",
		"--device=cpu", "--generation_eval.max_samples=5", "--output_dir="+out)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, " reward 0.500") { // the format reward at weight 0.5
		t.Errorf("the progress lines do not show the reward:\n%s", stderr)
	}
	raw, err := os.ReadFile(filepath.Join(out, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var rewards []float64
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var m map[string]float64
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		for _, k := range []string{"reward", "reward_std", "completions/mean_length", "clip_ratio/region_mean", "time/generation_s"} {
			if _, ok := m[k]; !ok {
				t.Fatalf("metrics line lacks %s: %s", k, line)
			}
		}
		rewards = append(rewards, m["rewards/format/mean"])
	}
	if len(rewards) != 60 {
		t.Fatalf("%d metrics lines, want 60", len(rewards))
	}
	mean := func(xs []float64) float64 {
		s := 0.0
		for _, x := range xs {
			s += x
		}
		return s / float64(len(xs))
	}
	first, last := mean(rewards[:5]), mean(rewards[55:])
	t.Logf("reward over the first 5 steps %.3f, the last 5 %.3f", first, last)
	if last < first+0.5 {
		t.Errorf("the reward rose from %.3f to %.3f only: %v", first, last, rewards)
	}
	if _, err := os.Stat(filepath.Join(out, "generation_eval.json")); err != nil {
		t.Errorf("no held-out generation eval: %v", err)
	}
}
