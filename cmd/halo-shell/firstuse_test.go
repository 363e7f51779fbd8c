package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/halo-shell/halo-shell/engine/backend/cuda"
)

// runRootErr runs the halo-shell command line with args and stdin and returns what it wrote
// to stdout and stderr.
func runRootErr(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errb bytes.Buffer
	rootCmd.SetOut(&out)
	rootCmd.SetErr(&errb)
	rootCmd.SetIn(strings.NewReader(stdin))
	rootCmd.SetArgs(args)
	resetFlags(rootCmd)
	defer func() {
		rootCmd.SetArgs(nil)
		rootCmd.SetOut(nil)
		rootCmd.SetErr(nil)
		rootCmd.SetIn(nil)
		resetFlags(rootCmd)
	}()
	err = rootCmd.Execute()
	return out.String(), errb.String(), err
}

// resetFlags sets every flag of c and its subcommands back to its default, so that a command
// run in this process sees only the flags its own command line gives.
func resetFlags(c *cobra.Command) {
	reset := func(f *pflag.Flag) {
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			var def []string
			if d := strings.Trim(f.DefValue, "[]"); d != "" {
				def = strings.Split(d, ",")
			}
			sv.Replace(def)
		} else {
			f.Value.Set(f.DefValue)
		}
		f.Changed = false
	}
	c.Flags().VisitAll(reset)
	c.PersistentFlags().VisitAll(reset)
	for _, sub := range c.Commands() {
		resetFlags(sub)
	}
}

