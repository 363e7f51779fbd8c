package tokenizer

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
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
type regexMatcher struct {
	src string
	re  *regexp2.Regexp
}

func compileRegex(src string) (*regexMatcher, error) {
	re, err := regexp2.Compile(src, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("regular expression %q does not compile: %v", src, err)
	}
	return &regexMatcher{src: src, re: re}, nil
}

func (m *regexMatcher) findAll(s string, dst []span) []span {
	if s == "" {
		return dst
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
		if err != nil || mt == nil {
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
	return dst
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
// and calls emit for every non-empty resulting piece. invert swaps matches and the text
// between them (Split's `invert`).
func splitBy(s string, m matcher, behavior splitBehavior, invert bool, scratch *[]span, emit func(string)) {
	if s == "" {
		return
	}
	matches := m.findAll(s, (*scratch)[:0])
	*scratch = matches
	if behavior == behaviorIsolated {
		// Every match and every gap between matches is its own piece.
		prev := 0
		for _, mt := range matches {
			if prev < mt.start {
				emit(s[prev:mt.start])
			}
			if mt.start < mt.end {
				emit(s[mt.start:mt.end])
			}
			prev = mt.end
		}
		if prev < len(s) {
			emit(s[prev:])
		}
		return
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
			emit(s[o.start:o.end])
		}
	}
}
