package main

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// qwen3Dir writes the Qwen3 tokenizer of the tokenizer package's testdata to a directory.
func qwen3Dir(t *testing.T) string {
	t.Helper()
	src := filepath.Join("..", "..", "engine", "hf", "tokenizer", "testdata", "qwen3")
	f, err := os.Open(filepath.Join(src, "tokenizer.json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(src, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestRunTokenizeCommand(t *testing.T) {
	dir := qwen3Dir(t)
	run := func(stdin string, args ...string) (string, error) {
		var out bytes.Buffer
		rootCmd.SetOut(&out)
		rootCmd.SetIn(strings.NewReader(stdin))
		rootCmd.SetArgs(args)
		defer func() {
			rootCmd.SetArgs(nil)
			rootCmd.SetIn(nil)
			rootCmd.SetOut(nil)
		}()
		err := rootCmd.Execute()
		return out.String(), err
	}
	for _, c := range []struct {
		name, stdin string
		args        []string
		want, err   string
	}{
		{"text", "\"Hello world\"\n\"<|im_start|>user\\n你好<|im_end|>\"\n", []string{"--chat=false"},
			"[9707,1879]\n[151644,872,198,108386,151645]\n", ""},
		{"bad line", "\"Hello\"\n{\"a\":1}\n", []string{"--chat=false"}, "[9707]\n", "line 2: want a JSON string, got a JSON object"},
		// Qwen3's template renders "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n".
		{"chat", `[{"role":"user","content":"Hi"}]` + "\n", []string{"--chat", "--add-generation-prompt"},
			"[151644,872,198,13048,151645,198,151644,77091,198]\n", ""},
		{"chat bad line", `{"role":"user"}` + "\n", []string{"--chat", "--add-generation-prompt=false"}, "", "line 1: want a JSON list of messages"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := run(c.stdin, append([]string{"run", "tokenize", "--tokenizer", dir}, c.args...)...)
			if c.err == "" && err != nil {
				t.Fatal(err)
			}
			if c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
				t.Fatalf("error %v, want %q", err, c.err)
			}
			if out != c.want {
				t.Errorf("stdout %q, want %q", out, c.want)
			}
		})
	}
	if _, err := run("", "run", "tokenize", "--tokenizer", t.TempDir()); err == nil || !strings.Contains(err.Error(), "has no tokenizer.json") {
		t.Errorf("missing tokenizer.json: error %v", err)
	}
}