// The mistakes a first-time user makes get an answer that says what to do, or just work.
func TestLaunchAcceptsWhatUsersWrite(t *testing.T) {
	dir := t.TempDir()
	if _, err := runRoot(t, "run", "make-arith-data", "--out", dir, "--train", "40", "--eval", "4"); err != nil {
		t.Fatal(err)
	}
	tok, err := filepath.Abs("../../examples/quickstart/tokenizer")
	if err != nil {
		t.Fatal(err)
	}
	train := filepath.Join(dir, "train.jsonl")
	cfg := func(dataset string) string {
		p := filepath.Join(t.TempDir(), "run.yaml")
		y := "init: {arch: qwen3, preset: tiny}\ntokenizer_name_or_path: " + tok + "\n" + dataset +
			"max_length: 32\nmax_steps: 2\ndevice: cpu\noutput_dir: " + filepath.Join(dir, "out") + "\n"
		if err := os.WriteFile(p, []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name string
		args []string
		want []string // in the dry run's output
		err  string
	}{
		// TRL and Halo write the dataset as a path.
		{"dataset path shorthand", []string{"launch", "sft", cfg("dataset: " + train + "\n"), "--dry-run"},
			[]string{"path:\n    - " + train, "format: auto"}, ""},
		{"dataset list shorthand", []string{"launch", "sft", cfg("dataset: [" + train + ", " + train + "]\n"), "--dry-run"},
			[]string{"path:\n    - " + train + "\n    - " + train}, ""},
		{"dataset mapping", []string{"launch", "sft", cfg("dataset: {path: " + train + ", eval_split: 0.25}\n"), "--dry-run"},
			[]string{"eval_split: 0.25"}, ""},
		{"dataset mapping typo", []string{"launch", "sft", cfg("dataset: {path: " + train + ", evalsplit: 0.25}\n"), "--dry-run"},
			nil, `unknown key "evalsplit" (did you mean "eval_split"?)`},
		{"dataset number", []string{"launch", "sft", cfg("dataset: 3\n"), "--dry-run"},
			nil, "dataset: want a JSONL path (dataset: train.jsonl)"},
		{"dataset override shorthand", []string{"launch", "sft", cfg("dataset: {synthetic: {kind: arithmetic}}\n"), "--dataset=" + train, "--dry-run"},
			[]string{"path:\n    - " + train}, ""},
		// --key value as well as --key=value.
		{"space-separated override", []string{"launch", "sft", cfg("dataset: " + train + "\n"), "--max_steps", "7", "--learning_rate", "-1e-3", "--dry-run"},
			nil, "learning_rate"},
		{"space-separated overrides", []string{"launch", "sft", cfg("dataset: " + train + "\n"), "--max_steps", "7", "--dry-run", "--seed", "5"},
			[]string{"max_steps: 7", "seed: 5"}, ""},
		{"override without a value", []string{"launch", "sft", cfg("dataset: " + train + "\n"), "--dry-run", "--max_steps"},
			nil, "--max_steps has no value: write --max_steps=VALUE or --max_steps VALUE"},
		{"stray argument", []string{"launch", "sft", cfg("dataset: " + train + "\n"), "extra"},
			nil, "(got 3 arguments: sft "},
		{"one dash", []string{"launch", "sft", cfg("dataset: " + train + "\n"), "-max_steps=3"},
			nil, "start with two dashes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := runRootErr(t, "", tc.args...)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("the dry run lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

// launch --help shows its flags once (cobra's own "Flags:" section is not added).
func TestLaunchHelpListsFlagsOnce(t *testing.T) {
	out, _, err := runRootErr(t, "", "launch", "--help")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out, "Flags:"); n != 1 {
		t.Fatalf("launch --help has %d \"Flags:\" sections, want 1:\n%s", n, out)
	}
	for _, w := range []string{"--trace=FILE", "--dry-run", "Usage:\n  halo-shell launch METHOD CONFIG.yaml"} {
		if !strings.Contains(out, w) {
			t.Errorf("launch --help lacks %q:\n%s", w, out)
		}
	}
}

// A misspelt tool is named with the tool meant; the British spelling of tokenize works.
func TestRunUnknownToolSuggests(t *testing.T) {
	out, _, err := runRootErr(t, `"Hi"`+"\n", "run", "tokenise", "--tokenizer", "../../examples/quickstart/tokenizer")
	if err != nil || !strings.HasPrefix(out, "[") {
		t.Fatalf("run tokenise: %q, %v", out, err)
	}
	for _, tc := range []struct{ tool, want string }{
		{"tokenzie", `unknown tool "tokenzie" (did you mean tokenize?)`},
		{"inspekt", "did you mean inspect?"},
		{"frobnicate", `unknown tool "frobnicate"; "halo-shell run --help" lists the tools`},
	} {
		_, _, err := runRootErr(t, "", "run", tc.tool, "--tokenizer", "x")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run %s: error %v, want %q", tc.tool, err, tc.want)
		}
	}
}

// A path that is not there is reported as missing, not as a directory without some file.
func TestMissingPathsAreNamedAsMissing(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-model")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "generate", "--model", missing, "--prompt", "hi"}, "directory " + missing + " does not exist"},
		{[]string{"run", "tokenize", "--tokenizer", missing}, "directory " + missing + " does not exist"},
		{[]string{"run", "inspect", missing}, missing + " does not exist"},
		{[]string{"run", "config", missing}, missing + " does not exist"},
		{[]string{"run", "tokenize", "--tokenizer", "../../examples/quickstart.yaml"}, "is a file, not a directory"},
	} {
		_, _, err := runRootErr(t, "", tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.want)
		}
	}
}

// A dry run of a GPU config on a machine without a usable GPU says that the run would fail.
func TestDryRunWarnsWithoutGPU(t *testing.T) {
	if cuda.Available() == nil {
		t.Skip("a GPU is usable here; the warning is for machines without one")
	}
	out := filepath.Join(t.TempDir(), "run")
	for _, extra := range [][]string{{"--device=cuda"}, {"--device=auto", "--devices=cuda:0"}} {
		stdout, stderr, err := runRootErr(t, "", append(append(quickstartArgs(out), "--dry-run"), extra...)...)
		if err != nil {
			t.Fatalf("%v: %v", extra, err)
		}
		if !strings.Contains(stderr, "launch: warning: the config asks for GPUs") || !strings.Contains(stderr, "the run itself would fail") {
			t.Errorf("%v: stderr %q, want a warning that no GPU is usable", extra, stderr)
		}
		if !strings.Contains(stdout, "total") {
			t.Errorf("%v: the estimate is missing after the warning:\n%s", extra, stdout)
		}
	}
	_, stderr, err := runRootErr(t, "", append(quickstartArgs(out), "--dry-run", "--device=auto")...)
	if err != nil || strings.Contains(stderr, "warning") {
		t.Errorf("device auto (falls back to the CPU): stderr %q, %v; want no warning", stderr, err)
	}
}
