package tokenizer

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"

	"github.com/halo-shell/halo-shell/internal/switches"
)

// span is a half-open byte range [start, end) of a string.
type span struct{ start, end int }

// matcher finds the non-overlapping matches of a pattern in s, left to right, and appends
// them to dst. It mirrors the Pattern trait of Hugging Face tokenizers.
type matcher interface {
	findAll(s string, dst []span) []span
}

// literalMatcher matches a fixed string (SplitPattern::String / ReplacePattern::String).
type literalMatcher struct{ lit string }

func (m literalMatcher) findAll(s string, dst []span) []span {
	if m.lit == "" {
		return dst
	}
	off := 0
	for {
		i := strings.Index(s[off:], m.lit)
		if i < 0 {
			return dst
		}
		dst = append(dst, span{off + i, off + i + len(m.lit)})
		off += i + len(m.lit)
	}
}

// runeMatcher matches every single rune for which pred is true (Hugging Face's
// `impl Pattern for F: Fn(char) -> bool`): each rune is its own match.
type runeMatcher struct{ pred func(rune) bool }

func (m runeMatcher) findAll(s string, dst []span) []span {
	for i, r := range s {
		if m.pred(r) {
			dst = append(dst, span{i, i + utf8.RuneLen(r)})
		}
	}
	return dst
}

// regexMatcher runs a regular expression with Oniguruma-like semantics (the engine Hugging
// Face tokenizers uses): backtracking, lookaround, Unicode classes. The fast scanners in
// scan.go replace it for the pre-tokenizer patterns of the GPT-2, Llama-3 and Qwen2 families.
//
// A backtracking engine can take time exponential in the text on some patterns ((a+)+$ on
// forty a and a !). compileRegex refuses a pattern that does so on a set of probe texts made
// from its own characters, and every match runs under matchTimeout, past which find returns
// a *MatchTimeoutError.
type regexMatcher struct {
	src string
	re  *regexp2.Regexp
}

var swMatchTimeout = switches.Register(switches.Switch{Name: "HALO_TOKENIZER_MATCH_TIMEOUT", Kind: switches.Tuning,
	Default: "5s",
	Doc:     "Longest time one match of a tokenizer.json regular expression may take (a Go duration) before encoding fails with the pattern named."})

// matchTimeout is HALO_TOKENIZER_MATCH_TIMEOUT, or its default when the value does not parse.
func matchTimeout() time.Duration {
	if d, err := time.ParseDuration(swMatchTimeout.Value()); err == nil && d > 0 {
		return d
	}
	return 5 * time.Second
}

// probeTimeout bounds one match of a probe text at load. Probe texts are 49 characters long;
// a pattern that needs this long on one of them backtracks catastrophically.
const probeTimeout = 250 * time.Millisecond

// MatchTimeoutError is a regular expression of a tokenizer that ran past its match time,
// at load on a probe text or while encoding.
type MatchTimeoutError struct {
	// Pattern is the regular expression as tokenizer.json writes it.
	Pattern string
	// Timeout is the match time it ran past.
	Timeout time.Duration
	// Text is the text it was matching (shortened) and Len that text's length in bytes.
	Text string
	Len  int
	// Probe says that Text is a probe text tried at load.
	Probe bool
}

func (e *MatchTimeoutError) Error() string {
	if e.Probe {
		return fmt.Sprintf("regular expression %q backtracks catastrophically: matching the %d-byte text %q ran past %v (Hugging Face tokenizers would hang on such text); rewrite the pattern without nested or overlapping repetition",
			e.Pattern, e.Len, e.Text, e.Timeout)
	}
	return fmt.Sprintf("tokenizer: regular expression %q ran past its match time of %v on a %d-byte text starting %q (catastrophic backtracking); rewrite the pattern, or raise HALO_TOKENIZER_MATCH_TIMEOUT",
		e.Pattern, e.Timeout, e.Len, e.Text)
}

func shorten(s string) string {
	const n = 32
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "..."
}

