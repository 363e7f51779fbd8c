package chat

import (
	"fmt"
	"slices"
	"strings"

	"github.com/halo-shell/halo-shell/engine/hf/chat/internal/jinja"
)

// Encoder turns text into token ids; special tokens written in the text (<|im_start|>, ...)
// must come out as their ids, as Hugging Face tokenizers do with add_special_tokens=False.
// The tokenizer package's *Tokenizer satisfies it.
type Encoder interface {
	Encode(text string) []int
}

// OffsetEncoder is an Encoder that also reports, for each token, the byte range [start, end)
// of text it covers. Encode uses it when available to place the mask exactly.
type OffsetEncoder interface {
	Encoder
	EncodeOffsets(text string) (ids []int, offsets [][2]int)
}

// Span is the byte range [Start, End) of one assistant message's output in a rendered
// conversation. Message is the index of that message (-1 when a {% generation %} block
// cannot be matched to a message).
type Span struct {
	Message    int
	Start, End int
}

// StopStrings are the end-of-turn markers assistant output ends with. The template's own
// eos_token is added to them. A span includes its marker: the model must learn to stop.
var StopStrings = []string{
	"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
	"<|end_of_text|>", "</s>", "<｜end▁of▁sentence｜>", "<|return|>", "<|call|>", "<|user|>", "<|observation|>",
}

// MaskError is a conversation whose assistant output cannot be located with confidence.
// Training on a wrong mask is worse than skipping the example.
type MaskError struct {
	Message int // the assistant message at fault, or -1
	Msg     string
}

func (e *MaskError) Error() string {
	if e.Message < 0 {
		return "chat: assistant mask: " + e.Msg
	}
	return fmt.Sprintf("chat: assistant mask: message %d: %s", e.Message, e.Msg)
}

// AssistantSpans renders the conversation and returns the text with the byte span of each
// assistant message's output: what the model produces after the generation prompt, up to
// and including its end-of-turn marker (<|im_end|>, <|eot_id|>, ...), excluding the role
// header and whatever the template writes after the marker.
//
// Templates with {% generation %} blocks report their spans directly. For the others (most
// templates), for each assistant message k:
//
//  1. G = render(messages[:k]), P = render(messages[:k], add_generation_prompt=True) and
//     W = render(messages[:k+1]); P and W must extend G. The header H = P-G is what the
//     prompt adds for turn k and the completion C = W-P what the model writes when turn k is
//     the last, cut after its first end-of-turn marker. When W does not extend P (Qwen3 with
//     thinking off and reasoning in the data) H shrinks to what P and W share.
//  2. The turn's output starts right after H (or its longest prefix that ends a line, down to
//     H's first line: a past turn's header may lack what only the generation prompt adds, like
//     Qwen3's empty think block), at the end of G when the full render R starts with G, else at
//     the earliest occurrence after the previous span.
//  3. The span is C when R continues with C there. Otherwise, when C has an end-of-turn
//     marker, the turn in R ends at R's first marker (which may differ: gpt-oss ends past
//     turns with <|end|> and the last with <|return|>), and its text must be C's or a suffix
//     of it (Qwen3 drops the reasoning of turns before the last user message). Without a
//     marker the span is the longest suffix of C that R continues with, or their common
//     prefix, and takes in a stop string that follows it (GLM ends a turn with <|user|>).
//  4. The span must contain the message's visible text (the content after any </think>, its
//     longest line) or, without text, its tool call names when R shows them at all, so that a
//     header found in the wrong place cannot pass silently.
//
// Anything else is a *MaskError naming the message: a template that cannot render a prefix of
// the conversation or changes earlier turns when one is added, whose past turns are neither
// the completion nor a suffix of it, or whose header cannot be found. Known limits: a user
// message that contains an assistant header verbatim can mislead step 2 (step 4 usually
// catches it); the last turn of a template without end-of-turn markers (GLM) has no stop
// string to learn; the cost is three renders of a prefix per assistant turn.
func (t *Template) AssistantSpans(msgs []Message, opts Options) (string, []Span, error) {
	vals, err := messageValues(msgs)
	if err != nil {
		return "", nil, err
	}
	full, gen, err := t.render(vals, &opts)
	if err != nil {
		return "", nil, err
	}
	var assistants []int
	for i, m := range msgs {
		if m.Role == "assistant" {
			assistants = append(assistants, i)
		}
	}
	name, _ := t.pick(&opts)
	if len(gen) > 0 || (len(assistants) > 0 && t.compiled[name].UsesGeneration()) {
		var spans []Span
		for _, g := range gen {
			if g.End > g.Start {
				spans = append(spans, Span{Message: -1, Start: g.Start, End: g.End})
			}
		}
		if len(spans) == len(assistants) {
			for i := range spans {
				spans[i].Message = assistants[i]
			}
		}
		if len(spans) > 0 || len(assistants) == 0 {
			return full, spans, nil
		}
	}
	stops := t.stopStrings()
	pos := 0
	var spans []Span
	for _, k := range assistants {
		sp, err := t.locate(msgs, vals, k, opts, full, pos, stops)
		if err != nil {
			return "", nil, err
		}
		spans = append(spans, sp)
		pos = sp.End
	}
	return full, spans, nil
}

