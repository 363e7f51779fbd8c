package train

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/data"
)

func TestRunWritesMetricsCheckpointsAndModel(t *testing.T) {
	dir := t.TempDir()
	path := writeJSONL(t, dir, "d.jsonl", pcRecords(60))
	cfg := tinyConfig(t, path, "--max_steps=4", "--save_steps=2", "--save_total_limit=1", "--dataset.eval_split=0.2", "--eval_steps=2", "--logging_steps=1")
	tr := newTrainer(t, cfg)
	var progress, log bytes.Buffer
	var seen []int
	res, err := Run(context.Background(), tr, RunOptions{Progress: &progress, Log: &log, OnStep: func(m StepMetrics) { seen = append(seen, m.Step) }})
	if err != nil {
		t.Fatal(err)
	}
	if res.Steps != 4 || !reflect.DeepEqual(seen, []int{1, 2, 3, 4}) {
		t.Fatalf("steps %d, callbacks %v", res.Steps, seen)
	}
	out := cfg.Run.OutputDir
	f, err := os.Open(filepath.Join(out, MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		n++
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %d is not JSON: %v", n, err)
		}
		for _, k := range []string{"step", "loss", "grad_norm", "lr", "tokens", "tokens_per_s"} {
			v, ok := m[k].(float64)
			if !ok {
				t.Fatalf("line %d: %q missing or not a number: %s", n, k, sc.Text())
			}
			if k == "step" && int(v) != n {
				t.Fatalf("line %d has step %v", n, v)
			}
		}
		_, hasEval := m["eval_loss"]
		if hasEval != (n%2 == 0) {
			t.Fatalf("line %d: eval_loss present=%v, want it every 2 steps", n, hasEval)
		}
	}
	if n != 4 {
		t.Fatalf("%d metrics lines, want 4", n)
	}
	ents, _ := os.ReadDir(out)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	for _, want := range []string{"checkpoint-4", "config.json", "model.safetensors", "tokenizer.json", MetricsFile} {
		if !contains(names, want) {
			t.Errorf("output_dir lacks %s (has %v)", want, names)
		}
	}
	if contains(names, "checkpoint-2") {
		t.Errorf("save_total_limit=1 kept checkpoint-2: %v", names)
	}
	lines := strings.Split(strings.TrimSpace(progress.String()), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[3], "step 4/4 ") || !strings.Contains(lines[3], "tok/s") {
		t.Fatalf("progress lines:\n%s", progress.String())
	}
	if !strings.Contains(log.String(), "saved "+filepath.Join(out, "checkpoint-2")) {
		t.Fatalf("log does not report the step checkpoint:\n%s", log.String())
	}

	// A launch resumed from the last checkpoint with a longer max_steps appends to the metrics.
	cfg2 := tinyConfig(t, path, "--max_steps=5", "--dataset.eval_split=0.2", "--resume_from_checkpoint="+filepath.Join(out, "checkpoint-4"))
	cfg2.Run.OutputDir = out
	tr2 := newTrainer(t, cfg2)
	if tr2.Steps() != 4 {
		t.Fatalf("resumed trainer at step %d", tr2.Steps())
	}
	if _, err := Run(context.Background(), tr2, RunOptions{}); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(filepath.Join(out, MetricsFile))
	if c := strings.Count(string(raw), "\n"); c != 5 {
		t.Fatalf("metrics has %d lines after resuming to step 5, want 5", c)
	}
}

func TestRunStopsAtStepBoundaryWhenCancelled(t *testing.T) {
	dir := t.TempDir()
	path := writeJSONL(t, dir, "d.jsonl", pcRecords(30))
	cfg := tinyConfig(t, path, "--max_steps=50")
	tr := newTrainer(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	_, err := Run(ctx, tr, RunOptions{OnStep: func(m StepMetrics) {
		if m.Step == 2 {
			cancel()
		}
	}})
	if err != context.Canceled {
		t.Fatalf("Run returned %v, want context.Canceled", err)
	}
	if tr.Steps() != 2 {
		t.Fatalf("stopped after %d steps, want 2", tr.Steps())
	}
	if _, err := os.Stat(filepath.Join(cfg.Run.OutputDir, "checkpoint-2", StateFile)); err != nil {
		t.Fatalf("no checkpoint saved on interrupt: %v", err)
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestEvalGenerationExactMatchAndChance(t *testing.T) {
	dir := t.TempDir()
	// Training data: one prompt whose completion the model memorises, and a second answer
	// that is rarer, so the most frequent training answer is "2".
	var train []data.Record
	for range 12 {
		train = append(train, data.Record{Kind: data.FormatPromptCompletion, Prompt: "1+1=", Completion: "2"})
	}
	train = append(train, data.Record{Kind: data.FormatPromptCompletion, Prompt: "2+2=", Completion: "4"})
	trainPath := writeJSONL(t, dir, "train.jsonl", train)
	eval := []data.Record{
		{Kind: data.FormatPromptCompletion, Prompt: "1+1=", Completion: "2"},
		{Kind: data.FormatPromptCompletion, Prompt: "1+1=", Completion: "2"},
		{Kind: data.FormatPromptCompletion, Prompt: "3+3=", Completion: "6"},
		{Kind: data.FormatPromptCompletion, Prompt: "4+4=", Completion: "8"},
	}
	evalPath := writeJSONL(t, dir, "eval.jsonl", eval)
	cfg := tinyConfig(t, trainPath, "--dataset.eval_path="+evalPath, "--max_steps=60", "--lr_scheduler_type=constant", "--learning_rate=1e-2")
	tr := newTrainer(t, cfg)
	steps(t, tr, 60)
	res, err := tr.EvalGeneration(context.Background(), 3, 4)
	if err != nil {
		t.Fatal(err)
	}
	if res.Samples != 3 {
		t.Fatalf("%d samples, want max_samples 3", res.Samples)
	}
	// The first two are the memorised prompt; "3+3=" was never seen.
	if res.Correct < 2 || res.Examples[0][2] != "2" {
		t.Fatalf("result %+v: the memorised answer was not reproduced", res)
	}
	if res.Chance != 2.0/3 {
		t.Fatalf("chance %v, want 2/3 (two of three references equal the most frequent training answer)", res.Chance)
	}
	if res.Accuracy != float64(res.Correct)/3 {
		t.Fatalf("accuracy %v for %d correct", res.Accuracy, res.Correct)
	}
}

func TestCompleteAfterTraining(t *testing.T) {
	dir := t.TempDir()
	var train []data.Record
	for range 8 {
		train = append(train, data.Record{Kind: data.FormatMessages, Messages: []data.Message{{Role: "user", Content: "hi"}, {Role: "assistant", Content: "42"}}})
	}
	path := writeJSONL(t, dir, "chat.jsonl", train)
	tr := newTrainer(t, tinyConfig(t, path, "--max_steps=60", "--lr_scheduler_type=constant", "--learning_rate=1e-2"))
	steps(t, tr, 60)
	got, err := tr.Complete("hi", true, 4)
	if err != nil {
		t.Fatal(err)
	}
	if got != "42" {
		t.Fatalf("chat completion %q, want the memorised reply 42", got)
	}
	if _, err := tr.Complete("", false, 4); err == nil {
		t.Fatal("an empty raw prompt was accepted")
	}
	if _, err := tr.Complete("hi", true, 0); err == nil {
		t.Fatal("max new tokens 0 accepted")
	}
}