func compileRegex(src string) (*regexMatcher, error) {
	re, err := regexp2.Compile(withHFClasses(src), regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("regular expression %q does not compile: %v", src, err)
	}
	probe := &regexMatcher{src: src, re: re}
	re.MatchTimeout = probeTimeout
	for _, text := range probeTexts(src) {
		if _, err := probe.find(text, nil); err != nil {
			var te *MatchTimeoutError
			if errors.As(err, &te) {
				te.Probe = true
			}
			return nil, err
		}
	}
	re.MatchTimeout = matchTimeout()
	return &regexMatcher{src: src, re: re}, nil
}

// probeTexts are the texts a pattern is tried on at load: each character that the pattern
// names literally (and a few of each class: letters, digits, spaces, punctuation, non-ASCII),
// repeated 48 times and followed by a character that may fail the match. Nested or
// overlapping repetition of that character then costs 2^48 steps, which probeTimeout stops.
func probeTexts(src string) []string {
	chars := []rune{'a', 'A', '0', ' ', '\n', '.', '\'', 'é', '中'}
	seen := map[rune]bool{}
	for _, r := range chars {
		seen[r] = true
	}
	for _, r := range src {
		if len(chars) >= 48 {
			break
		}
		if r > ' ' && r < utf8.RuneSelf && !seen[r] && !strings.ContainsRune(`\()[]{}|*+?^$`, r) {
			seen[r] = true
			chars = append(chars, r)
		}
	}
	var out []string
	for _, r := range chars {
		run := strings.Repeat(string(r), 48)
		for _, end := range []string{"!", "\x00", " ", "a"} {
			out = append(out, run+end)
		}
	}
	return out
}

// findAll returns the matches; when a match runs past its time it returns those found
// before (find says why).
func (m *regexMatcher) findAll(s string, dst []span) []span {
	dst, _ = m.find(s, dst)
	return dst
}

// find appends the matches of m in s to dst. When a match runs past the pattern's match
// time it returns the matches found before it and a *MatchTimeoutError.
func (m *regexMatcher) find(s string, dst []span) ([]span, error) {
	if s == "" {
		return dst, nil
	}
	runes := []rune(s)
	// byteAt[i] is the byte offset of rune i; the last entry is len(s).
	var byteAt []int
	ascii := len(runes) == len(s)
	if !ascii {
		byteAt = make([]int, 0, len(runes)+1)
		for i := range s {
			byteAt = append(byteAt, i)
		}
		byteAt = append(byteAt, len(s))
	}
	off := func(i int) int {
		if ascii {
			return i
		}
		return byteAt[i]
	}
	lastEnd, lastMatchEnd := 0, -1
	for lastEnd <= len(runes) {
		mt, err := m.re.FindRunesMatchStartingAt(runes, lastEnd)
		if err != nil {
			// regexp2's error quotes the whole input; say what happened without it.
			return dst, &MatchTimeoutError{Pattern: m.src, Timeout: m.re.MatchTimeout, Text: shorten(s[off(lastEnd):]), Len: len(s)}
		}
		if mt == nil {
			break
		}
		start, end := mt.Index, mt.Index+mt.Length
		if start == end && lastMatchEnd == end {
			// No empty match right after the previous match: step one character on.
			lastEnd++
			continue
		}
		lastEnd, lastMatchEnd = end, end
		dst = append(dst, span{off(start), off(end)})
		if start == end {
			lastEnd++
		}
	}
	return dst, nil
}

// find returns the matches of m in s, and the error of a regular expression that ran past
// its match time (with the matches found before it).
func find(m matcher, s string, dst []span) ([]span, error) {
	if r, ok := m.(*regexMatcher); ok {
		return r.find(s, dst)
	}
	return m.findAll(s, dst), nil
}

// splitBehavior is Hugging Face's SplitDelimiterBehavior.
type splitBehavior int

const (
	behaviorRemoved splitBehavior = iota
	behaviorIsolated
	behaviorMergedWithPrevious
	behaviorMergedWithNext
	behaviorContiguous
)