func (t *Template) stopStrings() []string {
	stops := slices.Clone(StopStrings)
	if t.EOS != "" && !slices.Contains(stops, t.EOS) {
		stops = append(stops, t.EOS)
	}
	return stops
}

// firstStop returns the index and length of the earliest stop string in s, or -1.
func firstStop(s string, stops []string) (int, int) {
	best, n := -1, 0
	for _, st := range stops {
		if i := strings.Index(s, st); i >= 0 && (best < 0 || i < best || (i == best && len(st) > n)) {
			best, n = i, len(st)
		}
	}
	return best, n
}

func (t *Template) locate(msgs []Message, vals []jinja.Value, k int, opts Options, full string, pos int, stops []string) (Span, error) {
	fail := func(format string, args ...any) (Span, error) {
		return Span{}, &MaskError{Message: k, Msg: fmt.Sprintf(format, args...)}
	}
	renderPrefix := func(n int, agp bool) (string, error) {
		o := opts
		o.AddGenerationPrompt = agp
		s, _, err := t.render(vals[:n], &o)
		return s, err
	}
	g, err := renderPrefix(k, false)
	if err != nil {
		return fail("cannot render the conversation before it: %v", err)
	}
	p, err := renderPrefix(k, true)
	if err != nil {
		return fail("cannot render the generation prompt before it: %v", err)
	}
	w, err := renderPrefix(k+1, false)
	if err != nil {
		return fail("cannot render the conversation up to it: %v", err)
	}
	if !strings.HasPrefix(p, g) {
		return fail("the generation prompt does not extend the rendered conversation before it")
	}
	if !strings.HasPrefix(w, g) {
		return fail("rendering this turn changes the conversation before it")
	}
	header := p[len(g):]
	if !strings.HasPrefix(w, p) {
		// The prompt adds text the last turn does not have (Qwen3 with thinking off and a
		// turn that has reasoning): the header is what both share.
		n := cutBack(header, commonPrefix(header, w[len(g):]))
		if n == 0 {
			return fail("the template renders this turn's header unlike its generation prompt (%q)", clip(header, 60))
		}
		header = header[:n]
	}
	completion := w[len(g)+len(header):]
	stopAt, stopLen := firstStop(completion, stops)
	body := completion
	if stopAt >= 0 {
		body = completion[:stopAt+stopLen]
	}

	// 2. where the turn's output starts in the full render: right after the header, at the
	// end of the conversation before it when that is unchanged in the full render, else at
	// the earliest occurrence after the previous span. A past turn's header may be shorter
	// than the generation prompt, so shorter prefixes of it (down to its first line) count.
	minLen := len(header)
	if i := strings.IndexByte(header, '\n'); i >= 0 {
		minLen = i + 1
	}
	start := -1
	if header == "" {
		if strings.HasPrefix(full, g) && len(g) >= pos {
			start = len(g)
		}
	} else if strings.HasPrefix(full, g) && len(g) >= pos {
		if n := cutBack(header, commonPrefix(header, full[len(g):])); n >= minLen {
			start = len(g) + n
		}
	}
	if start < 0 && header != "" {
		best, bestN := -1, 0
		for n := len(header); n >= minLen; n = cutBack(header, n-1) {
			if i := strings.Index(full[pos:], header[:n]); i >= 0 && (best < 0 || i < best) {
				best, bestN = i, n
			}
		}
		if best >= 0 {
			start = pos + best + bestN
		}
	}
	if start < 0 {
		return fail("its header %q does not occur in the rendered conversation", header)
	}

	// 3. the span
	rest := full[start:]
	var end int
	switch {
	case strings.HasPrefix(rest, body):
		end = start + len(body)
	case stopAt >= 0:
		// the turn in R ends at its first end-of-turn marker, which may differ from the last
		// turn's (gpt-oss ends past turns with <|end|>, the last with <|return|>)
		i, n := firstStop(rest, stops)
		if i < 0 || !strings.HasSuffix(body[:stopAt], rest[:i]) {
			shown := rest
			if i >= 0 {
				shown = rest[:i+n]
			}
			return fail("the turn in the full conversation (%q) is neither the turn rendered last (%q) nor a suffix of it", clip(shown, 200), body)
		}
		end = start + i + n
	default:
		// no marker: the longest suffix of the completion that R continues with (the
		// template dropped a leading part such as reasoning), else their common prefix
		n := 0
		for i := 1; i < len(body); i++ {
			if len(rest) > 0 && body[i] == rest[0] && strings.HasPrefix(rest, body[i:]) {
				n = len(body) - i
				break
			}
		}
		if p := commonPrefix(body, rest); p > n {
			n = p
		}
		if n == 0 {
			return fail("the turn has no end-of-turn marker and the full conversation does not continue with it (%q)", clip(body, 60))
		}
		end = start + n
	}
	if stopAt < 0 {
		// a turn without a marker of its own ends where the model emits the next stop string
		// (GLM ends a turn by producing <|user|> or <|observation|>)
		if i, m := firstStop(full[end:], stops); i == 0 {
			end += m
		}
	}

	// 4. evidence
	if ev := evidence(&msgs[k]); len(ev) > 0 {
		span := full[start:end]
		for _, e := range ev {
			// a template may leave tool calls out altogether; what it renders must be here
			if !strings.Contains(span, e) && strings.Contains(full, e) {
				return fail("its text %q is not inside the span found for it (%q)", clip(e, 60), clip(span, 120))
			}
		}
	}
	return Span{Message: k, Start: start, End: end}, nil
}

