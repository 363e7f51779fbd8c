package data

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Format names the shape of a dataset's records.
type Format string

const (
	// FormatAuto detects the shape of each record from its keys.
	FormatAuto Format = "auto"
	// FormatText is {"text": "..."}: pretraining, every token is a target.
	FormatText Format = "text"
	// FormatMessages is {"messages": [{"role","content"}...]}: only assistant tokens are targets.
	FormatMessages Format = "messages"
	// FormatPromptCompletion is {"prompt","completion"}: the completion's tokens are targets.
	FormatPromptCompletion Format = "prompt_completion"
	// FormatTokens is {"input_ids": [...]}: token ids already made by a tokenizer; every token
	// is a target.
	FormatTokens Format = "tokens"
)

// Formats lists the accepted Format values, for error messages and validation.
var Formats = []Format{FormatAuto, FormatText, FormatMessages, FormatPromptCompletion, FormatTokens}

// MaxTokenID bounds a token id of a tokens record (ids are int32 on the device).
const MaxTokenID = 1<<31 - 1

// ParseFormat checks a format name.
func ParseFormat(s string) (Format, error) {
	for _, f := range Formats {
		if string(f) == s {
			return f, nil
		}
	}
	names := make([]string, len(Formats))
	for i, f := range Formats {
		names[i] = string(f)
	}
	return "", fmt.Errorf("data: unknown dataset format %q (use one of %s)", s, strings.Join(names, ", "))
}

// Message is one turn of a chat record.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Record is one parsed line of a JSONL dataset. Exactly the fields of its Kind are set.
type Record struct {
	Source string // file the record came from
	Line   int    // 1-based line number in Source
	Kind   Format // FormatText, FormatMessages, FormatPromptCompletion or FormatTokens

	Text       string
	Messages   []Message
	Prompt     string
	Completion string
	IDs        []int32 // FormatTokens: the token ids
}

// Where names the record's origin as "file:line", for error messages.
func (r Record) Where() string { return fmt.Sprintf("%s:%d", r.Source, r.Line) }

// MaxLineBytes bounds one JSONL line; longer lines are refused with an error naming the line.
const MaxLineBytes = 64 << 20

// ReadFile reads a JSONL dataset file. Blank lines are skipped. Every error names the file and
// the line.
func ReadFile(path string, format Format) ([]Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	return Read(f, path, format)
}

// ReadFiles reads several JSONL files in order and concatenates their records.
func ReadFiles(paths []string, format Format) ([]Record, error) {
	if len(paths) == 0 {
		return nil, errors.New("data: no dataset files given")
	}
	var all []Record
	for _, p := range paths {
		recs, err := ReadFile(p, format)
		if err != nil {
			return nil, err
		}
		all = append(all, recs...)
	}
	return all, nil
}

// Read parses JSONL from r; name is used in error messages.
func Read(r io.Reader, name string, format Format) ([]Record, error) {
	if format == "" {
		format = FormatAuto
	}
	if _, err := ParseFormat(string(format)); err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(r, 1<<16)
	var recs []Record
	var buf []byte
	for line := 1; ; line++ {
		buf = buf[:0]
		tooLong := false
		for {
			chunk, err := br.ReadSlice('\n')
			if len(buf)+len(chunk) > MaxLineBytes {
				tooLong = true
			} else {
				buf = append(buf, chunk...)
			}
			if err == bufio.ErrBufferFull {
				continue
			}
			if err == io.EOF {
				if tooLong {
					return nil, fmt.Errorf("data: %s:%d: line longer than %d bytes", name, line, MaxLineBytes)
				}
				if len(bytes.TrimSpace(buf)) > 0 {
					rec, perr := parseLine(buf, name, line, format)
					if perr != nil {
						return nil, perr
					}
					recs = append(recs, rec)
				}
				if len(recs) == 0 {
					return nil, fmt.Errorf("data: %s: no records (expected one JSON object per line)", name)
				}
				return recs, nil
			}
			if err != nil {
				return nil, fmt.Errorf("data: %s:%d: %w", name, line, err)
			}
			break
		}
		if tooLong {
			return nil, fmt.Errorf("data: %s:%d: line longer than %d bytes", name, line, MaxLineBytes)
		}
		if len(bytes.TrimSpace(buf)) == 0 {
			continue
		}
		rec, err := parseLine(buf, name, line, format)
		if err != nil {
			return nil, err
		}
		recs = append(recs, rec)
	}
}

type rawRecord struct {
	Text       *string          `json:"text"`
	Messages   *json.RawMessage `json:"messages"`
	Prompt     *string          `json:"prompt"`
	Completion *string          `json:"completion"`
	InputIDs   *json.RawMessage `json:"input_ids"`
}

