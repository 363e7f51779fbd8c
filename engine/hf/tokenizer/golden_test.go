package tokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"unicode/utf8"
)

// goldenCase is one line of testdata/*/goldens.json, written by
// scripts/tokenizer-goldens/gen.mjs with Hugging Face tokenizers.
type goldenCase struct {
	Name               string   `json:"name"`
	Text               string   `json:"text"`
	IDs                []int    `json:"ids"`
	Decoded            *string  `json:"decoded"`
	DecodedSkipSpecial *string  `json:"decoded_skip_special"`
	Roundtrip          *bool    `json:"roundtrip"`
	Offsets            [][2]int `json:"offsets"`
}

func loadGoldens(t testing.TB, name string) []goldenCase {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name, "goldens.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Cases []goldenCase `json:"cases"`
	}
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatalf("%s goldens: %v", name, err)
	}
	if len(g.Cases) < 300 {
		t.Fatalf("%s goldens: only %d cases", name, len(g.Cases))
	}
	return g.Cases
}

var (
	tokOnce sync.Map // name -> *tokLoad
)

type tokLoad struct {
	once sync.Once
	tok  *Tokenizer
	err  error
	skip string
}

// testTokenizer loads a tokenizer of testdata (or the Llama-3 one from .cache/testdata),
// once per test binary. Llama-3 is skipped when absent, except under HALO_CI=1.
func testTokenizer(t testing.TB, name string) *Tokenizer {
	t.Helper()
	v, _ := tokOnce.LoadOrStore(name, &tokLoad{})
	l := v.(*tokLoad)
	l.once.Do(func() {
		switch name {
		case "qwen3":
			l.tok, l.err = loadGzip(filepath.Join("testdata", "qwen3", "tokenizer.json.gz"))
		case "llama3":
			p := filepath.Join("..", "..", "..", ".cache", "testdata", "llama3", "tokenizer.json")
			if _, err := os.Stat(p); err != nil {
				l.skip = "Llama-3 tokenizer not fetched (run scripts/fetch-testdata.sh)"
				return
			}
			l.tok, l.err = FromFile(p)
		default:
			l.tok, l.err = FromDir(filepath.Join("testdata", name))
		}
	})
	if l.skip != "" {
		if os.Getenv("HALO_CI") == "1" {
			t.Fatalf("%s (HALO_CI=1 requires it)", l.skip)
		}
		t.Skip(l.skip)
	}
	if l.err != nil {
		t.Fatal(l.err)
	}
	return l.tok
}

func loadGzip(path string) (*Tokenizer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if _, err := io.Copy(&buf, zr); err != nil {
		return nil, err
	}
	return FromBytes(buf.Bytes())
}

var goldenTokenizers = []string{"qwen3", "llama3", "tiny-gpt2", "tiny-norm", "tiny-misc"}

// TestEncodeMatchesHuggingFace checks Encode against the ids Hugging Face tokenizers gives
// for the whole corpus (fixed cases, a long document and randomized strings).
func TestEncodeMatchesHuggingFace(t *testing.T) {
	for _, name := range goldenTokenizers {
		t.Run(name, func(t *testing.T) {
			tok := testTokenizer(t, name)
			bad := 0
			for _, c := range loadGoldens(t, name) {
				got := tok.Encode(c.Text)
				if !slices.Equal(got, c.IDs) {
					bad++
					if bad <= 5 {
						t.Errorf("%s: Encode(%q)\n got %v\nwant %v", c.Name, trunc(c.Text), truncIDs(got), truncIDs(c.IDs))
					}
				}
			}
			if bad > 5 {
				t.Errorf("%d cases differ in all", bad)
			}
		})
	}
}

