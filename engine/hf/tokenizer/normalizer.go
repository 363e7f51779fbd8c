package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites text before pre-tokenization (Hugging Face's Normalizer).
type normalizer interface {
	normalize(s string) string
}

type unicodeNormalizer struct{ form norm.Form }

// normalize applies the normalization form with Hugging Face's (older) Unicode data: the
// characters of hfNormOpaque are unassigned there, so they stay as they are and act as
// starters that nothing reorders or composes across.
func (n unicodeNormalizer) normalize(s string) string {
	start := 0
	var b strings.Builder
	for i, r := range s {
		if r < 0x7FD || !unicode.Is(hfNormOpaque, r) {
			continue
		}
		if b.Len() == 0 {
			b.Grow(len(s) + 16)
		}
		b.WriteString(n.form.String(s[start:i]))
		size := utf8.RuneLen(r)
		b.WriteString(s[i : i+size])
		start = i + size
	}
	if start == 0 {
		return n.form.String(s)
	}
	b.WriteString(n.form.String(s[start:]))
	return b.String()
}

type lowercaseNormalizer struct{}

// normalize lowercases rune by rune with Hugging Face's mapping (Rust's char::to_lowercase,
// hfLower): U+0130 becomes "i\u0307"; there is no final-sigma rule.
func (lowercaseNormalizer) normalize(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		if lo, ok := hfLower[r]; ok {
			b.WriteString(lo)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

type stripNormalizer struct{ left, right bool }

func (n stripNormalizer) normalize(s string) string {
	if n.left {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	if n.right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s
}

type stripAccentsNormalizer struct{}

func (stripAccentsNormalizer) normalize(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.Is(hfMark, r) {
			return -1
		}
		return r
	}, s)
}

type prependNormalizer struct{ prefix string }

func (n prependNormalizer) normalize(s string) string {
	if s == "" {
		return s
	}
	return n.prefix + s
}

type replaceNormalizer struct {
	m       matcher
	content string
}

func (n replaceNormalizer) normalize(s string) string {
	out, _ := n.normalizeErr(s)
	return out
}

func (n replaceNormalizer) normalizeErr(s string) (string, error) {
	return replaceAll(s, n.m, n.content)
}

// errNormalizer is a normalizer whose regular expression may run past its match time:
// normalize then returns the text with the replacements made before, normalizeErr also the
// error.
type errNormalizer interface {
	normalizeErr(s string) (string, error)
}

// normalizeText normalizes s with n and returns the error of a regular expression that ran
// past its match time.
func normalizeText(n normalizer, s string) (string, error) {
	if e, ok := n.(errNormalizer); ok {
		return e.normalizeErr(s)
	}
	return n.normalize(s), nil
}

// replaceAll replaces every match of m in s by content. When a match runs past its time the
// text after the matches found so far is left as it is, and the error returned.
func replaceAll(s string, m matcher, content string) (string, error) {
	matches, err := find(m, s, nil)
	if len(matches) == 0 {
		return s, err
	}
	var b strings.Builder
	prev := 0
	for _, mt := range matches {
		b.WriteString(s[prev:mt.start])
		b.WriteString(content)
		prev = mt.end
	}
	b.WriteString(s[prev:])
	return b.String(), err
}

type byteLevelNormalizer struct{}

func (byteLevelNormalizer) normalize(s string) string { return byteLevelEncode(s) }

type sequenceNormalizer []normalizer

func (seq sequenceNormalizer) normalize(s string) string {
	out, _ := seq.normalizeErr(s)
	return out
}

func (seq sequenceNormalizer) normalizeErr(s string) (string, error) {
	var first error
	for _, n := range seq {
		var err error
		s, err = normalizeText(n, s)
		if first == nil {
			first = err
		}
	}
	return s, first
}

// patternJSON is Hugging Face's SplitPattern / ReplacePattern: {"String": ...} or {"Regex": ...}.
type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

func (p *patternJSON) compile() (matcher, error) {
	switch {
	case p == nil:
		return nil, fmt.Errorf("pattern is missing; want {\"String\": ...} or {\"Regex\": ...}")
	case p.String != nil:
		return literalMatcher{*p.String}, nil
	case p.Regex != nil:
		if m := fastScanner(*p.Regex); m != nil {
			return m, nil
		}
		return compileRegex(*p.Regex)
	}
	return nil, fmt.Errorf("pattern has neither \"String\" nor \"Regex\"")
}

// maxNesting bounds how deeply Sequence components may nest.
const maxNesting = 32

func parseNormalizer(raw json.RawMessage, path string, depth int) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	if depth > maxNesting {
		return nil, fmt.Errorf("%s: Sequence nested deeper than %d", path, maxNesting)
	}
	var head struct {
		Type        string            `json:"type"`
		Normalizers []json.RawMessage `json:"normalizers"`
		Left        *bool             `json:"strip_left"`
		Right       *bool             `json:"strip_right"`
		Prepend     *string           `json:"prepend"`
		Pattern     *patternJSON      `json:"pattern"`
		Content     *string           `json:"content"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	switch head.Type {
	case "NFC":
		return unicodeNormalizer{norm.NFC}, nil
	case "NFD":
		return unicodeNormalizer{norm.NFD}, nil
	case "NFKC":
		return unicodeNormalizer{norm.NFKC}, nil
	case "NFKD":
		return unicodeNormalizer{norm.NFKD}, nil
	case "Lowercase":
		return lowercaseNormalizer{}, nil
	case "StripAccents":
		return stripAccentsNormalizer{}, nil
	case "ByteLevel":
		return byteLevelNormalizer{}, nil
	case "Strip":
		n := stripNormalizer{true, true}
		if head.Left != nil {
			n.left = *head.Left
		}
		if head.Right != nil {
			n.right = *head.Right
		}
		return n, nil
	case "Prepend":
		if head.Prepend == nil {
			return nil, fmt.Errorf("%s: Prepend has no \"prepend\" string", path)
		}
		return prependNormalizer{*head.Prepend}, nil
	case "Replace":
		m, err := head.Pattern.compile()
		if err != nil {
			return nil, fmt.Errorf("%s: Replace: %w", path, err)
		}
		if head.Content == nil {
			return nil, fmt.Errorf("%s: Replace has no \"content\" string", path)
		}
		return replaceNormalizer{m, *head.Content}, nil
	case "Sequence":
		var seq sequenceNormalizer
		for i, r := range head.Normalizers {
			n, err := parseNormalizer(r, fmt.Sprintf("%s.normalizers[%d]", path, i), depth+1)
			if err != nil {
				return nil, err
			}
			if n != nil {
				seq = append(seq, n)
			}
		}
		return seq, nil
	case "":
		return nil, fmt.Errorf("%s: no \"type\"", path)
	}
	return nil, fmt.Errorf("%s: normalizer type %q is not supported; supported: NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Prepend, Replace, ByteLevel, Sequence", path, head.Type)
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}
