package train

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// metricsSteps returns the step of every row of output_dir/metrics.jsonl, in file order.
func metricsSteps(t *testing.T, out string) []int {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(out, MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	var steps []int
	for _, line := range strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n") {
		var m StepMetrics
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%s: %q: %v", MetricsFile, line, err)
		}
		steps = append(steps, m.Step)
	}
	return steps
}

func TestResumeKeepsOneMetricsRowPerStep(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(40))
	cfg := tinyConfig(t, path, "--max_steps=6", "--save_steps=2")
	out := cfg.Run.OutputDir
	if _, err := Run(context.Background(), newTrainer(t, cfg), RunOptions{}); err != nil {
		t.Fatal(err)
	}
	// The run went on past checkpoint-2 (to step 6), and a kill tore the row it was writing.
	f, err := os.OpenFile(filepath.Join(out, MetricsFile), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"step":7,"loss":1.2`)
	f.Close()
	resumed := tinyConfig(t, path, "--max_steps=6", "--save_steps=2", "--resume_from_checkpoint="+filepath.Join(out, "checkpoint-2"))
	resumed.Run.OutputDir = out
	if _, err := Run(context.Background(), newTrainer(t, resumed), RunOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := metricsSteps(t, out); !slices.Equal(got, []int{1, 2, 3, 4, 5, 6}) {
		t.Fatalf("metrics steps after resuming from step 2: %v, want each of 1..6 once", got)
	}
	if stale, _ := filepath.Glob(filepath.Join(out, "."+MetricsFile+"*")); len(stale) > 0 {
		t.Errorf("left %v", stale)
	}
}

func TestRotationKilledPartWayLeavesNoCheckpointUnderItsName(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(40))
	cfg := tinyConfig(t, path, "--max_steps=4", "--save_steps=2", "--save_total_limit=1")
	out := cfg.Run.OutputDir
	// Deleting checkpoint-2 stops after its first file, as a kill would.
	killed := errors.New("killed")
	removeTree = func(dir string) error {
		ents, err := os.ReadDir(dir)
		if err == nil && len(ents) > 0 {
			os.Remove(filepath.Join(dir, ents[0].Name()))
		}
		return killed
	}
	_, err := Run(context.Background(), newTrainer(t, cfg), RunOptions{})
	removeTree = os.RemoveAll
	if !errors.Is(err, killed) {
		t.Fatalf("Run = %v, want the injected failure", err)
	}
	ds, err := stepDirs(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 1 || filepath.Base(ds[0]) != "checkpoint-4" {
		t.Fatalf("checkpoints after the killed rotation: %v, want checkpoint-4 only", ds)
	}
	if _, err := os.Stat(filepath.Join(out, "checkpoint-4", StateFile)); err != nil {
		t.Fatalf("checkpoint-4 is incomplete: %v", err)
	}
	hidden, _ := filepath.Glob(filepath.Join(out, ".checkpoint-2.tmp-*"))
	if len(hidden) != 1 {
		t.Fatalf("the half-deleted checkpoint should be hidden as .checkpoint-2.tmp-*: %v", hidden)
	}
	// The next run removes what the killed one left.
	again := tinyConfig(t, path, "--max_steps=4", "--save_steps=2", "--save_total_limit=1", "--resume_from_checkpoint="+ds[0])
	again.Run.OutputDir = out
	if _, err := Run(context.Background(), newTrainer(t, again), RunOptions{}); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(out, ".checkpoint-*")); len(left) > 0 {
		t.Fatalf("stale directories survived the next run: %v", left)
	}
}

func TestCleanStale(t *testing.T) {
	out := t.TempDir()
	mk := func(dir string, files ...string) {
		os.MkdirAll(filepath.Join(out, dir), 0o755)
		for _, f := range files {
			os.WriteFile(filepath.Join(out, dir, f), []byte("x"), 0o644)
		}
	}
	mk("checkpoint-2", StateFile)
	mk(".checkpoint-2.tmp-111", "model.safetensors")          // a save killed before its rename
	mk(".checkpoint-4.tmp-222.old", StateFile, "config.json") // moved aside, then killed
	mk(".checkpoint-4.tmp-222", "config.json")                // the new one, never renamed
	mk(".checkpoint-6.tmp-rm-333", "config.json")             // a rotation killed while deleting
	mk(".checkpoint-2.tmp-444.old", StateFile)                // moved aside, but checkpoint-2 exists
	mk(".other.tmp-555", "x")                                 // not a checkpoint of this run
	os.WriteFile(filepath.Join(out, "."+MetricsFile+".tmp-666"), []byte("{}"), 0o644)
	if err := cleanStale(out, ""); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(out)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{".other.tmp-555", "checkpoint-2", "checkpoint-4"}; !slices.Equal(names, want) {
		t.Fatalf("after cleanStale: %v, want %v", names, want)
	}
	if _, err := os.Stat(filepath.Join(out, "checkpoint-4", "config.json")); err != nil {
		t.Fatalf("checkpoint-4 was not moved back whole: %v", err)
	}
}