// TestDecodeMatchesHuggingFace checks Decode (with and without skipping special tokens)
// against Hugging Face's decode of the golden ids.
func TestDecodeMatchesHuggingFace(t *testing.T) {
	for _, name := range goldenTokenizers {
		t.Run(name, func(t *testing.T) {
			tok := testTokenizer(t, name)
			bad := 0
			for _, c := range loadGoldens(t, name) {
				check := func(what, got, want string) {
					if got != want {
						bad++
						if bad <= 5 {
							t.Errorf("%s: %s(%v)\n got %q\nwant %q", c.Name, what, truncIDs(c.IDs), trunc(got), trunc(want))
						}
					}
				}
				if c.Decoded != nil {
					check("Decode", tok.Decode(c.IDs, false), *c.Decoded)
				}
				if c.DecodedSkipSpecial != nil {
					check("Decode skipping special", tok.Decode(c.IDs, true), *c.DecodedSkipSpecial)
				}
				if c.Roundtrip != nil && (tok.Decode(c.IDs, false) == c.Text) != *c.Roundtrip {
					bad++
					t.Errorf("%s: Decode round trip is %v, Hugging Face's is %v", c.Name, !*c.Roundtrip, *c.Roundtrip)
				}
			}
			if bad > 5 {
				t.Errorf("%d decodes differ in all", bad)
			}
		})
	}
}

func trunc(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

func truncIDs(ids []int) []int {
	if len(ids) > 40 {
		return ids[:40]
	}
	return ids
}

// TestDecodeRandomIDsMatchesHuggingFace checks Decode on random id sequences (characters
// split across byte tokens, special tokens, ids past the vocabulary) against Hugging Face,
// which replaces each maximal invalid UTF-8 subpart with one U+FFFD.
func TestDecodeRandomIDsMatchesHuggingFace(t *testing.T) {
	tok := testTokenizer(t, "qwen3")
	data, err := os.ReadFile(filepath.Join("testdata", "qwen3", "decode_goldens.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Cases []goldenCase `json:"cases"`
	}
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Cases) < 300 {
		t.Fatalf("only %d cases", len(g.Cases))
	}
	for _, c := range g.Cases {
		if got := tok.Decode(c.IDs, false); got != *c.Decoded {
			t.Errorf("%s: Decode(%v) = %q, want %q", c.Name, c.IDs, got, *c.Decoded)
		}
		if got := tok.Decode(c.IDs, true); got != *c.DecodedSkipSpecial {
			t.Errorf("%s: Decode skipping special(%v) = %q, want %q", c.Name, c.IDs, got, *c.DecodedSkipSpecial)
		}
	}
}

// TestEncodeOffsetsMatchHuggingFace checks EncodeOffsets against Hugging Face's offsets
// (character offsets, converted to bytes) where the normalizer leaves the text unchanged:
// ids equal Encode's, and each byte range widened to whole characters equals Hugging Face's.
func TestEncodeOffsetsMatchHuggingFace(t *testing.T) {
	for _, name := range []string{"qwen3", "tiny-gpt2", "tiny-norm", "tiny-misc"} {
		t.Run(name, func(t *testing.T) {
			tok := testTokenizer(t, name)
			bad, compared := 0, 0
			for _, c := range loadGoldens(t, name) {
				ids, offs := tok.EncodeOffsets(c.Text)
				if !slices.Equal(ids, c.IDs) {
					t.Fatalf("%s: EncodeOffsets ids %v, want %v", c.Name, truncIDs(ids), truncIDs(c.IDs))
				}
				if len(offs) != len(ids) {
					t.Fatalf("%s: %d offsets for %d ids", c.Name, len(offs), len(ids))
				}
				for i := range offs {
					if offs[i][0] > offs[i][1] || offs[i][1] > len(c.Text) || (i > 0 && offs[i][0] < offs[i-1][0]) {
						t.Fatalf("%s: offsets not monotone within the text: %v", c.Name, offs)
					}
				}
				if tok.normalizer != nil && tok.normalizer.normalize(c.Text) != c.Text {
					continue
				}
				compared++
				for i, o := range offs {
					got := widenToChars(c.Text, o)
					if got != c.Offsets[i] {
						bad++
						if bad <= 5 {
							t.Errorf("%s: token %d (id %d): offsets %v (widened %v), Hugging Face %v", c.Name, i, ids[i], o, got, c.Offsets[i])
						}
						break
					}
				}
			}
			if compared < 150 {
				t.Errorf("only %d cases compared", compared)
			}
		})
	}
}

// widenToChars widens a byte range to whole UTF-8 characters (empty ranges stay empty).
func widenToChars(s string, o [2]int) [2]int {
	a, b := o[0], o[1]
	if a == b {
		return o
	}
	for a > 0 && !utf8.RuneStart(s[a]) {
		a--
	}
	for b < len(s) && !utf8.RuneStart(s[b]) {
		b++
	}
	return [2]int{a, b}
}
