package tokenizer

import (
	"sort"
	"unicode"
	"unicode/utf8"
)

// AddedToken is a token added on top of the model vocabulary (tokenizer.json "added_tokens").
type AddedToken struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// sameFlags reports whether two added tokens are equal apart from their id.
func (a AddedToken) sameFlags(b AddedToken) bool {
	a.ID, b.ID = 0, 0
	return a == b
}

// trie finds added tokens in text: leftmost match first, longest among those starting at
// the same place (aho-corasick's LeftmostLongest, which Hugging Face uses).
type trie struct {
	nodes []trieNode
	first [256]bool
}

type trieNode struct {
	next map[byte]int32
	id   int32 // token id ending here, -1 if none
}

func newTrie() *trie { return &trie{nodes: []trieNode{{id: -1}}} }

func (t *trie) insert(s string, id int32) {
	if s == "" {
		return
	}
	t.first[s[0]] = true
	n := int32(0)
	for i := 0; i < len(s); i++ {
		c := s[i]
		nx, ok := t.nodes[n].next[c]
		if !ok {
			if t.nodes[n].next == nil {
				t.nodes[n].next = map[byte]int32{}
			}
			nx = int32(len(t.nodes))
			t.nodes = append(t.nodes, trieNode{id: -1})
			t.nodes[n].next[c] = nx
		}
		n = nx
	}
	if t.nodes[n].id < 0 {
		t.nodes[n].id = id
	}
}

func (t *trie) empty() bool { return len(t.nodes) == 1 }

// longestAt returns the id and end of the longest token starting at s[i], or id -1.
func (t *trie) longestAt(s string, i int) (id int32, end int) {
	id, n := -1, int32(0)
	for j := i; j < len(s); j++ {
		nx, ok := t.nodes[n].next[s[j]]
		if !ok {
			break
		}
		n = nx
		if t.nodes[n].id >= 0 {
			id, end = t.nodes[n].id, j+1
		}
	}
	return id, end
}

// segment is a part of the input: either text still to encode (id < 0) or an added token.
type segment struct {
	text       string
	id         int32
	start, end int // byte range in the text that was split
}

// addedVocab holds the added tokens and the two tries Hugging Face matches them with: one
// on the raw input (normalized=false) and one on normalized text (normalized=true).
type addedVocab struct {
	byID      map[int32]AddedToken
	byContent map[string]int32
	special   map[string]bool
	raw       *trie
	norm      *trie
}

// wordChar is the \w that single_word tokens check their neighbours against (Unicode's
// word characters: alphabetic, marks, decimal digits, connector punctuation, join controls).
func wordChar(r rune) bool { return unicode.Is(hfSingleWord, r) }

// findMatches splits s on the tokens of t, with single_word, lstrip and rstrip applied as
// in AddedVocabulary::find_matches, and appends the resulting segments to dst.
func (v *addedVocab) findMatches(s string, t *trie, dst []segment) []segment {
	if s == "" {
		return dst
	}
	startOffset := 0
	for i := 0; i < len(s); {
		if !t.first[s[i]] {
			i++
			continue
		}
		id, stop := t.longestAt(s, i)
		if id < 0 {
			i++
			continue
		}
		start := i
		i = stop
		tok := v.byID[id]
		if tok.SingleWord {
			startSpace := start == 0 || !endsWithWord(s[:start])
			stopSpace := stop == len(s) || !startsWithWord(s[stop:])
			if !startSpace || !stopSpace {
				continue
			}
		}
		if tok.LStrip {
			ns := start
			for ns > 0 {
				r, size := lastRune(s[:ns])
				if !unicode.IsSpace(r) {
					break
				}
				ns -= size
			}
			start = max(ns, startOffset)
		}
		if tok.RStrip {
			for stop < len(s) {
				r, size := firstRune(s[stop:])
				if !unicode.IsSpace(r) {
					break
				}
				stop += size
			}
		}
		if startOffset < start {
			dst = append(dst, segment{s[startOffset:start], -1, startOffset, start})
		}
		dst = append(dst, segment{s[start:stop], id, start, stop})
		startOffset = stop
	}
	if startOffset < len(s) {
		dst = append(dst, segment{s[startOffset:], -1, startOffset, len(s)})
	}
	return dst
}

func endsWithWord(s string) bool {
	r, _ := lastRune(s)
	return s != "" && wordChar(r)
}

func startsWithWord(s string) bool {
	r, _ := firstRune(s)
	return s != "" && wordChar(r)
}

// sortedTokens returns the added tokens ordered by id.
func (v *addedVocab) sortedTokens() []AddedToken {
	out := make([]AddedToken, 0, len(v.byID))
	for _, t := range v.byID {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func lastRune(s string) (rune, int)  { return utf8.DecodeLastRuneInString(s) }
func firstRune(s string) (rune, int) { return utf8.DecodeRuneInString(s) }
