package tokenizer

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// bpe is the BPE model of Hugging Face tokenizers.
type bpe struct {
	vocab  map[string]int32
	merges map[uint64]mergeRule // key: left id << 32 | right id

	continuingPrefix string
	endSuffix        string
	ignoreMerges     bool
	byteFallback     bool
	fuseUnk          bool
	unkID            int32 // -1: no unknown token

	// Fast path for byte-level pre-tokenized words (no prefix or suffix): the id of each
	// byte's byte-level character (-1 when absent), and the vocabulary keyed by raw bytes.
	byteID   [256]int32
	rawVocab map[string]int32

	// fallbackID holds the ids of the byte fallback tokens "<0x00>".."<0xFF>" (-1 if absent).
	fallbackID [256]int32
}

type mergeRule struct{ rank, id int32 }

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// buildByteLevelTables fills byteID and rawVocab.
func (m *bpe) buildByteLevelTables() {
	for b := 0; b < 256; b++ {
		m.byteID[b] = -1
		if id, ok := m.vocab[byteToStr[b]]; ok {
			m.byteID[b] = id
		}
	}
	if !m.ignoreMerges {
		return
	}
	m.rawVocab = make(map[string]int32, len(m.vocab))
	var buf []byte
	for tok, id := range m.vocab {
		buf = buf[:0]
		ok := true
		for _, r := range tok {
			b, in := runeToByte[r]
			if !in {
				ok = false
				break
			}
			buf = append(buf, b)
		}
		if ok {
			m.rawVocab[string(buf)] = id
		}
	}
}

// symbol is one element of a word being merged: a doubly linked list in a slice.
type symbol struct {
	id         int32
	prev, next int32
	start, end int32 // bytes of the word the symbol covers
	alive      bool
}

// mergeCand is a candidate merge of the symbol at pos with its right neighbour into id.
// key packs (rank, pos) so that candidates order by rank, then position (Hugging Face's Merge
// ordering) with one comparison.
type mergeCand struct {
	key uint64
	id  int32
}

func newCand(rank, pos, id int32) mergeCand {
	return mergeCand{uint64(uint32(rank))<<32 | uint64(uint32(pos)), id}
}

func (c mergeCand) pos() int32 { return int32(uint32(c.key)) }

type bpeScratch struct {
	syms []symbol
	heap []mergeCand
	// With wantSpans set, tokenize and tokenizeRaw append each token's byte range of the
	// word to spans.
	wantSpans bool
	spans     [][2]int32
}

func (c mergeCand) less(o mergeCand) bool { return c.key < o.key }

