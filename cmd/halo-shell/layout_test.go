package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRunLayoutCommand(t *testing.T) {
	dir := t.TempDir()
	cfg := `{"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
		"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
		"max_position_embeddings": 128}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	// Flag values persist between Execute calls: every run starts from the defaults.
	defaults := []string{"--devices", "cpu", "--layout", "", "--seq-len", "2048", "--dtype", "f32", "--rows", "1"}
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		rootCmd.SetOut(&out)
		rootCmd.SetArgs(append(append(args[:3:3], defaults...), args[3:]...))
		defer rootCmd.SetArgs(nil)
		err := rootCmd.Execute()
		return out.String(), err
	}
	text, err := run("run", "layout", dir, "--devices", "cpu:8", "--layout", "tp=2 cp=2 fsdp", "--seq-len", "64", "--dtype", "bf16")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"layout:  dp=2 fsdp tp=2 cp=2", "groups cp:", "optimizer", "activations", "comm buffers", "2-byte elements"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--devices", "cpu:8", "--layout", "tp=8"}, `a layout that works: "dp=2 tp=4`},
		{[]string{"--devices", "cpu:4", "--layout", "cp=2", "--seq-len", "30"}, "rule cp-seqlen"},
		{[]string{"--devices", "gpu:2"}, `unknown kind "gpu"`},
		{[]string{"--layout", "pp=2"}, `unknown key "pp"`},
		{[]string{"--dtype", "i32"}, "use f32 or bf16"},
	} {
		_, err := run(append([]string{"run", "layout", dir}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}
