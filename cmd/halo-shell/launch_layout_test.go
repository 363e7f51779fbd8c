package main

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestLaunchDryRunPrintsTheLayoutOrItsRefusal(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	stdout, err := runLaunch(t, quickstartArgs(out, "--devices=cpu:4", "--context_parallel_size=2", "--fsdp=true", "--gradient_accumulation_steps=2", "--dry-run")...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# parallel layout", "devices: cpu:4", "layout:  dp=2 fsdp tp=1 cp=2", "groups cp:", "groups data:",
		"parameters", "gradients", "optimizer", "activations", "comm buffers", "total"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, stdout)
		}
	}
	// One key/value head cannot be split over two tensor ranks: refused with the rule and a
	// layout that works.
	_, err = runLaunch(t, quickstartArgs(out, "--devices=cpu:4", "--tensor_parallel_size=2", "--gradient_accumulation_steps=2", "--dry-run")...)
	if err == nil || !strings.Contains(err.Error(), "rule") || !strings.Contains(err.Error(), "tp=1") {
		t.Fatalf("dry run of tp=2 with one kv head: %v, want the rule and a working layout", err)
	}
}