var behaviorNames = map[string]splitBehavior{
	"Removed":            behaviorRemoved,
	"Isolated":           behaviorIsolated,
	"MergedWithPrevious": behaviorMergedWithPrevious,
	"MergedWithNext":     behaviorMergedWithNext,
	"Contiguous":         behaviorContiguous,
}

// piece is a part of a string with a flag saying whether it was a match of the pattern.
type piece struct {
	span
	match bool
}

// splitBy splits s by the matches of m with the given behaviour (NormalizedString::split)
// and calls emit for every non-empty resulting piece with its byte offset in s. invert swaps
// matches and the text between them (Split's `invert`). When a match runs past its time the
// text after the matches found so far is one piece, and the error is returned.
func splitBy(s string, m matcher, behavior splitBehavior, invert bool, scratch *[]span, emit func(string, int)) error {
	if s == "" {
		return nil
	}
	matches, err := find(m, s, (*scratch)[:0])
	*scratch = matches
	if behavior == behaviorIsolated {
		// Every match and every gap between matches is its own piece.
		prev := 0
		for _, mt := range matches {
			if prev < mt.start {
				emit(s[prev:mt.start], prev)
			}
			if mt.start < mt.end {
				emit(s[mt.start:mt.end], mt.start)
			}
			prev = mt.end
		}
		if prev < len(s) {
			emit(s[prev:], prev)
		}
		return err
	}
	// Cover the whole string: matches and the gaps between them.
	pieces := make([]piece, 0, 2*len(matches)+1)
	prev := 0
	for _, mt := range matches {
		if prev != mt.start {
			pieces = append(pieces, piece{span{prev, mt.start}, invert})
		}
		pieces = append(pieces, piece{mt, !invert})
		prev = mt.end
	}
	if prev != len(s) {
		pieces = append(pieces, piece{span{prev, len(s)}, invert})
	}
	type out struct {
		span
		remove bool
	}
	var outs []out
	switch behavior {
	case behaviorIsolated:
		outs = make([]out, len(pieces))
		for i, p := range pieces {
			outs[i] = out{p.span, false}
		}
	case behaviorRemoved:
		outs = make([]out, len(pieces))
		for i, p := range pieces {
			outs[i] = out{p.span, p.match}
		}
	case behaviorContiguous:
		prevMatch := false
		for _, p := range pieces {
			if p.match == prevMatch && len(outs) > 0 {
				outs[len(outs)-1].end = p.end
			} else {
				outs = append(outs, out{p.span, false})
			}
			prevMatch = p.match
		}
	case behaviorMergedWithPrevious:
		prevMatch := false
		for _, p := range pieces {
			if p.match && !prevMatch && len(outs) > 0 {
				outs[len(outs)-1].end = p.end
			} else {
				outs = append(outs, out{p.span, false})
			}
			prevMatch = p.match
		}
	case behaviorMergedWithNext:
		prevMatch := false
		for i := len(pieces) - 1; i >= 0; i-- {
			p := pieces[i]
			if p.match && !prevMatch && len(outs) > 0 {
				outs[len(outs)-1].start = p.start
			} else {
				outs = append(outs, out{p.span, false})
			}
			prevMatch = p.match
		}
		for i, j := 0, len(outs)-1; i < j; i, j = i+1, j-1 {
			outs[i], outs[j] = outs[j], outs[i]
		}
	}
	for _, o := range outs {
		if !o.remove && o.end > o.start {
			emit(s[o.start:o.end], o.start)
		}
	}
	return err
}

