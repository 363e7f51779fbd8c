package chat

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
)

// Conversation is one input line of RenderLines: a JSON list of messages, or an object with
// "messages" and optional "tools".
type Conversation struct {
	Messages []Message         `json:"messages"`
	Tools    []json.RawMessage `json:"tools,omitempty"`
}

// UnmarshalJSON accepts a bare list of messages too.
func (c *Conversation) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	if len(data) > 0 && data[0] == '[' {
		c.Tools = nil
		return json.Unmarshal(data, &c.Messages)
	}
	var obj struct {
		Messages *[]Message        `json:"messages"`
		Tools    []json.RawMessage `json:"tools"`
	}
	if err := json.Unmarshal(data, &obj); err != nil {
		return err
	}
	if obj.Messages == nil {
		return fmt.Errorf("want a JSON list of messages or an object with \"messages\"")
	}
	c.Messages, c.Tools = *obj.Messages, obj.Tools
	return nil
}

// SpanJSON is an assistant span as RenderLines writes it.
type SpanJSON struct {
	Message int    `json:"message"`
	Start   int    `json:"start"`
	End     int    `json:"end"`
	Text    string `json:"text"`
}

// maxLineBytes bounds one input line of RenderLines.
const maxLineBytes = 256 << 20

// RenderLines reads one conversation per line from r and writes one JSON line per
// conversation to w: the rendered text as a JSON string or, with spans set, an object
// {"text": ..., "spans": [{"message", "start", "end", "text"}]} where start and end are byte
// offsets of the assistant output in the text. Tools on a line replace opts.Tools. Empty lines
// are skipped. The first bad line stops it with an error naming the line.
func (t *Template) RenderLines(r io.Reader, w io.Writer, opts Options, spans bool) error {
	return t.eachLine(r, w, opts, func(conv *Conversation, o Options) (any, error) {
		if spans {
			text, sp, err := t.AssistantSpans(conv.Messages, o)
			if err != nil {
				return nil, err
			}
			res := struct {
				Text  string     `json:"text"`
				Spans []SpanJSON `json:"spans"`
			}{Text: text, Spans: []SpanJSON{}}
			for _, s := range sp {
				res.Spans = append(res.Spans, SpanJSON{Message: s.Message, Start: s.Start, End: s.End, Text: text[s.Start:s.End]})
			}
			return res, nil
		}
		return t.Render(conv.Messages, o)
	})
}

// EncodeLines reads conversations like RenderLines and writes, per line, the token ids of the
// rendered conversation and the assistant mask supervised fine-tuning trains on:
// {"ids": [...], "mask": [0, 1, ...]}.
func (t *Template) EncodeLines(tok Encoder, r io.Reader, w io.Writer, opts Options) error {
	return t.eachLine(r, w, opts, func(conv *Conversation, o Options) (any, error) {
		ids, mask, err := t.Encode(tok, conv.Messages, o)
		if err != nil {
			return nil, err
		}
		return idsMask{ids, mask}, nil
	})
}

// eachLine runs fn on each conversation line and writes its result as a JSON line.
func (t *Template) eachLine(r io.Reader, w io.Writer, opts Options, fn func(*Conversation, Options) (any, error)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLineBytes)
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	line := 0
	for sc.Scan() {
		line++
		data := bytes.TrimSpace(sc.Bytes())
		if len(data) == 0 {
			continue
		}
		var conv Conversation
		if err := json.Unmarshal(data, &conv); err != nil {
			bw.Flush()
			return fmt.Errorf("line %d: %w", line, err)
		}
		o := opts
		if conv.Tools != nil {
			o.Tools = conv.Tools
		}
		out, err := fn(&conv, o)
		if err != nil {
			bw.Flush()
			return fmt.Errorf("line %d: %w", line, err)
		}
		if err := enc.Encode(out); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		bw.Flush()
		return fmt.Errorf("line %d: %w", line+1, err)
	}
	return bw.Flush()
}

// idsMask is an EncodeLines result; the mask is written as 0s and 1s.
type idsMask struct {
	ids  []int
	mask []bool
}

// MarshalJSON writes {"ids": [...], "mask": [...]}.
func (m idsMask) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{"ids":[`)
	for i, id := range m.ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(id))
	}
	b.WriteString(`],"mask":[`)
	for i, on := range m.mask {
		if i > 0 {
			b.WriteByte(',')
		}
		if on {
			b.WriteByte('1')
		} else {
			b.WriteByte('0')
		}
	}
	b.WriteString("]}")
	return b.Bytes(), nil
}
