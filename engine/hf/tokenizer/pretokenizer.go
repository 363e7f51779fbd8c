package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// gpt2Pattern is the regular expression of the ByteLevel pre-tokenizer with use_regex.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// preStep is one pre-tokenization step: it splits s into pieces and calls emit for each
// non-empty one.
type preStep interface {
	// split splits s; origin says whether s starts at the beginning of the input text.
	split(s string, origin bool, sc *scratch, emit emitFunc)
}

// emitFunc receives a word and where it comes from in the step's input.
type emitFunc func(w string, p wordPos)

// wordPos says where a word comes from: w[syn:] is the input's bytes [off, off+n), after
// syn synthetic bytes (a space ByteLevel prepended). A coarse word was transformed (mapped to
// the byte-level alphabet) and only its whole range [off, off+n) is known.
type wordPos struct {
	off, n, syn int
	coarse      bool
	// repl, when set, says that w[syn:] is the input with every space replaced by repl
	// (Metaspace), rather than a copy of it.
	repl string
}

// scratch is per-call reusable memory for the pre-tokenizer and the BPE merge loop.
type scratch struct {
	spans []span
	bpe   bpeScratch
	// err is the first regular expression of this call that ran past its match time.
	err error
}

// fail records the first error of the call.
func (sc *scratch) fail(err error) {
	if err != nil && sc.err == nil {
		sc.err = err
	}
}

type splitStep struct {
	m        matcher
	behavior splitBehavior
	invert   bool
}

func (p splitStep) split(s string, _ bool, sc *scratch, emit emitFunc) {
	sc.fail(splitBy(s, p.m, p.behavior, p.invert, &sc.spans, func(w string, off int) {
		emit(w, wordPos{off: off, n: len(w)})
	}))
}

// byteLevelStep is the ByteLevel pre-tokenizer. The mapping of bytes to the byte-level
// alphabet is applied here only when mapBytes is set; when ByteLevel is the last step the
// BPE model reads the raw bytes directly (same result, no intermediate strings).
type byteLevelStep struct {
	addPrefixSpace bool
	useRegex       matcher
	mapBytes       bool
}

func (p byteLevelStep) split(s string, _ bool, sc *scratch, emit emitFunc) {
	syn := 0
	if p.addPrefixSpace && len(s) > 0 && s[0] != ' ' {
		s = " " + s
		syn = 1
	}
	out := func(x string, off int) {
		// x is s[off:off+len(x)]; the first syn bytes of s are synthetic.
		pos := wordPos{off: max(off-syn, 0), syn: max(syn-off, 0)}
		pos.n = len(x) - pos.syn
		if p.mapBytes {
			pos.coarse = true
			x = byteLevelEncode(x)
		}
		emit(x, pos)
	}
	if p.useRegex != nil {
		sc.fail(splitBy(s, p.useRegex, behaviorIsolated, false, &sc.spans, out))
		return
	}
	if s != "" {
		out(s, 0)
	}
}

// runSteps applies steps in order: every piece produced by one step is split by the next.
// Positions are composed so that they refer to s; origin says whether s starts the input.
func runSteps(steps []preStep, s string, origin bool, sc *scratch, emit emitFunc) {
	if len(steps) == 0 {
		if s != "" {
			emit(s, wordPos{n: len(s)})
		}
		return
	}
	if len(steps) == 1 {
		steps[0].split(s, origin, sc, emit)
		return
	}
	// Collect the first step's pieces before running the rest: the steps share scratch.
	type pieceAt struct {
		w   string
		pos wordPos
	}
	var pieces []pieceAt
	steps[0].split(s, origin, sc, func(w string, p wordPos) { pieces = append(pieces, pieceAt{w, p}) })
	for _, pc := range pieces {
		parent := pc.pos
		runSteps(steps[1:], pc.w, origin && parent.off == 0, sc, func(w string, p wordPos) {
			emit(w, composePos(parent, p))
		})
	}
}