// withHFClasses rewrites \p{X} and \pX for the general categories of hfCategories, \d and \w
// (and their negations outside brackets) as explicit character ranges from Hugging Face's
// tables, so that the regexp2 engine (which uses Go's older Unicode tables) classifies
// characters as Hugging Face does.
func withHFClasses(src string) string {
	var b strings.Builder
	inClass := false
	// fold[k] says whether the k-th open group is case-insensitive.
	fold := []bool{false}
	for i := 0; i < len(src); {
		c := src[i]
		if !inClass {
			top := len(fold) - 1
			switch {
			case strings.HasPrefix(src[i:], "(?i)"):
				fold[top] = true
				b.WriteString("(?i)")
				i += 4
				continue
			case c == '(':
				f := fold[top]
				n := 1
				if strings.HasPrefix(src[i+1:], "?") {
					// Copy the group header ("(?:", "(?i:", "(?=", "(?<name>", ...) verbatim.
					n = 2
					for i+n < len(src) && !strings.ContainsRune(":=!>)", rune(src[i+n])) {
						n++
					}
					if i+n < len(src) && src[i+n] != ')' {
						n++
					}
					switch {
					case strings.HasPrefix(src[i:], "(?i:"):
						f = true
					case strings.HasPrefix(src[i:], "(?-i:"):
						f = false
					}
				}
				fold = append(fold, f)
				b.WriteString(src[i : i+n])
				i += n
				continue
			case c == ')' && len(fold) > 1:
				fold = fold[:top]
			}
			// Oniguruma's case folding also matches U+017F (long s) for s and U+212A (Kelvin
			// sign) for k; regexp2's does not.
			if fold[len(fold)-1] {
				switch c {
				case 's', 'S':
					b.WriteString("[sSſ]")
					i++
					continue
				case 'k', 'K':
					b.WriteString("[kK\u212A]")
					i++
					continue
				}
			}
		}
		if c == '\\' && i+1 < len(src) {
			name, n := unicodeClassAt(src, i)
			negated := src[i+1] == 'P'
			switch src[i+1] {
			case 'd', 'D', 'w', 'W':
				name, n = strings.ToLower(src[i+1:i+2]), 2
				negated = src[i+1] == 'D' || src[i+1] == 'W'
			}
			if table := hfClassTable(name); table != nil && n > 0 {
				switch {
				case inClass && !negated:
					writeRanges(&b, table)
				case !inClass && !negated:
					b.WriteByte('[')
					writeRanges(&b, table)
					b.WriteByte(']')
				case !inClass && negated:
					b.WriteString("[^")
					writeRanges(&b, table)
					b.WriteByte(']')
				default:
					b.WriteString(src[i : i+n])
				}
				i += n
				continue
			}
			b.WriteString(src[i : i+2])
			i += 2
			continue
		}
		switch {
		case c == '[' && !inClass:
			inClass = true
			b.WriteByte(c)
			i++
			// A ']' right after '[' or '[^' is a literal.
			if i < len(src) && src[i] == '^' {
				b.WriteByte('^')
				i++
			}
			if i < len(src) && src[i] == ']' {
				b.WriteByte(']')
				i++
			}
			continue
		case c == ']' && inClass:
			inClass = false
		}
		b.WriteByte(c)
		i++
	}
	return b.String()
}

// unicodeClassAt parses \p{X}, \pX, \P{X} or \PX at src[i] and returns X and the length.
func unicodeClassAt(src string, i int) (string, int) {
	if i+2 >= len(src) || (src[i+1] != 'p' && src[i+1] != 'P') {
		return "", 0
	}
	if src[i+2] != '{' {
		return src[i+2 : i+3], 3
	}
	end := strings.IndexByte(src[i+3:], '}')
	if end < 0 {
		return "", 0
	}
	return src[i+3 : i+3+end], end + 4
}

func hfClassTable(name string) *unicode.RangeTable {
	switch name {
	case "d":
		return hfDigit
	case "w":
		return hfWord
	}
	return hfCategories[name]
}

func writeRanges(b *strings.Builder, t *unicode.RangeTable) {
	lit := func(r rune) {
		if strings.ContainsRune(`\]^-[`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	w := func(lo, hi rune) {
		lit(lo)
		if hi > lo {
			b.WriteByte('-')
			lit(hi)
		}
	}
	for _, r := range t.R16 {
		w(rune(r.Lo), rune(r.Hi))
	}
	for _, r := range t.R32 {
		w(rune(r.Lo), rune(r.Hi))
	}
}
