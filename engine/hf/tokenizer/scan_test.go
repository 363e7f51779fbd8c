package tokenizer

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode"
)

var knownPatterns = map[string]string{"gpt2": gpt2Pattern, "llama3": llama3Pattern, "qwen2": qwen2Pattern, "o200k": o200kPattern,
	"deepseek-digits": deepseekDigitsPattern, "deepseek-cjk": deepseekCJKPattern, "deepseek-main": deepseekMainPattern}

// TestKnownPatternsHaveScanners checks that every known pattern constant gets a hand-written
// scanner.
func TestKnownPatternsHaveScanners(t *testing.T) {
	for name, pat := range knownPatterns {
		if fastScanner(pat) == nil {
			t.Errorf("%s: no scanner for its pattern", name)
		}
	}
}

// TestRealTokenizersUseFastScanner checks that the patterns in the Qwen3 and Llama-3 files
// are the ones the hand-written scanners replace (a changed constant would silently fall
// back to the slow engine).
func TestRealTokenizersUseFastScanner(t *testing.T) {
	for _, name := range []string{"qwen3", "llama3"} {
		t.Run(name, func(t *testing.T) {
			tok := testTokenizer(t, name)
			var found bool
			for _, st := range tok.steps {
				if sp, ok := st.(splitStep); ok {
					if _, fast := sp.m.(scanMatcher); fast {
						found = true
					} else {
						t.Errorf("Split step uses %T, want the fast scanner", sp.m)
					}
				}
			}
			if !found {
				t.Errorf("no Split step in the pre-tokenizer")
			}
		})
	}
}

