package chat

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/tokenizer"
)

// wordEncoder is a test tokenizer: special tokens <|...|> are single tokens, a run of
// whitespace is one token (so a header newline merges with a content's leading newlines),
// and so is each run of other characters. It reports offsets.
type wordEncoder struct{ vocab map[string]int }

var wordRe = regexp.MustCompile(`<\|[a-z_]+\|>|\s+|[^\s<]+|<`)

func (e *wordEncoder) EncodeOffsets(text string) ([]int, [][2]int) {
	if e.vocab == nil {
		e.vocab = map[string]int{}
	}
	var ids []int
	var offs [][2]int
	for _, m := range wordRe.FindAllStringIndex(text, -1) {
		w := text[m[0]:m[1]]
		id, ok := e.vocab[w]
		if !ok {
			id = len(e.vocab)
			e.vocab[w] = id
		}
		ids = append(ids, id)
		offs = append(offs, [2]int{m[0], m[1]})
	}
	return ids, offs
}

func (e *wordEncoder) Encode(text string) []int {
	ids, _ := e.EncodeOffsets(text)
	return ids
}

// plainEncoder hides EncodeOffsets, so Encode must place boundaries without offsets.
type plainEncoder struct{ e *wordEncoder }

func (p plainEncoder) Encode(text string) []int { return p.e.Encode(text) }

// TestEncodeMaskWithAndWithoutOffsets checks that the mask marks exactly the tokens that end
// inside assistant spans, with offsets and without them, including a token that straddles a
// span start (the header's newline merged with the content's leading newlines).
func TestEncodeMaskWithAndWithoutOffsets(t *testing.T) {
	cases := loadCases(t)
	straddles := 0
	for _, tc := range []struct{ tmpl, conv string }{
		{"qwen3", "system_user_assistant"}, {"qwen3", "multi_turn"}, {"qwen3", "whitespace_and_unicode"},
		{"qwen3", "thinking_inline"}, {"qwen3", "tool_call_object_args"},
		{"chatml_tools", "whitespace_and_unicode"}, {"chatml_tools", "tool_call_object_args"}, {"chatml_tools", "content_parts"},
	} {
		name := tc.conv
		t.Run(tc.tmpl+"/"+name, func(t *testing.T) {
			tmpl, err := Load(filepath.Join("testdata/templates", tc.tmpl))
			if err != nil {
				t.Fatal(err)
			}
			c := cases[name]
			opts := caseOptions(c, false)
			text, spans, err := tmpl.AssistantSpans(c.Messages, opts)
			if err != nil {
				t.Fatal(err)
			}
			enc := &wordEncoder{}
			ids, offs := enc.EncodeOffsets(text)
			want := make([]bool, len(ids))
			for i, o := range offs {
				for _, s := range spans {
					if o[1] > s.Start && o[1] <= s.End {
						want[i] = true
						if o[0] < s.Start {
							straddles++
						}
					}
				}
			}
			if !slices.Contains(want, true) {
				t.Fatal("no assistant tokens")
			}
			for _, variant := range []struct {
				name string
				enc  Encoder
			}{{"offsets", enc}, {"no offsets", plainEncoder{enc}}} {
				gotIDs, mask, err := tmpl.Encode(variant.enc, c.Messages, opts)
				if err != nil {
					t.Fatalf("%s: %v", variant.name, err)
				}
				if !slices.Equal(gotIDs, ids) {
					t.Fatalf("%s: ids are not the encoding of the rendered text", variant.name)
				}
				if !slices.Equal(mask, want) {
					t.Fatalf("%s: mask %q, want %q", variant.name, maskedText(text, offs, mask), maskedText(text, offs, want))
				}
			}
		})
	}
	if straddles == 0 {
		t.Fatal("no case has a token straddling a span start; the test lost its coverage")
	}
}

func maskedText(text string, offs [][2]int, mask []bool) []string {
	var out []string
	cur := ""
	for i, m := range mask {
		if m {
			cur += text[offs[i][0]:offs[i][1]]
		} else if cur != "" {
			out = append(out, cur)
			cur = ""
		}
	}
	if cur != "" {
		out = append(out, cur)
	}
	return out
}

// TestEncodeQwen3Tokenizer runs Encode with the real Qwen3 tokenizer: the ids decode to the
// rendered text, and the masked tokens decode to the assistant output of each turn (plus, at
// most, whitespace of the header merged into the first token).
func TestEncodeQwen3Tokenizer(t *testing.T) {
	tok := qwen3Tokenizer(t)
	tmpl, err := Load("testdata/templates/qwen3")
	if err != nil {
		t.Fatal(err)
	}
	golden, err := os.ReadFile("testdata/golden/masks_qwen3.json")
	if err != nil {
		t.Fatal(err)
	}
	var goldens []maskGolden
	if err := json.Unmarshal(golden, &goldens); err != nil {
		t.Fatal(err)
	}
	cases := loadCases(t)
	for _, g := range goldens {
		if len(g.Kwargs) > 0 {
			continue
		}
		c := cases[g.Case]
		ids, mask, err := tmpl.Encode(tok, c.Messages, caseOptions(c, false))
		if err != nil {
			t.Errorf("%s: %v", g.Case, err)
			continue
		}
		if got := tok.Decode(ids, false); got != g.Text {
			t.Errorf("%s: ids decode to %q, want the rendered text %q", g.Case, got, g.Text)
			continue
		}
		var runs []string
		var cur []int
		for i, m := range mask {
			if m {
				cur = append(cur, ids[i])
			} else if len(cur) > 0 {
				runs = append(runs, tok.Decode(cur, false))
				cur = nil
			}
		}
		if len(cur) > 0 {
			runs = append(runs, tok.Decode(cur, false))
		}
		if len(runs) != len(g.Spans) {
			t.Errorf("%s: %d masked runs %q, want %d spans", g.Case, len(runs), runs, len(g.Spans))
			continue
		}
		for i, s := range g.Spans {
			want := g.Text[s[0]:s[1]]
			extra, ok := strings.CutSuffix(runs[i], want)
			if !ok || strings.TrimSpace(extra) != "" {
				t.Errorf("%s: masked run %d is %q, want %q", g.Case, i, runs[i], want)
			}
		}
	}
}

// qwen3Tokenizer loads the Qwen3 tokenizer the tokenizer package's tests ship.
func qwen3Tokenizer(t testing.TB) *tokenizer.Tokenizer {
	t.Helper()
	gz, err := os.ReadFile(filepath.Join("..", "tokenizer", "testdata", "qwen3", "tokenizer.json.gz"))
	if err != nil {
		t.Fatalf("Qwen3 tokenizer of the tokenizer package's tests: %v", err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.FromBytes(data)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// BenchmarkEncodeQwen3 renders, masks and tokenizes a 20-exchange conversation with the Qwen3
// template and tokenizer (no offsets: pieces are encoded at span boundaries).
func BenchmarkEncodeQwen3(b *testing.B) {
	tok := qwen3Tokenizer(b)
	tmpl, err := Load("testdata/templates/qwen3")
	if err != nil {
		b.Fatal(err)
	}
	msgs := longConversation(20)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := tmpl.Encode(tok, msgs, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