func (s *bpeScratch) push(c mergeCand) {
	h := append(s.heap, c)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h[i].less(h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	s.heap = h
}

func (s *bpeScratch) pop() mergeCand {
	h := s.heap
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h[r].less(h[l]) {
			m = r
		}
		if !h[m].less(h[i]) {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	s.heap = h
	return top
}

// mergeAll applies merges to sc.syms (Word::merge_all) and appends the ids to dst.
func (m *bpe) mergeAll(sc *bpeScratch, dst []int32) []int32 {
	syms := sc.syms
	if len(syms) == 1 {
		sc.span(syms[0].start, syms[0].end)
		return append(dst, syms[0].id)
	}
	sc.heap = sc.heap[:0]
	for i := 0; i+1 < len(syms); i++ {
		if r, ok := m.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
			sc.push(newCand(r.rank, int32(i), r.id))
		}
	}
	for len(sc.heap) > 0 {
		top := sc.pop()
		pos := top.pos()
		cur := &syms[pos]
		if !cur.alive || cur.next < 0 {
			continue
		}
		nextPos := cur.next
		right := syms[nextPos]
		r, ok := m.merges[pairKey(cur.id, right.id)]
		if !ok || r.id != top.id {
			continue
		}
		cur.id = top.id
		cur.end = right.end
		cur.next = right.next
		syms[nextPos].alive = false
		if right.next >= 0 {
			syms[right.next].prev = pos
		}
		if cur.prev >= 0 {
			if r, ok := m.merges[pairKey(syms[cur.prev].id, cur.id)]; ok {
				sc.push(newCand(r.rank, cur.prev, r.id))
			}
		}
		if cur.next >= 0 {
			if r, ok := m.merges[pairKey(cur.id, syms[cur.next].id)]; ok {
				sc.push(newCand(r.rank, top.pos(), r.id))
			}
		}
	}
	for i := range syms {
		if syms[i].alive {
			dst = append(dst, syms[i].id)
			sc.span(syms[i].start, syms[i].end)
		}
	}
	return dst
}

func (sc *bpeScratch) span(start, end int32) {
	if sc.wantSpans {
		sc.spans = append(sc.spans, [2]int32{start, end})
	}
}

func (sc *bpeScratch) reset() { sc.syms = sc.syms[:0] }

func (sc *bpeScratch) add(id int32, start, end int) {
	n := int32(len(sc.syms))
	prev := n - 1
	if n > 0 {
		sc.syms[n-1].next = n
	}
	sc.syms = append(sc.syms, symbol{id: id, prev: prev, next: -1, start: int32(start), end: int32(end), alive: true})
}

// tokenizeRaw encodes a word given as raw bytes that a final ByteLevel pre-tokenizer would
// have mapped to the byte-level alphabet. Only valid when the model has no
// continuing_subword_prefix or end_of_word_suffix.
func (m *bpe) tokenizeRaw(word string, sc *bpeScratch, dst []int32) []int32 {
	if word == "" {
		return dst
	}
	if m.ignoreMerges {
		if id, ok := m.rawVocab[word]; ok {
			sc.span(0, int32(len(word)))
			return append(dst, id)
		}
	}
	sc.reset()
	unk := unkRun{id: -1}
	for i := 0; i < len(word); i++ {
		id := m.byteID[word[i]]
		if id >= 0 {
			unk.flush(sc)
			sc.add(id, i, i+1)
			continue
		}
		m.missing(byteToStr[word[i]], i, i+1, &unk, sc)
	}
	unk.flush(sc)
	if len(sc.syms) == 0 {
		return dst
	}
	return m.mergeAll(sc, dst)
}

// tokenize encodes a word given as a string of model characters (BPE::tokenize).
func (m *bpe) tokenize(word string, sc *bpeScratch, dst []int32) []int32 {
	if word == "" {
		return dst
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[word]; ok {
			sc.span(0, int32(len(word)))
			return append(dst, id)
		}
	}
	sc.reset()
	unk := unkRun{id: -1}
	var b strings.Builder
	for i := 0; i < len(word); {
		_, size := utf8.DecodeRuneInString(word[i:])
		s := word[i : i+size]
		first, last := i == 0, i+size == len(word)
		if (!first && m.continuingPrefix != "") || (last && m.endSuffix != "") {
			b.Reset()
			if !first {
				b.WriteString(m.continuingPrefix)
			}
			b.WriteString(s)
			if last {
				b.WriteString(m.endSuffix)
			}
			s = b.String()
		}
		if id, ok := m.vocab[s]; ok {
			unk.flush(sc)
			sc.add(id, i, i+size)
		} else {
			m.missing(s, i, i+size, &unk, sc)
		}
		i += size
	}
	unk.flush(sc)
	if len(sc.syms) == 0 {
		return dst
	}
	return m.mergeAll(sc, dst)
}

// unkRun is a pending unknown-token symbol (fused runs of unknown characters) and the bytes
// it covers.
type unkRun struct {
	id         int32
	start, end int
}

func (u *unkRun) flush(sc *bpeScratch) {
	if u.id >= 0 {
		sc.add(u.id, u.start, u.end)
		u.id = -1
	}
}

// missing handles the character s (bytes [start, end) of the word) that is not in the
// vocabulary: byte fallback tokens "<0xXX>" when enabled and all present, else the unknown
// token, else nothing (Hugging Face drops such characters silently when the model has no
// unk_token).
func (m *bpe) missing(s string, start, end int, unk *unkRun, sc *bpeScratch) {
	if m.byteFallback {
		ok := true
		for i := 0; i < len(s) && ok; i++ {
			ok = m.fallbackID[s[i]] >= 0
		}
		if ok {
			// As in Hugging Face, a pending unknown token is not flushed first. Each byte
			// token covers its byte of the character (all of it when the model's string for
			// the character is longer, with a prefix or suffix).
			for i := 0; i < len(s); i++ {
				a, b := min(start+i, end-1), min(start+i+1, end)
				if i == len(s)-1 {
					b = end
				}
				sc.add(m.fallbackID[s[i]], a, b)
			}
			return
		}
	}
	if m.unkID < 0 {
		return
	}
	if unk.id >= 0 && m.fuseUnk {
		unk.end = end
		return
	}
	unk.flush(sc)
	*unk = unkRun{id: m.unkID, start: start, end: end}
}

// buildFallbackTable fills fallbackID.
func (m *bpe) buildFallbackTable() {
	for b := 0; b < 256; b++ {
		m.fallbackID[b] = -1
		if id, ok := m.vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.fallbackID[b] = id
		}
	}
}