// evidence returns text that must appear in a message's span: its visible content (after any
// </think>), or its tool call names when it has no visible content.
func evidence(m *Message) []string {
	vis := m.Content.String()
	if i := strings.LastIndex(vis, "</think>"); i >= 0 {
		vis = vis[i+len("</think>"):]
	}
	vis = strings.TrimSpace(vis)
	if vis != "" {
		// templates may re-join or trim lines; require the longest line
		longest := ""
		for _, ln := range strings.Split(vis, "\n") {
			if ln = strings.TrimSpace(ln); len(ln) > len(longest) {
				longest = ln
			}
		}
		return []string{longest}
	}
	var names []string
	for _, tc := range m.ToolCalls {
		if tc.Function.Name != "" {
			names = append(names, tc.Function.Name)
		}
	}
	return names
}

// cutBack returns the largest n' <= n at which a header may be cut: its full length or just
// after a newline; 0 when there is none.
func cutBack(header string, n int) int {
	if n >= len(header) {
		return len(header)
	}
	for ; n > 0; n-- {
		if header[n-1] == '\n' {
			return n
		}
	}
	return 0
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func clip(s string, n int) string {
	if n < 0 || n > len(s) {
		n = len(s)
	}
	if n > 200 {
		n = 200
	}
	return s[:n]
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// Encode tokenizes the rendered conversation and returns its token ids with a mask that is
// true for the tokens of assistant output (see AssistantSpans), the tokens supervised
// fine-tuning trains on. The ids are the tokenization of the whole rendered text.
//
// A token belongs to the mask when it ends inside a span: a token that straddles the start of
// a span (a header newline merged with the content's first newlines) is trained on, one that
// straddles its end is not. With an OffsetEncoder the token ranges come from the tokenizer.
// Otherwise the text is encoded piecewise at span boundaries; when that equals the whole
// encoding the boundaries are exact, else each boundary is placed after the longest run of
// tokens that the encoding of the text before the boundary shares with the whole encoding.
func (t *Template) Encode(tok Encoder, msgs []Message, opts Options) (ids []int, mask []bool, err error) {
	text, spans, err := t.AssistantSpans(msgs, opts)
	if err != nil {
		return nil, nil, err
	}
	return maskTokens(tok, text, spans)
}

func maskTokens(tok Encoder, text string, spans []Span) ([]int, []bool, error) {
	if oe, ok := tok.(OffsetEncoder); ok {
		ids, offs := oe.EncodeOffsets(text)
		if len(offs) != len(ids) {
			return nil, nil, fmt.Errorf("chat: EncodeOffsets returned %d offsets for %d tokens", len(offs), len(ids))
		}
		mask := make([]bool, len(ids))
		si := 0
		for i, o := range offs {
			end := o[1]
			for si < len(spans) && spans[si].End < end {
				si++
			}
			if si < len(spans) && end > spans[si].Start && end <= spans[si].End && o[1] > o[0] {
				mask[i] = true
			}
		}
		return ids, mask, nil
	}
	ids := tok.Encode(text)
	// piecewise encoding at the span boundaries
	var bounds []int
	for _, s := range spans {
		bounds = append(bounds, s.Start, s.End)
	}
	var pieces []int
	var tokBounds []int
	last := 0
	for _, b := range bounds {
		pieces = append(pieces, tok.Encode(text[last:b])...)
		tokBounds = append(tokBounds, len(pieces))
		last = b
	}
	pieces = append(pieces, tok.Encode(text[last:])...)
	if !slices.Equal(pieces, ids) {
		tokBounds = tokBounds[:0]
		for _, b := range bounds {
			prefix := tok.Encode(text[:b])
			n := 0
			for n < len(prefix) && n < len(ids) && prefix[n] == ids[n] {
				n++
			}
			tokBounds = append(tokBounds, n)
		}
		// a token straddling a span start is trained on: the boundary moves back over it
		// (already the case: n counts only tokens wholly before the boundary).
	}
	mask := make([]bool, len(ids))
	for i := 0; i+1 < len(tokBounds); i += 2 {
		for j := tokBounds[i]; j < tokBounds[i+1] && j < len(ids); j++ {
			mask[j] = true
		}
	}
	return ids, mask, nil
}
