package tokenizer

import (
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// EncodeOffsets returns the ids of text, as Encode does, and for each token the byte range
// [start, end) of text it comes from (the chat package uses them to mask assistant tokens).
//
// Ranges are exact where the normalizer leaves the text as it is or changes it character by
// character (NFC, Lowercase, ...): a token that holds part of a character's bytes gets those
// bytes. An added token's range includes the whitespace its lstrip/rstrip removed. A space
// that ByteLevel prepended shares the range of the character it was put in front of. Where
// exact ranges are not known (a normalizer that works across characters, such as Prepend or
// a Replace spanning characters; a ByteLevel step in the middle of the pre-tokenizer) every
// token of the affected piece gets the piece's whole range. Ranges never decrease. For text
// with invalid UTF-8 they refer to the text after each invalid byte run was replaced by
// U+FFFD.
func (t *Tokenizer) EncodeOffsets(text string) ([]int, [][2]int) {
	if !utf8.ValidString(text) {
		text = strings.ToValidUTF8(text, "\uFFFD")
	}
	sc := t.getScratch()
	defer t.putScratch(sc)
	var ids []int32
	var offs [][2]int
	segs := []segment{{text, -1, 0, len(text)}}
	if !t.added.raw.empty() {
		segs = t.added.findMatches(text, t.added.raw, nil)
	}
	for _, seg := range segs {
		if seg.id >= 0 {
			ids = append(ids, seg.id)
			offs = append(offs, [2]int{seg.start, seg.end})
			continue
		}
		s := seg.text
		al := identityAlignment(seg.start)
		if t.normalizer != nil {
			ns := t.normalizer.normalize(s)
			if ns != s {
				al = t.chunkAlignment(s, ns, seg.start)
			}
			s = ns
		}
		subs := []segment{{s, -1, 0, len(s)}}
		if !t.added.norm.empty() {
			subs = t.added.findMatches(s, t.added.norm, nil)
		}
		for _, sub := range subs {
			if sub.id >= 0 {
				ids = append(ids, sub.id)
				offs = append(offs, al.span(sub.start, sub.end))
				continue
			}
			runSteps(t.steps, sub.text, seg.start == 0 && sub.start == 0, sc, func(word string, p wordPos) {
				n := len(ids)
				ids = t.encodeWord(word, sc, ids)
				offs = t.wordOffsets(word, p, ids[n:], sub.start, al, offs)
			})
		}
	}
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = int(id)
	}
	// Keep ranges monotone (a coarse range may start before an exact one that precedes it).
	for i := 1; i < len(offs); i++ {
		if offs[i][0] < offs[i-1][0] {
			offs[i][0] = offs[i-1][0]
		}
		if offs[i][1] < offs[i][0] {
			offs[i][1] = offs[i][0]
		}
	}
	return out, offs
}

// wordOffsets appends the original ranges of the tokens ids of word, which sits at p within
// the piece that starts at byte base of the normalized segment.
func (t *Tokenizer) wordOffsets(word string, p wordPos, ids []int32, base int, al alignment, offs [][2]int) [][2]int {
	start, end := base+p.off, base+p.off+p.n
	lens := t.tokenLengths(word, p, ids)
	if lens == nil {
		whole := al.span(start, end)
		for range ids {
			offs = append(offs, whole)
		}
		return offs
	}
	pos := start - p.syn // token bytes before start are synthetic
	for _, l := range lens {
		a, b := max(pos, start), max(pos+l, start)
		if b == start && l > 0 && p.n > 0 {
			// Only synthetic bytes: Hugging Face aligns a prepended space with the first
			// character it was put in front of.
			_, size := utf8.DecodeRuneInString(word[p.syn:])
			b = start + size
		}
		offs = append(offs, al.span(a, b))
		pos += l
	}
	return offs
}

// tokenLengths returns how many bytes of word each token covers, or nil when that is not
// known exactly (the lengths must add up to the word).
func (t *Tokenizer) tokenLengths(word string, p wordPos, ids []int32) []int {
	if p.coarse || p.n != len(word)-p.syn {
		return nil
	}
	lens := make([]int, len(ids))
	total := 0
	for i, id := range ids {
		tok, ok := t.idToToken[id]
		if !ok {
			return nil
		}
		var l int
		if t.byteLevelTail {
			// Each rune of a byte-level token is one byte of the word.
			l = utf8.RuneCountInString(tok)
		} else {
			if i > 0 {
				tok = strings.TrimPrefix(tok, t.model.continuingPrefix)
			}
			if i == len(ids)-1 {
				tok = strings.TrimSuffix(tok, t.model.endSuffix)
			}
			l = len(tok)
		}
		lens[i] = l
		total += l
	}
	if total != len(word) {
		return nil
	}
	return lens
}

// alignment maps byte ranges of a normalized segment to the original text: chunk k covers
// normalized bytes [norm[k], norm[k+1]) and original bytes [orig[k], orig[k+1]).
type alignment struct {
	norm, orig []int
	identity   bool
	base       int
}

func identityAlignment(base int) alignment { return alignment{identity: true, base: base} }

// chunkAlignment aligns ns = normalize(s) with s chunk by chunk: s is cut where Unicode
// normalization cannot interact (norm.NFKD boundaries) and each chunk is normalized alone.
// When the chunks do not add up to ns (a normalizer that works across characters) the whole
// segment is one chunk.
func (t *Tokenizer) chunkAlignment(s, ns string, base int) alignment {
	al := alignment{norm: []int{0}, orig: []int{base}, base: base}
	var b strings.Builder
	for i := 0; i < len(s); {
		n := norm.NFKD.NextBoundaryInString(s[i:], true)
		if n <= 0 {
			n = len(s) - i
		}
		b.WriteString(t.normalizer.normalize(s[i : i+n]))
		i += n
		al.norm = append(al.norm, b.Len())
		al.orig = append(al.orig, base+i)
	}
	if b.String() != ns {
		return alignment{norm: []int{0, len(ns)}, orig: []int{base, base + len(s)}, base: base}
	}
	return al
}

// span maps the normalized range [a, b) to the original text.
func (al alignment) span(a, b int) [2]int {
	if al.identity {
		return [2]int{al.base + a, al.base + b}
	}
	return [2]int{al.orig[al.chunk(a, false)], al.orig[al.chunk(b, true)]}
}

// chunk returns the index k of the chunk boundary for normalized byte position x: the start
// of the chunk holding x, or (end) the end of the chunk holding byte x-1.
func (al alignment) chunk(x int, end bool) int {
	// Binary search for the last boundary <= x (or the first boundary >= x when end).
	lo, hi := 0, len(al.norm)-1
	if end {
		for lo < hi {
			mid := (lo + hi) / 2
			if al.norm[mid] >= x {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		return lo
	}
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if al.norm[mid] <= x {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}
