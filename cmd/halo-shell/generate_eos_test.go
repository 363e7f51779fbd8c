package main

import (
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/tokenizer"
)

// TestTokenizerEOSStopsGeneration checks that generation stops at the tokenizer's eos_token
// (the quickstart's ChatML <|im_end|>), which its config.json does not name.
func TestTokenizerEOSStopsGeneration(t *testing.T) {
	dir := "../../examples/quickstart/tokenizer"
	tok, err := tokenizer.FromDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	want, ok := tok.TokenToID("<|im_end|>")
	if !ok {
		t.Fatal("the quickstart tokenizer has no <|im_end|>")
	}
	got := tokenizerEOS(dir, tok)
	if len(got) != 1 || int(got[0]) != want {
		t.Fatalf("stop ids %v, want [%d]", got, want)
	}
	if ids := tokenizerEOS(t.TempDir(), tok); ids != nil {
		t.Fatalf("a directory without tokenizer_config.json gave stop ids %v", ids)
	}
}