// scannerInputs returns the golden corpus plus random strings built from characters that
// sit on the classes' boundaries.
func scannerInputs(t *testing.T) []string {
	var inputs []string
	data, err := os.ReadFile(filepath.Join("testdata", "qwen3", "goldens.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Cases []goldenCase `json:"cases"`
	}
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	for _, c := range g.Cases {
		inputs = append(inputs, c.Text)
	}
	alphabet := []string{"\U0002ED59", "\U00013C9E", "ſ", "'ſ", "\u212A", "ʰ", "ǅ", "Ab", "AB", "\u0301", "\u0903", "/", "\u2160", "中", "ぁ", "ア", "龦", "`x", "!a", "é", "$", "^", "a", "Z", "é", "中", "ß", "1", "٣", "½", "Ⅻ", " ", "  ", "\t", "\n", "\r", "\r\n", "\u00a0", "\u3000",
		"\u2028", "\u0085", "'", "'s", "'S", "'ll", "'LL", "'re", "'Ve", "'d", "'m", "'t", "'x", "!", ".", "?", "-", "_",
		"🎉", "\u0301", "\u200d", "\ufe0f", "$", "<", ">"}
	r := rand.New(rand.NewPCG(3, 4))
	for n := 0; n < 3000; n++ {
		var b strings.Builder
		for k := r.IntN(20); k >= 0; k-- {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		inputs = append(inputs, b.String())
	}
	return inputs
}

// TestFastScannersMatchRegex compares each hand-written scanner with the backtracking
// regular expression engine on the corpus and on random boundary-heavy strings.
func TestFastScannersMatchRegex(t *testing.T) {
	inputs := scannerInputs(t)
	for name, pat := range knownPatterns {
		t.Run(name, func(t *testing.T) {
			fast := fastScanner(pat)
			slow, err := compileRegex(pat)
			if err != nil {
				t.Fatal(err)
			}
			bad := 0
			for _, s := range inputs {
				got, want := fast.findAll(s, nil), slow.findAll(s, nil)
				if !slices.Equal(got, want) {
					bad++
					if bad <= 5 {
						t.Errorf("%q:\n fast %v\nregex %v", s, got, want)
					}
				}
			}
		})
	}
}

// FuzzFastScanners compares the scanners with the regular expression engine on arbitrary
// valid UTF-8.
func FuzzFastScanners(f *testing.F) {
	for _, s := range []string{"", "Hello world", "it's 'LL", " \n\t x", "123456", "a\r\n\r\n b", "🎉 中文", "  !! ??\n"} {
		f.Add(s)
	}
	type pair struct {
		fast matcher
		slow *regexMatcher
	}
	var pairs []pair
	for _, pat := range knownPatterns {
		slow, err := compileRegex(pat)
		if err != nil {
			f.Fatal(err)
		}
		pairs = append(pairs, pair{fastScanner(pat), slow})
	}
	f.Fuzz(func(t *testing.T, s string) {
		s = strings.ToValidUTF8(s, "\uFFFD")
		for _, p := range pairs {
			got, want := p.fast.findAll(s, nil), p.slow.findAll(s, nil)
			if !slices.Equal(got, want) {
				t.Fatalf("pattern %s on %q:\n fast %v\nregex %v", p.slow.src, s, got, want)
			}
		}
	})
}

// TestUnicodeTablesExtendGo checks that the generated tables hold what Go's unicode
// package has for the classes, plus characters of newer Unicode versions (CJK Extension I,
// Egyptian Hieroglyphs Extended-A), which the Llama-3 and Qwen3 pre-tokenizers treat as letters.
func TestUnicodeTablesExtendGo(t *testing.T) {
	for _, r := range []rune{'a', 'Z', 'é', '中', 'ǅ', 0x2ED59, 0x13C9E, 0x14377} {
		if !unicode.Is(hfLetter, r) {
			t.Errorf("%U is not in hfLetter", r)
		}
	}
	for _, r := range []rune{'1', '٣', '½', 'Ⅻ'} {
		if !unicode.Is(hfNumber, r) || unicode.Is(hfLetter, r) {
			t.Errorf("%U: want a number, not a letter", r)
		}
	}
	for _, r := range []rune{' ', '\t', '\n', 0x85, 0xA0, 0x3000, 0x2028} {
		if !unicode.Is(hfSpace, r) {
			t.Errorf("%U is not in hfSpace", r)
		}
	}
	for _, r := range []rune{'\'', '!', 0x200B, 0xFEFF} {
		if unicode.Is(hfSpace, r) || unicode.Is(hfLetter, r) || unicode.Is(hfNumber, r) {
			t.Errorf("%U is in a class", r)
		}
	}
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if unicode.IsLetter(r) && !unicode.Is(hfLetter, r) {
			t.Errorf("Go letter %U is not in hfLetter", r)
			break
		}
	}
}

// TestRegexUsesHFClasses checks that \p{L} and \p{N} in custom patterns follow Hugging
// Face's tables (a letter of Unicode 15.1 matches) and that other syntax is left alone.
func TestRegexUsesHFClasses(t *testing.T) {
	for _, c := range []struct {
		pattern, in string
		want        []span
	}{
		{`\p{L}+`, "a\U0002ED59b 1", []span{{0, 6}}},
		{`\pL+`, "ab1", []span{{0, 2}}},
		{`\P{L}+`, "ab12 c", []span{{2, 5}}},
		{`[^\r\n\p{L}\p{N}]+`, "a!?\n1 ", []span{{1, 3}, {5, 6}}},
		{`\\p{L}`, `x\p{L}`, []span{{1, 6}}},
		{`\p{Lu}+`, "abCDe", []span{{2, 4}}},
		{`[\p{Lo}\p{M}]+`, "a\U00013688b", []span{{1, 5}}},
		{`[\p{P}\p{S}]+`, "a\u2428'b", []span{{1, 5}}},
		{`\p{Greek}+`, "aαβ", []span{{1, 5}}},
		{`(?i:'s|'k)`, "'ſ'S'\u212A's", []span{{0, 3}, {3, 5}, {5, 9}, {9, 11}}},
		{`(?i)s(?-i:s)`, "Ssſs SS", []span{{0, 2}, {2, 5}}},
		{`(?<s>s)(?=s)`, "ssS", []span{{0, 1}}},
		{`[]\p{N}]+`, "a]1]b", []span{{1, 4}}},
		{`\p{N}`, "x٣", []span{{1, 3}}},
		{`\d+`, "x1\U000116E0y", []span{{1, 6}}},
		{`\D+`, "x1\U000116E0y", []span{{0, 1}, {6, 7}}},
		{`[\w-]+`, "a_b-c d", []span{{0, 5}, {6, 7}}},
		{`\W`, "a b", []span{{1, 2}}},
	} {
		m, err := compileRegex(c.pattern)
		if err != nil {
			t.Fatalf("%s: %v", c.pattern, err)
		}
		if got := m.findAll(c.in, nil); !slices.Equal(got, c.want) {
			t.Errorf("%s on %q = %v, want %v", c.pattern, c.in, got, c.want)
		}
	}
}
