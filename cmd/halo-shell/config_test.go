package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
)

func TestRunConfigCommand(t *testing.T) {
	run := func(args ...string) (string, string, error) {
		// Flags keep their values between executions in one process: reset them.
		if cmd, _, err := rootCmd.Find([]string{"run", "config"}); err == nil {
			for _, name := range []string{"preset", "out", "summary", "set"} {
				f := cmd.Flags().Lookup(name)
				if s, ok := f.Value.(interface{ Replace([]string) error }); ok {
					_ = s.Replace(nil)
				} else {
					_ = f.Value.Set(f.DefValue)
				}
				f.Changed = false
			}
		}
		var out, errOut bytes.Buffer
		rootCmd.SetOut(&out)
		rootCmd.SetErr(&errOut)
		rootCmd.SetArgs(args)
		defer rootCmd.SetArgs(nil)
		err := rootCmd.Execute()
		return out.String(), errOut.String(), err
	}
	hub := filepath.Join("..", "..", "engine", "hf", "config", "testdata")

	// A 4.x Hub file comes out as transformers 5.17 writes it.
	got, stderr, err := run("run", "config", filepath.Join(hub, "hub", "qwen2.5-0.5b.json"))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(filepath.Join(hub, "transformers", "saved", "qwen2.5-0.5b.json"))
	if got != string(want) {
		t.Errorf("converted config differs from transformers':\n%s", got)
	}
	if !strings.Contains(stderr, "keys not understood (kept): use_mrope") {
		t.Errorf("stderr: %q", stderr)
	}

	dir := filepath.Join(t.TempDir(), "tiny")
	if _, _, err := run("run", "config", "--preset", "qwen3/tiny", "--set", "vocab_size=1000", "--set", "hidden_act=silu", "--out", dir); err != nil {
		t.Fatal(err)
	}
	c, err := config.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.VocabSize != 1000 || c.HiddenSize != 64 {
		t.Errorf("written preset: vocab %d hidden %d", c.VocabSize, c.HiddenSize)
	}

	sum, _, err := run("run", "config", "--summary", "--preset", "qwen3_moe/qwen3-moe-30b-a3b")
	if err != nil || !strings.Contains(sum, "experts        128 per layer, top-8") {
		t.Errorf("summary: %v\n%s", err, sum)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "config"}, "give either PATH or --preset"},
		{[]string{"run", "config", "--preset", "qwen3"}, "write FAMILY/NAME"},
		{[]string{"run", "config", "--preset", "qwen3/huge"}, `qwen3 has no preset "huge"`},
		{[]string{"run", "config", "--preset", "qwen3/tiny", "--set", "num_key_value_heads=3"}, "num_key_value_heads to one of [1 2 4]"},
		{[]string{"run", "config", "--preset", "qwen3/tiny", "--set", "oops"}, `--set "oops": write key=value`},
	} {
		if _, _, err := run(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.want)
		}
	}
}
