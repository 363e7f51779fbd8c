package train

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/data"
)

// The quickstart tokenizer must tokenize as Hugging Face tokenizers does: hf_encoding.json was
// written by examples/quickstart/tokenizer/check_tokenizer.mjs with the npm "tokenizers" package.
func TestQuickstartTokenizerMatchesHuggingFace(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(quickTok, "hf_encoding.json"))
	if err != nil {
		t.Fatal(err)
	}
	var want struct {
		VocabSize int     `json:"vocab_size"`
		IDs       []int32 `json:"ids"`
	}
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	c, err := loadCodec(quickTok, false)
	if err != nil {
		t.Fatal(err)
	}
	text := "<|im_start|>user\nWhat is 37+48?<|im_end|>\n<|im_start|>assistant\n85<|im_end|>\n"
	if got := c.ids(text); !slices.Equal(got, want.IDs) {
		t.Fatalf("ids %v, Hugging Face gives %v", got, want.IDs)
	}
	if c.vocabSize() != want.VocabSize {
		t.Fatalf("vocab %d, Hugging Face says %d", c.vocabSize(), want.VocabSize)
	}
	// The chat template renders the same text, and the reply is the trained part.
	ids, mask, err := c.chat.encode([]data.Message{{Role: "user", Content: "What is 37+48?"}, {Role: "assistant", Content: "85"}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, want.IDs) {
		t.Fatalf("chat template ids %v, want %v", ids, want.IDs)
	}
	var trained []int32
	for i, tr := range mask {
		if tr {
			trained = append(trained, ids[i])
		}
	}
	// The reply and its end-of-turn marker: "85<|im_end|>" (decode drops the special token).
	if got := c.decode(trained); got != "85" || len(trained) != 3 || trained[2] != c.eos {
		t.Fatalf("trained tokens %v decode to %q, want the reply and <|im_end|>", trained, got)
	}
}

func TestProgressRedrawsOnATerminal(t *testing.T) {
	var b strings.Builder
	p := newProgress(&b, true, 10, 5)
	for s := 1; s <= 10; s++ {
		p.update(StepMetrics{Step: s, Loss: 1, TokensPerS: 100})
		p.last = time.Time{} // as if 100 ms had passed
	}
	p.finish()
	out := b.String()
	if strings.Count(out, "\r\x1b[K") != 10 || strings.Count(out, "\n") != 1 || !strings.Contains(out, "step 10/10 ") {
		t.Fatalf("terminal progress %q", out)
	}
	// Fast steps redraw at most ten times a second, and always the last step.
	b.Reset()
	p = newProgress(&b, true, 10, 5)
	for s := 1; s <= 10; s++ {
		p.update(StepMetrics{Step: s})
	}
	if n := strings.Count(b.String(), "\r\x1b[K"); n != 2 || !strings.Contains(b.String(), "step 10/10 ") {
		t.Fatalf("%d redraws for 10 fast steps: %q", n, b.String())
	}
	b.Reset()
	p = newProgress(&b, false, 10, 5)
	for s := 1; s <= 10; s++ {
		p.update(StepMetrics{Step: s})
	}
	if lines := strings.Split(strings.TrimSpace(b.String()), "\n"); len(lines) != 2 || strings.Contains(b.String(), "\r") {
		t.Fatalf("plain progress should print steps 5 and 10 only:\n%s", b.String())
	}
}
