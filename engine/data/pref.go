package data

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// PrefKind names the shape of a preference dataset's rows (TRL's dataset formats).
type PrefKind string

const (
	// Paired rows hold a prompt and two completions, one preferred:
	// {"prompt", "chosen", "rejected"} (DPO, SMPO, reward models).
	Paired PrefKind = "paired"
	// Unpaired rows hold a prompt, one completion and whether it is desirable:
	// {"prompt", "completion", "label"} (KTO).
	Unpaired PrefKind = "unpaired"
)

// Turns is a prompt or a completion: plain text (Text), or a conversation (Messages, when
// Chat is set) that a chat template renders.
type Turns struct {
	Chat     bool
	Text     string
	Messages []Message
}

// Empty reports whether there is nothing in it.
func (t Turns) Empty() bool {
	if t.Chat {
		for _, m := range t.Messages {
			if m.Content != "" {
				return false
			}
		}
		return true
	}
	return t.Text == ""
}

// PrefRecord is one row of a preference dataset. Prompt, Chosen and Rejected are set for
// Paired rows; Prompt, Completion and Label for Unpaired ones. Within a row every field is
// plain text or every field is a conversation.
type PrefRecord struct {
	Source string // file the row came from
	Line   int    // 1-based line number in Source

	Prompt     Turns
	Chosen     Turns
	Rejected   Turns
	Completion Turns
	Label      bool // Unpaired: the completion is desirable
}

// Where names the row's origin as "file:line".
func (r PrefRecord) Where() string { return fmt.Sprintf("%s:%d", r.Source, r.Line) }

// BadRow is a row left out of the training data, and why.
type BadRow struct {
	Source string
	Line   int
	// Reason is the kind of problem, the same for every row with it (e.g. `missing
	// "rejected"`, "empty completion", "prompt longer than max_length"), so that rows group by
	// it; Detail says more about this row (may be empty).
	Reason string
	Detail string
}

// Where names the row as "file:line".
func (b BadRow) Where() string { return fmt.Sprintf("%s:%d", b.Source, b.Line) }

func (b BadRow) String() string {
	if b.Detail == "" {
		return b.Where() + ": " + b.Reason
	}
	return b.Where() + ": " + b.Reason + ": " + b.Detail
}

// SummarizeBadRows says how many of total rows were dropped and why: one clause per reason,
// most frequent first, with the first few line numbers. "" when none were.
func SummarizeBadRows(bad []BadRow, total int) string {
	if len(bad) == 0 {
		return ""
	}
	byReason := map[string][]BadRow{}
	for _, b := range bad {
		byReason[b.Reason] = append(byReason[b.Reason], b)
	}
	reasons := make([]string, 0, len(byReason))
	for r := range byReason {
		reasons = append(reasons, r)
	}
	sort.Slice(reasons, func(i, j int) bool {
		a, b := byReason[reasons[i]], byReason[reasons[j]]
		if len(a) != len(b) {
			return len(a) > len(b)
		}
		return reasons[i] < reasons[j]
	})
	parts := make([]string, len(reasons))
	for i, r := range reasons {
		rows := byReason[r]
		where := make([]string, 0, 3)
		for _, b := range rows[:min(3, len(rows))] {
			where = append(where, b.Where())
		}
		if len(rows) > 3 {
			where = append(where, fmt.Sprintf("%d more", len(rows)-3))
		}
		parts[i] = fmt.Sprintf("%d %s (%s)", len(rows), r, strings.Join(where, ", "))
	}
	return fmt.Sprintf("dropped %d of %d rows: %s", len(bad), total, strings.Join(parts, "; "))
}

