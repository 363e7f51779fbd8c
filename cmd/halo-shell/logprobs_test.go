package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/models"
)

func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	rootCmd.SetOut(&out)
	rootCmd.SetErr(&out)
	rootCmd.SetArgs(args)
	err := rootCmd.Execute()
	return out.String(), err
}

// TestModelCommands runs init-model, logprobs and generate end to end on a fresh checkpoint.
func TestModelCommands(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt")
	if _, err := runCLI(t, "run", "init-model", "--arch", "llama", "--preset", "tiny",
		"--tokenizer", "../../engine/models/testdata/tokenizer", "--out", dir, "--seed", "4",
		"--set", "num_hidden_layers=1"); err != nil {
		t.Fatal(err)
	}
	out, err := runCLI(t, "run", "logprobs", "--model", dir, "--ids", "5, 17 123 9")
	if err != nil {
		t.Fatal(err)
	}
	var got struct{ Logprobs []float64 }
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output %q: %v", out, err)
	}
	b, _ := backend.Open("cpu")
	m, err := models.Load(dir, b, models.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	want, _ := m.Logprobs([]int32{5, 17, 123, 9})
	if len(got.Logprobs) != 3 {
		t.Fatalf("%d logprobs for 4 ids", len(got.Logprobs))
	}
	for i := range want {
		if float32(got.Logprobs[i]) != want[i] {
			t.Errorf("logprob %d printed %v, model gives %v", i, got.Logprobs[i], want[i])
		}
	}
	if _, err := runCLI(t, "run", "logprobs", "--model", dir, "--ids", "5 x"); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Errorf("bad --ids error %v", err)
	}
	if _, err := runCLI(t, "run", "logprobs", "--model", dir, "--ids", "5 99999"); err == nil || !strings.Contains(err.Error(), "99999") {
		t.Errorf("out-of-vocabulary id error %v", err)
	}
	if _, err := runCLI(t, "run", "generate", "--model", dir, "--prompt", "hello world", "--max-new-tokens", "4"); err != nil {
		t.Errorf("generate: %v", err)
	}
}
