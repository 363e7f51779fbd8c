package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestCatastrophicPatternIsRefusedAtLoad(t *testing.T) {
	model := `"model":{"type":"BPE","vocab":{"a":0},"merges":[]}`
	for _, c := range []struct{ name, json, pattern string }{
		{"Split", `{"pre_tokenizer":{"type":"Split","pattern":{"Regex":"(a+)+$"},"behavior":"Isolated"},` + model + `}`, "(a+)+$"},
		{"Split in a Sequence", `{"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"(\\d|\\d\\d)+x"},"behavior":"Removed"}]},` + model + `}`, `(\d|\d\d)+x`},
		{"Replace normalizer", `{"normalizer":{"type":"Replace","pattern":{"Regex":"(x+x+)+y"},"content":""},` + model + `}`, "(x+x+)+y"},
		{"Replace decoder", `{"decoder":{"type":"Replace","pattern":{"Regex":"(\\s*\\s)*$"},"content":""},` + model + `}`, `(\s*\s)*$`},
	} {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			_, err := FromBytes([]byte(c.json))
			var te *MatchTimeoutError
			if !errors.As(err, &te) || te.Pattern != c.pattern || !te.Probe {
				t.Fatalf("err = %v, want a probe *MatchTimeoutError for %q", err, c.pattern)
			}
			for _, w := range []string{"tokenizer: tokenizer.json: ", "backtracks catastrophically", strconv.Quote(c.pattern)} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("refusing the pattern took %v", d)
			}
		})
	}
}

// slowTokenizer is tiny-gpt2 with a Split pattern in front of its ByteLevel step that passes
// the load probes but backtracks exponentially on "abab...ab!".
func slowTokenizer(t *testing.T) *Tokenizer {
	t.Helper()
	t.Setenv("HALO_TOKENIZER_MATCH_TIMEOUT", "200ms")
	data, err := os.ReadFile(filepath.Join("testdata", "tiny-gpt2", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec map[string]any
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	spec["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
		map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "((ab)+)+$"}, "behavior": "Isolated"},
		spec["pre_tokenizer"],
	}}
	data, _ = json.Marshal(spec)
	tok, err := FromBytes(data)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestMatchTimeoutWhileEncoding(t *testing.T) {
	tok := slowTokenizer(t)
	if ids, err := tok.EncodeErr("ababab"); err != nil || tok.Decode(ids, false) != "ababab" {
		t.Fatalf("a short text: %v, %v", ids, err)
	}
	text := "hello " + strings.Repeat("ab", 30) + "!"
	start := time.Now()
	ids, err := tok.EncodeErr(text)
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("EncodeErr took %v with a 200ms match time", d)
	}
	var te *MatchTimeoutError
	if !errors.As(err, &te) || te.Pattern != "((ab)+)+$" || te.Timeout != 200*time.Millisecond || te.Len != len(text) {
		t.Fatalf("err = %#v, want the pattern's *MatchTimeoutError", err)
	}
	for _, w := range []string{`regular expression "((ab)+)+$" ran past its match time of 200ms`, "HALO_TOKENIZER_MATCH_TIMEOUT"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
	if len(err.Error()) > 300 {
		t.Errorf("the error quotes too much of the text: %d bytes", len(err.Error()))
	}
	// Nothing of the text is lost: Encode returns the same ids, which decode to the text.
	if got := tok.Decode(ids, false); got != text {
		t.Errorf("ids decode to %q, want %q", got, text)
	}
	if got := tok.Encode(text); !equalInts(got, ids) {
		t.Errorf("Encode = %v, EncodeErr = %v", got, ids)
	}
	var out bytes.Buffer
	err = tok.EncodeLines(strings.NewReader("\"ok\"\n"+`"`+text+`"`+"\n\"after\"\n"), &out, nil)
	if err == nil || !strings.HasPrefix(err.Error(), "line 2: tokenizer: regular expression") {
		t.Fatalf("EncodeLines err = %v, want line 2 named", err)
	}
	if strings.Count(out.String(), "\n") != 1 {
		t.Errorf("EncodeLines wrote %q before the bad line, want line 1 only", out.String())
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