// ReadPreferenceFiles reads JSONL preference datasets of the given kind, in order. Rows with
// a problem (invalid JSON, a missing or mistyped field, an empty completion) are left out and
// returned as bad rows with their line numbers; a file that cannot be read, or data with no
// good row at all, is an error.
func ReadPreferenceFiles(paths []string, kind PrefKind) ([]PrefRecord, []BadRow, error) {
	if len(paths) == 0 {
		return nil, nil, errors.New("data: no dataset files given")
	}
	var recs []PrefRecord
	var bad []BadRow
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, nil, fmt.Errorf("data: %w", err)
		}
		r, b, err := ReadPreference(f, p, kind)
		f.Close()
		if err != nil && !errors.Is(err, errNoGoodRows) {
			return nil, nil, err
		}
		recs = append(recs, r...)
		bad = append(bad, b...)
	}
	if len(recs) == 0 {
		msg := fmt.Sprintf("data: no usable %s preference row in %s", kind, strings.Join(paths, ", "))
		if len(bad) > 0 {
			msg += "; " + SummarizeBadRows(bad, len(bad)) + "; the first: " + bad[0].String()
		}
		return nil, bad, errors.New(msg + "; " + prefShape(kind))
	}
	return recs, bad, nil
}

var errNoGoodRows = errors.New("data: no usable rows")

func prefShape(kind PrefKind) string {
	if kind == Unpaired {
		return `each line should be {"prompt": ..., "completion": ..., "label": true|false}, the prompt and completion text or lists of {"role","content"} messages`
	}
	return `each line should be {"prompt": ..., "chosen": ..., "rejected": ...}, each text or a list of {"role","content"} messages (conversational rows may leave out the prompt: the messages chosen and rejected share are the prompt)`
}

// ReadPreference parses JSONL preference rows from r; name is used for line references.
// Blank lines are skipped.
func ReadPreference(r io.Reader, name string, kind PrefKind) ([]PrefRecord, []BadRow, error) {
	if kind != Paired && kind != Unpaired {
		return nil, nil, fmt.Errorf("data: preference kind %q: use %q or %q", kind, Paired, Unpaired)
	}
	br := bufio.NewReaderSize(r, 1<<16)
	var recs []PrefRecord
	var bad []BadRow
	for line := 1; ; line++ {
		b, err := readLine(br)
		if err != nil && err != io.EOF {
			if errors.Is(err, errLineTooLong) {
				bad = append(bad, BadRow{Source: name, Line: line, Reason: "line too long", Detail: fmt.Sprintf("more than %d bytes", MaxLineBytes)})
				if err == errLineTooLong {
					continue
				}
				break
			}
			return nil, nil, fmt.Errorf("data: %s:%d: %w", name, line, err)
		}
		if len(bytes.TrimSpace(b)) > 0 {
			rec, reason, detail := parsePrefLine(b, kind)
			if reason != "" {
				bad = append(bad, BadRow{Source: name, Line: line, Reason: reason, Detail: detail})
			} else {
				rec.Source, rec.Line = name, line
				recs = append(recs, rec)
			}
		}
		if err == io.EOF {
			break
		}
	}
	if len(recs) == 0 {
		return nil, bad, errNoGoodRows
	}
	return recs, bad, nil
}

var errLineTooLong = errors.New("line too long")

// errLineTooLongAtEOF is errLineTooLong on the last line.
var errLineTooLongAtEOF = fmt.Errorf("%w at the end", errLineTooLong)

// readLine reads one line (without bounding its content beyond MaxLineBytes): io.EOF with
// the last line, errLineTooLong (the rest of the line skipped) when it is longer than
// MaxLineBytes.
func readLine(br *bufio.Reader) ([]byte, error) {
	var buf []byte
	tooLong := false
	for {
		chunk, err := br.ReadSlice('\n')
		if len(buf)+len(chunk) > MaxLineBytes {
			tooLong = true
		} else {
			buf = append(buf, chunk...)
		}
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err == io.EOF && tooLong:
			return nil, errLineTooLongAtEOF
		case err == io.EOF:
			return buf, io.EOF
		case err != nil:
			return nil, err
		case tooLong:
			return nil, errLineTooLong
		}
		return buf, nil
	}
}