// composePos turns the position of a word within a parent piece into its position within
// the parent's input.
func composePos(parent, child wordPos) wordPos {
	if parent.coarse || parent.repl != "" {
		return wordPos{off: parent.off, n: parent.n, coarse: true}
	}
	// Parent bytes [0, parent.syn) are synthetic; byte j >= syn is input byte off+j-syn.
	synFromParent := max(min(parent.syn, child.off+child.n)-child.off, 0)
	start := max(child.off-parent.syn, 0)
	out := wordPos{off: parent.off + start, syn: child.syn + synFromParent, coarse: child.coarse, repl: child.repl}
	out.n = child.n - synFromParent
	return out
}

// Metaspace prepend schemes.
const (
	prependAlways = iota
	prependFirst
	prependNever
)

// metaspaceStep is the Metaspace pre-tokenizer (SentencePiece style): spaces become the
// replacement character, which is also put in front of the text, and the text is split
// before each replacement character when split is set. Its words are transformed copies, so
// EncodeOffsets gives their tokens the whole piece's range.
type metaspaceStep struct {
	repl        string
	scheme      int
	splitAtRepl bool
}

func (p metaspaceStep) split(s string, origin bool, sc *scratch, emit emitFunc) {
	if s == "" {
		return
	}
	w := strings.ReplaceAll(s, " ", p.repl)
	syn := 0
	if !strings.HasPrefix(w, p.repl) && (p.scheme == prependAlways || p.scheme == prependFirst && origin) {
		w = p.repl + w
		syn = len(p.repl)
	}
	// Positions are exact unless s already holds the replacement character (then a
	// replacement in w may stand for a space or for itself).
	exact := !strings.Contains(s, p.repl)
	pos := func(o, n int) wordPos {
		if !exact {
			return wordPos{off: 0, n: len(s), coarse: true}
		}
		a, b := max(o-syn, 0), max(o+n-syn, 0)
		return wordPos{off: replToInput(w[syn:], a, p.repl), syn: max(syn-o, 0),
			n: replToInput(w[syn:], b, p.repl) - replToInput(w[syn:], a, p.repl), repl: p.repl}
	}
	if !p.splitAtRepl {
		emit(w, pos(0, len(w)))
		return
	}
	splitBy(w, literalMatcher{p.repl}, behaviorMergedWithNext, false, &sc.spans, func(x string, o int) {
		emit(x, pos(o, len(x)))
	})
}

// replToInput maps byte offset k of m (a text whose spaces were replaced by repl) to the
// offset in the text: every whole repl before k stood for one byte. An offset inside a repl
// maps to that space.
func replToInput(m string, k int, repl string) int {
	out, i := 0, 0
	for i < k {
		if strings.HasPrefix(m[i:], repl) {
			if i+len(repl) > k {
				return out
			}
			i += len(repl)
		} else {
			i++
		}
		out++
	}
	return out
}

func isHFPunctuation(r rune) bool { return unicode.Is(hfPunct, r) }

func isHFNumeric(r rune) bool { return unicode.Is(hfNumeric, r) }

