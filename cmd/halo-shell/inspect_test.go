package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
)

func TestRunInspectCommand(t *testing.T) {
	dir := t.TempDir()
	tensors := []safetensors.Tensor{
		{Name: "model.norm.weight", DType: safetensors.F32, Shape: []int{4}, Data: make([]byte, 16)},
		{Name: "lm_head.weight", DType: safetensors.BF16, Shape: []int{8, 4}, Data: make([]byte, 64)},
	}
	if _, err := safetensors.SaveCheckpoint(dir, tensors, safetensors.CheckpointOptions{MaxShardSize: 64}); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) { return runRoot(t, args...) }

	text, err := run("run", "inspect", dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"(2 files, index model.safetensors.index.json)", "lm_head.weight", "[8, 4]", "parameters  36 (36)"} {
		if !strings.Contains(text, want) {
			t.Errorf("text output lacks %q:\n%s", want, text)
		}
	}

	js, err := run("run", "inspect", "--json", filepath.Join(dir, safetensors.IndexName))
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Parameters int64 `json:"parameters"`
		Tensors    []struct {
			Name  string `json:"name"`
			DType string `json:"dtype"`
		} `json:"tensors"`
	}
	if err := json.Unmarshal([]byte(js), &r); err != nil {
		t.Fatalf("--json output is not JSON: %v\n%s", err, js)
	}
	if r.Parameters != 36 || len(r.Tensors) != 2 || r.Tensors[0].Name != "lm_head.weight" || r.Tensors[0].DType != "BF16" {
		t.Errorf("--json report = %+v", r)
	}

	if _, err := run("run", "inspect", filepath.Join(dir, "missing")); err == nil {
		t.Error("inspecting a missing path succeeded")
	}
}