// parsePrefLine parses one row; a non-empty reason says why the row is bad.
func parsePrefLine(b []byte, kind PrefKind) (rec PrefRecord, reason, detail string) {
	b = bytes.TrimSpace(b)
	if b[0] != '{' {
		return rec, "not a JSON object", ""
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return rec, "invalid JSON", jsonErr(err)
	}
	fields := []string{"prompt", "chosen", "rejected"}
	if kind == Unpaired {
		fields = []string{"prompt", "completion", "label"}
	}
	turns := map[string]Turns{}
	chat := -1 // -1 unknown, 0 text, 1 conversational
	for _, f := range fields {
		v, ok := raw[f]
		if !ok || string(v) == "null" {
			if f == "prompt" && kind == Paired {
				continue // an implicit prompt, taken from the shared messages below
			}
			return rec, fmt.Sprintf("missing %q", f), prefShapeShort(kind)
		}
		if f == "label" {
			if err := json.Unmarshal(v, &rec.Label); err != nil {
				return rec, `"label" is not true or false`, fmt.Sprintf("got %s", shortJSON(v))
			}
			continue
		}
		t, err := parseTurns(v)
		if err != nil {
			return rec, fmt.Sprintf("%q is not text or a list of messages", f), err.Error()
		}
		c := 0
		if t.Chat {
			c = 1
		}
		if chat >= 0 && c != chat {
			return rec, "text and messages mixed in one row", fmt.Sprintf("%q is %s", f, map[bool]string{true: "messages", false: "text"}[t.Chat])
		}
		chat = c
		turns[f] = t
	}
	rec.Prompt = turns["prompt"]
	if kind == Unpaired {
		rec.Completion = turns["completion"]
		if rec.Completion.Empty() {
			return rec, "empty completion", ""
		}
		return rec, "", ""
	}
	rec.Chosen, rec.Rejected = turns["chosen"], turns["rejected"]
	if _, ok := turns["prompt"]; !ok {
		if chat != 1 {
			return rec, `missing "prompt"`, "plain-text rows need an explicit prompt (only conversational rows may leave it out)"
		}
		rec.Prompt, rec.Chosen, rec.Rejected = splitSharedPrompt(rec.Chosen, rec.Rejected)
		if len(rec.Prompt.Messages) == 0 {
			return rec, `missing "prompt"`, "chosen and rejected share no leading message to take as the prompt"
		}
	}
	for _, f := range []struct {
		name string
		t    Turns
	}{{"chosen", rec.Chosen}, {"rejected", rec.Rejected}} {
		if f.t.Empty() {
			return rec, "empty completion", fmt.Sprintf("%q has no content", f.name)
		}
	}
	return rec, "", ""
}

func prefShapeShort(kind PrefKind) string {
	if kind == Unpaired {
		return `want {"prompt", "completion", "label"}`
	}
	return `want {"prompt", "chosen", "rejected"}`
}

// parseTurns reads a JSON string (text) or a list of {"role","content"} messages.
func parseTurns(v json.RawMessage) (Turns, error) {
	var s string
	if json.Unmarshal(v, &s) == nil {
		return Turns{Text: s}, nil
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal(v, &msgs); err != nil {
		return Turns{}, fmt.Errorf("got %s", shortJSON(v))
	}
	t := Turns{Chat: true}
	for i, m := range msgs {
		var mm struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		}
		if err := json.Unmarshal(m, &mm); err != nil || mm.Role == nil || *mm.Role == "" || mm.Content == nil {
			return Turns{}, fmt.Errorf("message %d must be {\"role\": string, \"content\": string}, got %s", i, shortJSON(m))
		}
		t.Messages = append(t.Messages, Message{Role: *mm.Role, Content: *mm.Content})
	}
	return t, nil
}

// splitSharedPrompt takes the messages that chosen and rejected conversations share at their
// start as the prompt (TRL's implicit prompt), leaving the rest as the completions.
func splitSharedPrompt(c, r Turns) (prompt, chosen, rejected Turns) {
	n := 0
	for n < len(c.Messages)-1 && n < len(r.Messages)-1 && c.Messages[n] == r.Messages[n] {
		n++
	}
	return Turns{Chat: true, Messages: c.Messages[:n]}, Turns{Chat: true, Messages: c.Messages[n:]}, Turns{Chat: true, Messages: r.Messages[n:]}
}

func shortJSON(v []byte) string {
	const n = 40
	if len(v) <= n {
		return string(v)
	}
	return string(v[:n]) + "..."
}

// SplitPreference sets aside a deterministic held-out part of recs, as Split does for
// records: round(fraction*len) rows, at least one when fraction > 0, chosen by seed.
func SplitPreference(recs []PrefRecord, fraction float64, seed uint64) (train, eval []PrefRecord, err error) {
	return splitHeld(recs, fraction, seed, "rows")
}
