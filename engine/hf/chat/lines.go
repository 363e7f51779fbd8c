package chat

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
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
		var out any
		if spans {
			text, sp, err := t.AssistantSpans(conv.Messages, o)
			if err != nil {
				bw.Flush()
				return fmt.Errorf("line %d: %w", line, err)
			}
			res := struct {
				Text  string     `json:"text"`
				Spans []SpanJSON `json:"spans"`
			}{Text: text, Spans: []SpanJSON{}}
			for _, s := range sp {
				res.Spans = append(res.Spans, SpanJSON{Message: s.Message, Start: s.Start, End: s.End, Text: text[s.Start:s.End]})
			}
			out = res
		} else {
			text, err := t.Render(conv.Messages, o)
			if err != nil {
				bw.Flush()
				return fmt.Errorf("line %d: %w", line, err)
			}
			out = text
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
