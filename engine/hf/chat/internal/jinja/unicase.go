package jinja

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Python's str.upper, lower, title and capitalize use Unicode's full case mappings, where a
// few characters map to several (ß upper-cases to SS); Go's unicode package has only the
// one-to-one mappings. These tables hold the full mappings that differ, for the characters
// text in chat templates is likely to contain.
var (
	upperSpecial = map[rune]string{'ß': "SS", 'ŉ': "ʼN", 'ﬀ': "FF", 'ﬁ': "FI", 'ﬂ': "FL", 'ﬃ': "FFI", 'ﬄ': "FFL", 'ﬅ': "ST", 'ﬆ': "ST"}
	titleSpecial = map[rune]string{'ß': "Ss", 'ŉ': "ʼN", 'ﬀ': "Ff", 'ﬁ': "Fi", 'ﬂ': "Fl", 'ﬃ': "Ffi", 'ﬄ': "Ffl", 'ﬅ': "St", 'ﬆ': "St"}
	lowerSpecial = map[rune]string{'İ': "i\u0307"}
)

func mapFull(s string, special map[rune]string, simple func(rune) rune) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		if m, ok := special[r]; ok {
			b.WriteString(m)
		} else {
			b.WriteRune(simple(r))
		}
	}
	return b.String()
}

func pyUpper(s string) string { return mapFull(s, upperSpecial, unicode.ToUpper) }
func pyLower(s string) string { return mapFull(s, lowerSpecial, unicode.ToLower) }

func pyTitleRune(r rune) string {
	if m, ok := titleSpecial[r]; ok {
		return m
	}
	return string(unicode.ToTitle(r))
}

func pyUpperRune(r rune) string {
	if m, ok := upperSpecial[r]; ok {
		return m
	}
	return string(unicode.ToUpper(r))
}

// pyCapitalize is Python's str.capitalize: the first character in title case, the rest lower.
func pyCapitalize(s string) string {
	if s == "" {
		return s
	}
	r, n := utf8.DecodeRuneInString(s)
	return pyTitleRune(r) + pyLower(s[n:])
}

// pyTitle is Python's str.title: a cased character after an uncased one is title-cased,
// others lower-cased.
func pyTitle(s string) string {
	var b strings.Builder
	prevCased := false
	for _, r := range s {
		if prevCased {
			if m, ok := lowerSpecial[r]; ok {
				b.WriteString(m)
			} else {
				b.WriteRune(unicode.ToLower(r))
			}
		} else {
			b.WriteString(pyTitleRune(r))
		}
		prevCased = isCased(r)
	}
	return b.String()
}

// pySwapcase is Python's str.swapcase.
func pySwapcase(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case unicode.IsUpper(r):
			if m, ok := lowerSpecial[r]; ok {
				b.WriteString(m)
			} else {
				b.WriteRune(unicode.ToLower(r))
			}
		case unicode.IsLower(r):
			b.WriteString(pyUpperRune(r))
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
