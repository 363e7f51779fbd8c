package tokenizer

import (
	"log/slog"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// EncodeOffsets returns the ids of text, as Encode does (a pattern past its match time is
// handled as there), and for each token the byte range
// [start, end) of text it comes from (the chat package uses them to mask assistant tokens).
//
// Ranges are exact where the normalizer leaves the text as it is or changes it character by
// character (NFC, Lowercase, ...): a token that holds part of a character's bytes gets those
// bytes; a token for characters the model drops or replaces (unknown token, byte fallback)
// covers exactly those characters. An added token's range includes the whitespace its
// lstrip/rstrip removed. A space or replacement character that ByteLevel or Metaspace
// prepended shares the range of the character it was put in front of. Where exact ranges are
// not known (a normalizer that works across characters, such as Prepend or a Replace spanning
// characters; a ByteLevel step before another pre-tokenizer step; Metaspace on text that
// already holds its replacement character) every token of the affected piece gets the piece's
// whole range. Ranges never decrease. For text with invalid UTF-8 they refer to the text after
// each invalid byte run was replaced by U+FFFD.
//
// Hugging Face reports offsets in characters; these are bytes. Where Hugging Face's own
// offsets are known to drift (after characters a model drops) these keep true positions.
func (t *Tokenizer) EncodeOffsets(text string) ([]int, [][2]int) {
	if !utf8.ValidString(text) {
		text = strings.ToValidUTF8(text, "\uFFFD")
	}
	sc := t.getScratch()
	sc.bpe.wantSpans = true
	defer func() {
		if sc.err != nil {
			err := sc.err
			t.timeoutOnce.Do(func() {
				slog.Warn("tokenizer: encoding went on without a pattern that ran past its match time; later timeouts are not logged", "err", err)
			})
		}
		sc.bpe.wantSpans, sc.err = false, nil
		t.putScratch(sc)
	}()
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
			ns, err := normalizeText(t.normalizer, s)
			sc.fail(err)
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
				sc.bpe.spans = sc.bpe.spans[:0]
				if t.byteLevelTail {
					ids = t.model.tokenizeRaw(word, &sc.bpe, ids)
				} else {
					ids = t.model.tokenize(word, &sc.bpe, ids)
				}
				offs = t.wordOffsets(word, p, sc.bpe.spans, sub.start, al, offs)
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

// wordOffsets appends the original ranges of the tokens of word, whose byte ranges within
// word are spans; word sits at p within the piece that starts at byte base of the normalized
// segment.
func (t *Tokenizer) wordOffsets(word string, p wordPos, spans [][2]int32, base int, al alignment, offs [][2]int) [][2]int {
	start := base + p.off
	if p.coarse {
		whole := al.span(start, start+p.n)
		for range spans {
			offs = append(offs, whole)
		}
		return offs
	}
	// toInput maps a byte offset of word (past its synthetic bytes) to the input.
	toInput := func(x int) int { return start + x - p.syn }
	if p.repl != "" {
		toInput = func(x int) int { return start + replToInput(word[p.syn:], x-p.syn, p.repl) }
	}
	for _, sp := range spans {
		x, y := int(sp[0]), int(sp[1])
		var a, b int
		if y > p.syn || p.n == 0 {
			a, b = toInput(max(x, p.syn)), toInput(max(y, p.syn))
		} else {
			// Only synthetic bytes: Hugging Face aligns a prepended space (or replacement
			// character) with the first character it was put in front of.
			a, b = start, toInput(p.syn+firstCharLen(word[p.syn:]))
		}
		offs = append(offs, al.span(a, b))
	}
	return offs
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

func firstCharLen(s string) int {
	_, size := utf8.DecodeRuneInString(s)
	return size
}
