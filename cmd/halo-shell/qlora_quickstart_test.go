package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestQLoRAQuickstartRuns runs examples/qlora-quickstart.yaml as it is (only output_dir and
// the CPU device given): the base's linears are stored in NF4, only the adapters train, the run
// writes the adapters in PEFT's format and no full checkpoint, and greedy answers to held-out
// problems beat the chance level the run reports by at least three times. It takes about a
// minute on two cores, so -short skips it.
func TestQLoRAQuickstartRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("trains the QLoRA quickstart for a minute")
	}
	out := filepath.Join(t.TempDir(), "run")
	_, stderr, err := runRootErr(t, "", "launch", "sft", "../../examples/qlora-quickstart.yaml", "--device=cpu", "--output_dir="+out)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	for _, f := range []string{"adapter_config.json", "adapter_model.safetensors", "generation_eval.json"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("the run wrote no %s", f)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "model.safetensors")); err == nil {
		t.Error("a QLoRA run wrote the full model; only the adapters train")
	}
	var cfg struct {
		R       int      `json:"r"`
		Targets []string `json:"target_modules"`
	}
	raw, err := os.ReadFile(filepath.Join(out, "adapter_config.json"))
	if err != nil || json.Unmarshal(raw, &cfg) != nil || cfg.R != 32 || len(cfg.Targets) != 7 {
		t.Errorf("adapter_config.json: r %d, targets %v (%v); want r 32 on the 7 linear layers", cfg.R, cfg.Targets, err)
	}
	var ev struct {
		Samples  int     `json:"samples"`
		Accuracy float64 `json:"accuracy"`
		Chance   float64 `json:"chance"`
	}
	raw, err = os.ReadFile(filepath.Join(out, "generation_eval.json"))
	if err != nil || json.Unmarshal(raw, &ev) != nil {
		t.Fatalf("generation_eval.json: %v", err)
	}
	if ev.Samples != 100 || !(ev.Accuracy >= 3*ev.Chance) || ev.Accuracy == 0 {
		t.Errorf("held-out exact match %.3f over %d problems, chance %.3f: want at least 3x chance", ev.Accuracy, ev.Samples, ev.Chance)
	}
}