func parseLine(b []byte, name string, line int, format Format) (Record, error) {
	where := fmt.Sprintf("%s:%d", name, line)
	b = bytes.TrimSpace(b)
	if len(b) == 0 || b[0] != '{' {
		return Record{}, fmt.Errorf("data: %s: expected a JSON object per line", where)
	}
	var raw rawRecord
	if err := json.Unmarshal(b, &raw); err != nil {
		return Record{}, fmt.Errorf("data: %s: %s", where, jsonErr(err))
	}
	kind := format
	if kind == FormatAuto {
		switch {
		case raw.Messages != nil:
			kind = FormatMessages
		case raw.Prompt != nil || raw.Completion != nil:
			kind = FormatPromptCompletion
		case raw.Text != nil:
			kind = FormatText
		case raw.InputIDs != nil:
			kind = FormatTokens
		default:
			return Record{}, fmt.Errorf("data: %s: record has none of the keys \"text\", \"messages\", \"prompt\"/\"completion\" or \"input_ids\"", where)
		}
	}
	rec := Record{Source: name, Line: line, Kind: kind}
	switch kind {
	case FormatText:
		if raw.Text == nil {
			return Record{}, fmt.Errorf("data: %s: format is text but the record has no \"text\" key", where)
		}
		rec.Text = *raw.Text
	case FormatPromptCompletion:
		if raw.Prompt == nil || raw.Completion == nil {
			return Record{}, fmt.Errorf("data: %s: format is prompt_completion but the record lacks \"prompt\" or \"completion\"", where)
		}
		rec.Prompt, rec.Completion = *raw.Prompt, *raw.Completion
		if rec.Completion == "" {
			return Record{}, fmt.Errorf("data: %s: \"completion\" is empty: nothing to train on", where)
		}
	case FormatMessages:
		if raw.Messages == nil {
			return Record{}, fmt.Errorf("data: %s: format is messages but the record has no \"messages\" key", where)
		}
		var msgs []json.RawMessage
		if err := json.Unmarshal(*raw.Messages, &msgs); err != nil {
			return Record{}, fmt.Errorf("data: %s: \"messages\" must be a list of {\"role\",\"content\"} objects", where)
		}
		if len(msgs) == 0 {
			return Record{}, fmt.Errorf("data: %s: \"messages\" is empty", where)
		}
		hasAssistant := false
		for i, m := range msgs {
			var mm struct {
				Role    *string `json:"role"`
				Content *string `json:"content"`
			}
			if err := json.Unmarshal(m, &mm); err != nil {
				return Record{}, fmt.Errorf("data: %s: messages[%d]: role and content must be strings: %s", where, i, jsonErr(err))
			}
			if mm.Role == nil || *mm.Role == "" {
				return Record{}, fmt.Errorf("data: %s: messages[%d] has no \"role\"", where, i)
			}
			if mm.Content == nil {
				return Record{}, fmt.Errorf("data: %s: messages[%d] has no \"content\"", where, i)
			}
			if *mm.Role == "assistant" {
				hasAssistant = true
			}
			rec.Messages = append(rec.Messages, Message{Role: *mm.Role, Content: *mm.Content})
		}
		if !hasAssistant {
			return Record{}, fmt.Errorf("data: %s: no \"assistant\" message: nothing to train on", where)
		}
	case FormatTokens:
		if raw.InputIDs == nil {
			return Record{}, fmt.Errorf("data: %s: format is tokens but the record has no \"input_ids\" key", where)
		}
		ids, err := parseIDs(*raw.InputIDs)
		if err != nil {
			return Record{}, fmt.Errorf("data: %s: \"input_ids\" %s", where, err)
		}
		rec.IDs = ids
	}
	return rec, nil
}

// parseIDs reads a JSON list of token ids: integers in [0, MaxTokenID], at least 2 (one
// token predicts nothing).
func parseIDs(b json.RawMessage) ([]int32, error) {
	var vals []json.Number
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&vals); err != nil {
		return nil, errors.New("must be a list of integer token ids")
	}
	if len(vals) < 2 {
		return nil, fmt.Errorf("has %d ids: need at least 2 (the first token is never a target)", len(vals))
	}
	ids := make([]int32, len(vals))
	for i, v := range vals {
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil || n < 0 || n > MaxTokenID {
			return nil, fmt.Errorf("item %d (%s) is not a token id: need an integer in [0, %d]", i, v, MaxTokenID)
		}
		ids[i] = int32(n)
	}
	return ids, nil
}

func jsonErr(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("invalid JSON at byte %d: %v", se.Offset, err)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("key %q: expected %s, got %s", te.Field, te.Type, te.Value)
	}
	return err.Error()
}
