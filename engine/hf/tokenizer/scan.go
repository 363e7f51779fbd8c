package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Hand-written scanners for the pre-tokenizer regular expressions of the GPT-2, Llama-3
// (cl100k), Qwen2/Qwen3 and GPT-4o/gpt-oss (o200k) families. Each one returns, at every position, the end of the
// match the backtracking engine would find, by trying the alternatives in order with the
// same greedy-then-backtrack choices. They give exactly the spans of the regular expression
// (scan_test.go checks them against regexp2 on the golden corpus and by fuzzing) at a
// fraction of the cost. They classify characters with Hugging Face's own \p{L}, \p{N} and \s
// tables (unicode_tables.go, newer than Go's unicode package). Every one of these patterns matches a non-empty string at every
// position, so matches tile the input.

// Known patterns, exactly as they appear in tokenizer.json files.
const (
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	qwen2Pattern  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// The three split patterns of DeepSeek-V3 (applied one after the other).
	deepseekDigitsPattern = `\p{N}{1,3}`
	deepseekCJKPattern    = `[一-龥぀-ゟ゠-ヿ]+`
	deepseekMainPattern   = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
	// o200kPattern is GPT-4o's and gpt-oss's.
	o200kPattern = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// fastScanner returns a hand-written matcher for a known pre-tokenizer pattern, or nil.
func fastScanner(pattern string) matcher {
	switch pattern {
	case gpt2Pattern:
		return scanMatcher{gpt2Next}
	case llama3Pattern:
		return scanMatcher{func(s string, i int) int { return cl100kNext(s, i, 3) }}
	case qwen2Pattern:
		return scanMatcher{func(s string, i int) int { return cl100kNext(s, i, 1) }}
	case o200kPattern:
		return scanMatcher{o200kNext}
	case deepseekDigitsPattern:
		return gapScanner{digitsNext}
	case deepseekCJKPattern:
		return gapScanner{cjkNext}
	case deepseekMainPattern:
		return gapScanner{deepseekNext}
	}
	return nil
}

// scanMatcher adapts a "match end at i" function to the matcher interface.
type scanMatcher struct {
	next func(s string, i int) int
}

func (m scanMatcher) findAll(s string, dst []span) []span {
	for i := 0; i < len(s); {
		e := m.next(s, i)
		dst = append(dst, span{i, e})
		i = e
	}
	return dst
}

// Character classes of ASCII bytes.
const (
	clsL    = 1 << iota // \p{L}
	clsN                // \p{N}
	clsS                // \s
	clsCRLF             // [\r\n]
)

var asciiClass [128]uint8

func init() {
	for b := 0; b < 128; b++ {
		r := rune(b)
		var c uint8
		if unicode.Is(hfLetter, r) {
			c |= clsL
		}
		if unicode.Is(hfNumber, r) {
			c |= clsN
		}
		if unicode.Is(hfSpace, r) {
			c |= clsS
		}
		if r == '\r' || r == '\n' {
			c |= clsCRLF
		}
		asciiClass[b] = c
	}
}

// classAt returns the class bits and byte size of the rune at s[i] (i < len(s)).
func classAt(s string, i int) (uint8, int) {
	if b := s[i]; b < utf8.RuneSelf {
		return asciiClass[b], 1
	}
	r, size := utf8.DecodeRuneInString(s[i:])
	var c uint8
	switch {
	case unicode.Is(hfLetter, r):
		c = clsL
	case unicode.Is(hfNumber, r):
		c = clsN
	case unicode.Is(hfSpace, r):
		c = clsS
	}
	return c, size
}

// runOf returns the end of the run of runes starting at i whose class has any bit of want.
func runOf(s string, i int, want uint8) int {
	for i < len(s) {
		c, size := classAt(s, i)
		if c&want == 0 {
			break
		}
		i += size
	}
	return i
}

// runOfNot returns the end of the run of runes starting at i whose class has no bit of
// unwanted.
func runOfNot(s string, i int, unwanted uint8) int {
	for i < len(s) {
		c, size := classAt(s, i)
		if c&unwanted != 0 {
			break
		}
		i += size
	}
	return i
}

func lower(b byte) byte {
	if 'A' <= b && b <= 'Z' {
		return b + 'a' - 'A'
	}
	return b
}

// contraction returns the end of 's|'t|'re|'ve|'m|'ll|'d at i (s[i] is an apostrophe), or -1.
// foldCase makes the letters match either case (the (?i:...) group).
func contraction(s string, i int, foldCase bool) int {
	at := func(k int) byte {
		if i+k >= len(s) {
			return 0
		}
		if foldCase {
			return lower(s[i+k])
		}
		return s[i+k]
	}
	if foldCase && strings.HasPrefix(s[i+1:], "ſ") {
		// Oniguruma folds U+017F LATIN SMALL LETTER LONG S to s.
		return i + 1 + len("ſ")
	}
	switch at(1) {
	case 's', 't', 'm', 'd':
		return i + 2
	case 'r', 'v':
		if at(2) == 'e' {
			return i + 3
		}
	case 'l':
		if at(2) == 'l' {
			return i + 3
		}
	}
	return -1
}

// whitespaceTail handles \s+(?!\S)|\s+ at i, where s[i] is whitespace and j is the end of
// the whitespace run: the run minus its last character when a non-space follows and the
// run has more than one character, else the whole run.
func whitespaceTail(s string, i, j int) int {
	if j < len(s) {
		_, size := utf8.DecodeLastRuneInString(s[:j])
		if j-size > i {
			return j - size
		}
	}
	return j
}

// cl100kNext is the match end at i of the Llama-3 pattern (maxDigits 3) or the Qwen2
// pattern (maxDigits 1).
func cl100kNext(s string, i, maxDigits int) int {
	c, size := classAt(s, i)
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if s[i] == '\'' {
		if e := contraction(s, i, true); e >= 0 {
			return e
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c&clsL != 0 {
		return runOf(s, i+size, clsL)
	}
	if c&(clsCRLF|clsN) == 0 && i+size < len(s) {
		if c2, _ := classAt(s, i+size); c2&clsL != 0 {
			return runOf(s, i+size, clsL)
		}
	}
	// \p{N}{1,maxDigits}
	if c&clsN != 0 {
		e := i + size
		for n := 1; n < maxDigits && e < len(s); n++ {
			c2, size2 := classAt(s, e)
			if c2&clsN == 0 {
				break
			}
			e += size2
		}
		return e
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n]*
	p := i
	if s[i] == ' ' {
		p++
	}
	if p < len(s) {
		if c2, _ := classAt(s, p); c2&(clsS|clsL|clsN) == 0 {
			e := runOfNot(s, p, clsS|clsL|clsN)
			for e < len(s) && (s[e] == '\r' || s[e] == '\n') {
				e++
			}
			return e
		}
	}
	// Here s[i] is whitespace: every other character matched above.
	j := runOf(s, i, clsS)
	// \s*[\r\n]+: up to and including the last CR or LF of the run.
	for k := j - 1; k >= i; k-- {
		if s[k] == '\r' || s[k] == '\n' {
			return k + 1
		}
	}
	return whitespaceTail(s, i, j)
}

// gpt2Next is the match end at i of the GPT-2 ByteLevel pattern.
func gpt2Next(s string, i int) int {
	if s[i] == '\'' {
		if e := contraction(s, i, false); e >= 0 {
			return e
		}
	}
	p := i
	if s[i] == ' ' && i+1 < len(s) {
		p++
	}
	c, _ := classAt(s, p)
	switch {
	case c&clsL != 0: //  ?\p{L}+
		return runOf(s, p, clsL)
	case c&clsN != 0: //  ?\p{N}+
		return runOf(s, p, clsN)
	case c&clsS == 0: //  ?[^\s\p{L}\p{N}]+
		return runOfNot(s, p, clsS|clsL|clsN)
	}
	// s[i] is whitespace: \s+(?!\S)|\s+
	return whitespaceTail(s, i, runOf(s, i, clsS))
}

// Classes of the o200k pattern: U is [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], W is
// [\p{Ll}\p{Lm}\p{Lo}\p{M}], P is [^\r\n\p{L}\p{N}].
const (
	o2U = 1 << iota
	o2W
	o2P
)

// o200kClass returns the o200k class bits (plus the clsL/N/S/CRLF bits shifted by 3) and
// the size of the rune at s[i].
func o200kClass(s string, i int) (uint8, int) {
	var r rune
	size := 1
	if b := s[i]; b < utf8.RuneSelf {
		r = rune(b)
	} else {
		r, size = utf8.DecodeRuneInString(s[i:])
	}
	var c uint8
	switch {
	case r < utf8.RuneSelf:
		switch {
		case 'a' <= r && r <= 'z':
			c = o2W
		case 'A' <= r && r <= 'Z':
			c = o2U
		case r >= '0' && r <= '9', r == '\r', r == '\n':
		default:
			c = o2P
		}
		return c, size
	case unicode.Is(hfCatLl, r):
		c = o2W
	case unicode.Is(hfCatLu, r), unicode.Is(hfCatLt, r):
		c = o2U
	case unicode.Is(hfCatLm, r), unicode.Is(hfCatLo, r), unicode.Is(hfCatM, r):
		c = o2U | o2W
		if !unicode.Is(hfLetter, r) && !unicode.Is(hfNumber, r) {
			c |= o2P // marks are not letters
		}
	case !unicode.Is(hfLetter, r) && !unicode.Is(hfNumber, r):
		c = o2P
	}
	return c, size
}

// o200kRun returns the end of the run of runes from i whose o200k class has a bit of want.
func o200kRun(s string, i int, want uint8) int {
	for i < len(s) {
		c, size := o200kClass(s, i)
		if c&want == 0 {
			break
		}
		i += size
	}
	return i
}

// o200kContraction extends a letter match ending at e by (?i:'s|'t|'re|'ve|'m|'ll|'d)?.
func o200kContraction(s string, e int) int {
	if e < len(s) && s[e] == '\'' {
		if c := contraction(s, e, true); c >= 0 {
			return c
		}
	}
	return e
}

// o200kNext is the match end at i of the o200k pattern.
func o200kNext(s string, i int) int {
	c0, size0 := o200kClass(s, i)
	// [^\r\n\p{L}\p{N}]?U*W+(contraction)?: with the optional character first, then without.
	for _, prefix := range []bool{true, false} {
		q := i
		if prefix {
			if c0&o2P == 0 {
				continue
			}
			q += size0
		}
		runEnd := o200kRun(s, q, o2U)
		if runEnd < len(s) {
			if c, _ := o200kClass(s, runEnd); c&o2W != 0 {
				return o200kContraction(s, o200kRun(s, runEnd, o2W))
			}
		}
		// Give back U characters until one of them is also a W character.
		for pos := runEnd; pos > q; {
			r, size := utf8.DecodeLastRuneInString(s[q:pos])
			if c, _ := o200kClass(string(r), 0); c&o2W != 0 {
				return o200kContraction(s, pos)
			}
			pos -= size
		}
	}
	// [^\r\n\p{L}\p{N}]?U+W*(contraction)?
	for _, prefix := range []bool{true, false} {
		q := i
		if prefix {
			if c0&o2P == 0 {
				continue
			}
			q += size0
		}
		runEnd := o200kRun(s, q, o2U)
		if runEnd == q {
			continue
		}
		return o200kContraction(s, o200kRun(s, runEnd, o2W))
	}
	c, size := classAt(s, i)
	// \p{N}{1,3}
	if c&clsN != 0 {
		e := i + size
		for n := 1; n < 3 && e < len(s); n++ {
			c2, size2 := classAt(s, e)
			if c2&clsN == 0 {
				break
			}
			e += size2
		}
		return e
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n/]*
	p := i
	if s[i] == ' ' {
		p++
	}
	if p < len(s) {
		if c2, _ := classAt(s, p); c2&(clsS|clsL|clsN) == 0 {
			e := runOfNot(s, p, clsS|clsL|clsN)
			for e < len(s) && (s[e] == '\r' || s[e] == '\n' || s[e] == '/') {
				e++
			}
			return e
		}
	}
	j := runOf(s, i, clsS)
	for k := j - 1; k >= i; k-- {
		if s[k] == '\r' || s[k] == '\n' {
			return k + 1
		}
	}
	return whitespaceTail(s, i, j)
}

// gapScanner adapts a "match end at i, or -1" function to the matcher interface, for
// patterns that do not match at every position.
type gapScanner struct {
	next func(s string, i int) int
}

func (m gapScanner) findAll(s string, dst []span) []span {
	for i := 0; i < len(s); {
		if e := m.next(s, i); e > i {
			dst = append(dst, span{i, e})
			i = e
			continue
		}
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
	}
	return dst
}

// digitsNext matches \p{N}{1,3}.
func digitsNext(s string, i int) int {
	e := i
	for n := 0; n < 3 && e < len(s); n++ {
		c, size := classAt(s, e)
		if c&clsN == 0 {
			break
		}
		e += size
	}
	if e == i {
		return -1
	}
	return e
}

func isDeepseekCJK(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FA5) || (r >= 0x3040 && r <= 0x309F) || (r >= 0x30A0 && r <= 0x30FF)
}

// cjkNext matches [一-龥぀-ゟ゠-ヿ]+.
func cjkNext(s string, i int) int {
	e := i
	for e < len(s) {
		r, size := utf8.DecodeRuneInString(s[e:])
		if !isDeepseekCJK(r) {
			break
		}
		e += size
	}
	if e == i {
		return -1
	}
	return e
}

// Classes of DeepSeek-V3's main pattern.
const (
	dsL     = 1 << iota // \p{L}
	dsM                 // \p{M}
	dsP                 // \p{P}
	dsS                 // \p{S}
	dsSpace             // \s
	dsCRLF              // [\r\n]
)

func deepseekClass(s string, i int) (uint8, int) {
	r, size := rune(s[i]), 1
	if r >= utf8.RuneSelf {
		r, size = utf8.DecodeRuneInString(s[i:])
	}
	var c uint8
	switch {
	case unicode.Is(hfLetter, r):
		c = dsL
	case unicode.Is(hfCatM, r):
		c = dsM
	case unicode.Is(hfCatP, r):
		c = dsP
	case unicode.Is(hfCatS, r):
		c = dsS
	case unicode.Is(hfSpace, r):
		c = dsSpace
		if r == '\r' || r == '\n' {
			c |= dsCRLF
		}
	}
	return c, size
}

func deepseekRun(s string, i int, want uint8) int {
	for i < len(s) {
		c, size := deepseekClass(s, i)
		if c&want == 0 {
			break
		}
		i += size
	}
	return i
}

func isASCIIPunct(b byte) bool {
	return (b >= '!' && b <= '/') || (b >= ':' && b <= '@') || (b >= '[' && b <= '`') || (b >= '{' && b <= '~')
}

func isASCIILetter(b byte) bool { return (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') }

// deepseekNext is the match end at i of DeepSeek-V3's main pattern, or -1.
func deepseekNext(s string, i int) int {
	// [ASCII punctuation][A-Za-z]+
	if isASCIIPunct(s[i]) && i+1 < len(s) && isASCIILetter(s[i+1]) {
		e := i + 1
		for e < len(s) && isASCIILetter(s[e]) {
			e++
		}
		return e
	}
	c, size := deepseekClass(s, i)
	// [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
	if c&(dsCRLF|dsL|dsP|dsS) == 0 && i+size < len(s) {
		if c2, _ := deepseekClass(s, i+size); c2&(dsL|dsM) != 0 {
			return deepseekRun(s, i+size, dsL|dsM)
		}
	}
	if c&(dsL|dsM) != 0 {
		return deepseekRun(s, i, dsL|dsM)
	}
	//  ?[\p{P}\p{S}]+[\r\n]*
	p := i
	if s[i] == ' ' && i+1 < len(s) {
		if c2, _ := deepseekClass(s, i+1); c2&(dsP|dsS) != 0 {
			p = i + 1
		}
	}
	if c2, _ := deepseekClass(s, p); c2&(dsP|dsS) != 0 {
		e := deepseekRun(s, p, dsP|dsS)
		for e < len(s) && (s[e] == '\r' || s[e] == '\n') {
			e++
		}
		return e
	}
	if c&dsSpace == 0 {
		return -1
	}
	j := deepseekRun(s, i, dsSpace)
	for k := j - 1; k >= i; k-- {
		if s[k] == '\r' || s[k] == '\n' {
			return k + 1
		}
	}
	return whitespaceTail(s, i, j)
}
