package main

import (
	"bytes"
	"strings"
	"testing"
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
