package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLaunchDryRunPrintsTheLayoutOrItsRefusal(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	stdout, err := runRoot(t, quickstartArgs(out, "--devices=cpu:4", "--context_parallel_size=2", "--fsdp=true", "--gradient_accumulation_steps=2", "--dry-run")...)
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
	_, err = runRoot(t, quickstartArgs(out, "--devices=cpu:4", "--tensor_parallel_size=2", "--gradient_accumulation_steps=2", "--dry-run")...)
	if err == nil || !strings.Contains(err.Error(), "rule") || !strings.Contains(err.Error(), "tp=1") {
		t.Fatalf("dry run of tp=2 with one kv head: %v, want the rule and a working layout", err)
	}
}

func TestLaunchOnTwoDevicesWritesATraceWithCollectives(t *testing.T) {
	dir := t.TempDir()
	out, trace := filepath.Join(dir, "run"), filepath.Join(dir, "trace.json")
	if _, err := runRoot(t, quickstartArgs(out, "--devices=cpu:2", "--gradient_accumulation_steps=2", "--trace="+trace)...); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	var tr struct {
		TraceEvents []struct {
			Cat string `json:"cat"`
			Pid int    `json:"pid"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(raw, &tr); err != nil {
		t.Fatal(err)
	}
	cats := map[int]map[string]int{1: {}, 2: {}}
	for _, e := range tr.TraceEvents {
		if cats[e.Pid] == nil {
			t.Fatalf("trace event of process %d on two devices", e.Pid)
		}
		cats[e.Pid][e.Cat]++
	}
	// dp=2: each device all-reduces its gradients beside its compute spans.
	for pid, c := range cats {
		if c["step"] != 3 || c["all_reduce"] == 0 || c["matmul"] == 0 {
			t.Fatalf("trace events of device %d by category %v: want 3 steps, all_reduce and matmul spans", pid-1, c)
		}
	}
	// The checkpoint is an ordinary gathered one.
	if _, err := os.Stat(filepath.Join(out, "checkpoint-3", "model.safetensors")); err != nil {
		t.Fatal(err)
	}
}