// parsePreTokenizer parses one pre-tokenizer into a flat list of steps. last says whether
// nothing follows it, so that a final ByteLevel can leave the byte mapping to the model.
func parsePreTokenizer(raw json.RawMessage, path string, depth int, last bool) ([]preStep, bool, error) {
	if isNull(raw) {
		return nil, false, nil
	}
	if depth > maxNesting {
		return nil, false, fmt.Errorf("%s: Sequence nested deeper than %d", path, maxNesting)
	}
	var head struct {
		Type           string            `json:"type"`
		Pretokenizers  []json.RawMessage `json:"pretokenizers"`
		Pattern        *patternJSON      `json:"pattern"`
		Behavior       string            `json:"behavior"`
		Invert         bool              `json:"invert"`
		AddPrefixSpace bool              `json:"add_prefix_space"`
		UseRegex       *bool             `json:"use_regex"`
		Individual     bool              `json:"individual_digits"`
		Delimiter      string            `json:"delimiter"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, false, fmt.Errorf("%s: %w", path, err)
	}
	behavior := func(def splitBehavior) (splitBehavior, error) {
		if head.Behavior == "" {
			return def, nil
		}
		b, ok := behaviorNames[head.Behavior]
		if !ok {
			return 0, fmt.Errorf("%s: behavior %q is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous", path, head.Behavior)
		}
		return b, nil
	}
	switch head.Type {
	case "Sequence":
		var steps []preStep
		byteLevelTail := false
		for i, r := range head.Pretokenizers {
			s, tail, err := parsePreTokenizer(r, fmt.Sprintf("%s.pretokenizers[%d]", path, i), depth+1, last && i == len(head.Pretokenizers)-1)
			if err != nil {
				return nil, false, err
			}
			steps = append(steps, s...)
			byteLevelTail = tail
		}
		return steps, byteLevelTail, nil
	case "Split":
		m, err := head.Pattern.compile()
		if err != nil {
			return nil, false, fmt.Errorf("%s: Split: %w", path, err)
		}
		b, err := behavior(behaviorRemoved)
		if err != nil {
			return nil, false, err
		}
		if head.Behavior == "" {
			return nil, false, fmt.Errorf("%s: Split has no \"behavior\"", path)
		}
		return []preStep{splitStep{m, b, head.Invert}}, false, nil
	case "ByteLevel":
		step := byteLevelStep{addPrefixSpace: head.AddPrefixSpace, mapBytes: !last}
		if head.UseRegex == nil || *head.UseRegex {
			m := fastScanner(gpt2Pattern)
			if m == nil {
				rm, err := compileRegex(gpt2Pattern)
				if err != nil {
					return nil, false, err
				}
				m = rm
			}
			step.useRegex = m
		}
		return []preStep{step}, last, nil
	case "Metaspace":
		st, err := parseMetaspace(raw, path)
		if err != nil {
			return nil, false, err
		}
		return []preStep{st}, false, nil
	case "Digits":
		b := behaviorContiguous
		if head.Individual {
			b = behaviorIsolated
		}
		return []preStep{splitStep{runeMatcher{isHFNumeric}, b, false}}, false, nil
	case "WhitespaceSplit":
		return []preStep{splitStep{runeMatcher{unicode.IsSpace}, behaviorRemoved, false}}, false, nil
	case "Punctuation":
		b, err := behavior(behaviorIsolated)
		if err != nil {
			return nil, false, err
		}
		return []preStep{splitStep{runeMatcher{isHFPunctuation}, b, false}}, false, nil
	case "CharDelimiterSplit":
		d := []rune(head.Delimiter)
		if len(d) != 1 {
			return nil, false, fmt.Errorf("%s: CharDelimiterSplit delimiter %q is not one character", path, head.Delimiter)
		}
		return []preStep{splitStep{runeMatcher{func(r rune) bool { return r == d[0] }}, behaviorRemoved, false}}, false, nil
	case "":
		return nil, false, fmt.Errorf("%s: no \"type\"", path)
	}
	return nil, false, fmt.Errorf("%s: pre-tokenizer type %q is not supported; supported: Sequence, Split, ByteLevel, Metaspace, Digits, Punctuation, WhitespaceSplit, CharDelimiterSplit", path, head.Type)
}

// parseMetaspace reads a Metaspace pre-tokenizer or decoder: replacement, prepend_scheme
// (always, first, never; older files say add_prefix_space instead) and split.
func parseMetaspace(raw json.RawMessage, path string) (metaspaceStep, error) {
	var m struct {
		Replacement    *string `json:"replacement"`
		PrependScheme  *string `json:"prepend_scheme"`
		AddPrefixSpace *bool   `json:"add_prefix_space"`
		Split          *bool   `json:"split"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return metaspaceStep{}, fmt.Errorf("%s: %v", path, err)
	}
	st := metaspaceStep{repl: "\u2581", scheme: prependAlways, splitAtRepl: true}
	if m.Replacement != nil {
		if utf8.RuneCountInString(*m.Replacement) != 1 {
			return st, fmt.Errorf("%s: Metaspace replacement %q is not one character", path, *m.Replacement)
		}
		st.repl = *m.Replacement
	}
	switch {
	case m.PrependScheme != nil:
		switch *m.PrependScheme {
		case "always":
			st.scheme = prependAlways
		case "first":
			st.scheme = prependFirst
		case "never":
			st.scheme = prependNever
		default:
			return st, fmt.Errorf("%s: Metaspace prepend_scheme %q is not one of always, first, never", path, *m.PrependScheme)
		}
	case m.AddPrefixSpace != nil && !*m.AddPrefixSpace:
		st.scheme = prependNever
	}
	if m.Split != nil {
		st.splitAtRepl = *m.Split
	}
	return st, nil
}
