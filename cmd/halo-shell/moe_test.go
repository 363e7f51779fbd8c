package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLogprobsMoEMatchesTransformers runs `run logprobs` on the mixture-of-experts parity
// fixtures and compares each row with the logprobs transformers computed (1e-4 absolute).
func TestLogprobsMoEMatchesTransformers(t *testing.T) {
	for _, name := range []string{"qwen3_moe", "qwen3_moe_sparse", "mixtral", "olmoe"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("..", "..", "engine", "models", "testdata", "parity", name)
			raw, err := os.ReadFile(filepath.Join(dir, "reference.json"))
			if err != nil {
				t.Fatal(err)
			}
			var ref struct {
				InputIDs [][]int32   `json:"input_ids"`
				Logprobs [][]float64 `json:"logprobs"`
			}
			if err := json.Unmarshal(raw, &ref); err != nil {
				t.Fatal(err)
			}
			for r, ids := range ref.InputIDs {
				words := make([]string, len(ids))
				for i, id := range ids {
					words[i] = fmt.Sprint(id)
				}
				out, err := runCLI(t, "run", "logprobs", "--model", dir, "--ids", strings.Join(words, " "))
				if err != nil {
					t.Fatal(err)
				}
				var got struct{ Logprobs []float64 }
				if err := json.Unmarshal([]byte(out), &got); err != nil {
					t.Fatalf("output %q: %v", out, err)
				}
				if len(got.Logprobs) != len(ref.Logprobs[r]) {
					t.Fatalf("row %d: %d logprobs, transformers %d", r, len(got.Logprobs), len(ref.Logprobs[r]))
				}
				for i, w := range ref.Logprobs[r] {
					if d := math.Abs(got.Logprobs[i] - w); d > 1e-4 {
						t.Errorf("row %d position %d: logprob %v, transformers %v", r, i, got.Logprobs[i], w)
					}
				}
			}
		})
	}
}

// TestInitModelMoE creates tiny random mixture-of-experts checkpoints with init-model and
// scores them with logprobs.
func TestInitModelMoE(t *testing.T) {
	for _, arch := range []string{"qwen3_moe", "mixtral", "olmoe"} {
		t.Run(arch, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ckpt")
			if _, err := runCLI(t, "run", "init-model", "--arch", arch, "--preset", "tiny",
				"--tokenizer", "../../engine/models/testdata/tokenizer", "--out", dir, "--seed", "4"); err != nil {
				t.Fatal(err)
			}
			out, err := runCLI(t, "run", "logprobs", "--model", dir, "--ids", "5 17 123 9")
			if err != nil {
				t.Fatal(err)
			}
			var got struct{ Logprobs []float64 }
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("output %q: %v", out, err)
			}
			if len(got.Logprobs) != 3 {
				t.Fatalf("%d logprobs for 4 ids", len(got.Logprobs))
			}
			for i, v := range got.Logprobs {
				if !(v < 0) || math.IsInf(v, 0) {
					t.Errorf("logprob %d = %v, want a finite negative number", i, v)
				}
			}
		})
	}
}
