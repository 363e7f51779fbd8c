package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/tokenizer"
)

// TestChatTemplateCommand runs `run chat-template` on the committed Qwen3 template.
func TestChatTemplateCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	rootCmd.SetIn(strings.NewReader(`[{"role":"user","content":"Hi"}]` + "\n"))
	rootCmd.SetOut(&out)
	rootCmd.SetErr(&errOut)
	rootCmd.SetArgs([]string{"run", "chat-template", "--tokenizer", "../../engine/hf/chat/testdata/templates/qwen3", "--add-generation-prompt", "--kwargs", `{"enable_thinking": false}`})
	defer func() {
		rootCmd.SetArgs(nil)
		rootCmd.SetIn(nil)
		rootCmd.SetOut(nil)
		rootCmd.SetErr(nil)
	}()
	if err := rootCmd.Execute(); err != nil {
		t.Fatal(err)
	}
	want := `"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"` + "\n"
	if out.String() != want {
		t.Fatalf("got %s want %s", out.String(), want)
	}
	rootCmd.SetArgs([]string{"run", "chat-template", "--tokenizer", "../../engine/hf/chat/testdata/templates/qwen3", "--kwargs", `[1]`})
	if err := rootCmd.Execute(); err == nil || !strings.Contains(err.Error(), "--kwargs must be a JSON object") {
		t.Fatalf("bad --kwargs: got %v", err)
	}
}

// TestChatTemplateMask runs `run chat-template --mask` with the Qwen3 tokenizer and template.
func TestChatTemplateMask(t *testing.T) {
	dir := t.TempDir()
	cfg, err := os.ReadFile("../../engine/hf/chat/testdata/templates/qwen3/tokenizer_config.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	gz, err := os.ReadFile("../../engine/hf/tokenizer/testdata/qwen3/tokenizer.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	tokJSON, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tokJSON, 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rootCmd.SetIn(strings.NewReader(`[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello"}]` + "\n"))
	rootCmd.SetOut(&out)
	rootCmd.SetArgs([]string{"run", "chat-template", "--tokenizer", dir, "--mask", "--kwargs", `{}`, "--add-generation-prompt=false"})
	defer func() {
		rootCmd.SetArgs(nil)
		rootCmd.SetIn(nil)
		rootCmd.SetOut(nil)
	}()
	if err := rootCmd.Execute(); err != nil {
		t.Fatal(err)
	}
	var res struct {
		IDs  []int `json:"ids"`
		Mask []int `json:"mask"`
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	tok, err := tokenizer.FromDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var masked []int
	for i, m := range res.Mask {
		if m == 1 {
			masked = append(masked, res.IDs[i])
		}
	}
	if got := tok.Decode(masked, false); got != "<think>\n\n</think>\n\nHello<|im_end|>" {
		t.Fatalf("masked tokens decode to %q", got)
	}
}
