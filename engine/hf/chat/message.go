package chat

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/halo-shell/halo-shell/engine/hf/chat/internal/jinja"
)

// Message is one turn of a conversation, in the shape transformers' apply_chat_template takes
// (the OpenAI chat format). Its JSON form is that shape too.
type Message struct {
	// Role is system, user, assistant or tool (templates may accept others).
	Role string
	// Content is the text, a list of typed parts, null, or absent.
	Content Content
	// ReasoningContent is the assistant's thinking (Qwen3 and similar templates); nil when absent.
	ReasoningContent *string
	// ToolCalls are the assistant's function calls.
	ToolCalls []ToolCall
	// Name names the tool a tool message answers (some templates print it).
	Name string
	// ToolCallID links a tool message to the call it answers.
	ToolCallID string
	// Extra holds any other fields, passed to the template unchanged, in order.
	Extra []Field
}

// Field is a named JSON value.
type Field struct {
	Key   string
	Value json.RawMessage
}

// ContentKind tells what a Content holds.
type ContentKind int

const (
	// ContentAbsent is a message without a content field.
	ContentAbsent ContentKind = iota
	// ContentNull is "content": null.
	ContentNull
	// ContentText is a string.
	ContentText
	// ContentParts is a list of typed parts.
	ContentParts
	// ContentJSON is any other JSON value (a number, an object), passed to the template as is.
	ContentJSON
)

// Content is a message's content: a string, a list of parts, null or absent (the zero value).
type Content struct {
	Kind  ContentKind
	Text  string
	Parts []Part
	Raw   json.RawMessage // for ContentJSON
}

// Text returns string content.
func Text(s string) Content { return Content{Kind: ContentText, Text: s} }

// Parts returns list content.
func Parts(p ...Part) Content { return Content{Kind: ContentParts, Parts: p} }

// Null returns "content": null.
func Null() Content { return Content{Kind: ContentNull} }

// Part is one element of list content, e.g. {"type": "text", "text": "..."}; fields other than
// type and text (image URLs, ...) are kept in Extra.
type Part struct {
	Type  string
	Text  string
	Extra []Field
}

// ToolCall is an assistant's function call in the OpenAI shape.
type ToolCall struct {
	ID       string
	Type     string
	Function FunctionCall
}

// FunctionCall names the function and its arguments: a JSON object, or a JSON string holding
// serialized arguments (both appear in datasets; templates treat them differently).
type FunctionCall struct {
	Name      string
	Arguments json.RawMessage
}

// String returns the text of the content: the string, or the text parts joined by newlines.
func (c Content) String() string {
	switch c.Kind {
	case ContentText:
		return c.Text
	case ContentParts:
		var b bytes.Buffer
		for _, p := range c.Parts {
			if p.Type == "text" {
				if b.Len() > 0 {
					b.WriteByte('\n')
				}
				b.WriteString(p.Text)
			}
		}
		return b.String()
	}
	return ""
}

// ---- JSON ----

// orderedObject decodes a JSON object keeping its key order.
func orderedObject(data []byte, what string) ([]Field, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("%s: expected a JSON object, got %s", what, describeJSON(data))
	}
	var out []Field
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("%s: field %q: %w", what, kt, err)
		}
		out = append(out, Field{Key: kt.(string), Value: raw})
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

func describeJSON(data []byte) string {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return "nothing"
	}
	switch data[0] {
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 'n':
		return "null"
	case 't', 'f':
		return "a boolean"
	case '{':
		return "an object"
	}
	return "a number"
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// UnmarshalJSON reads a message in the OpenAI chat shape.
func (m *Message) UnmarshalJSON(data []byte) error {
	fields, err := orderedObject(data, "message")
	if err != nil {
		return err
	}
	*m = Message{}
	for _, f := range fields {
		switch f.Key {
		case "role":
			if err := json.Unmarshal(f.Value, &m.Role); err != nil {
				return fmt.Errorf("message: \"role\" must be a string, got %s", describeJSON(f.Value))
			}
		case "content":
			if err := m.Content.UnmarshalJSON(f.Value); err != nil {
				return err
			}
		case "reasoning_content":
			if isNull(f.Value) {
				continue
			}
			var s string
			if err := json.Unmarshal(f.Value, &s); err != nil {
				return fmt.Errorf("message: \"reasoning_content\" must be a string or null, got %s", describeJSON(f.Value))
			}
			m.ReasoningContent = &s
		case "tool_calls":
			if isNull(f.Value) {
				continue
			}
			if err := json.Unmarshal(f.Value, &m.ToolCalls); err != nil {
				return fmt.Errorf("message: \"tool_calls\": %w", err)
			}
		case "name":
			if err := json.Unmarshal(f.Value, &m.Name); err != nil {
				return fmt.Errorf("message: \"name\" must be a string, got %s", describeJSON(f.Value))
			}
		case "tool_call_id":
			if err := json.Unmarshal(f.Value, &m.ToolCallID); err != nil {
				return fmt.Errorf("message: \"tool_call_id\" must be a string, got %s", describeJSON(f.Value))
			}
		default:
			m.Extra = append(m.Extra, f)
		}
	}
	if m.Role == "" {
		return fmt.Errorf("message: missing \"role\" (system, user, assistant or tool)")
	}
	return nil
}

// MarshalJSON writes the OpenAI chat shape.
func (m Message) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{"role":`)
	writeJSONValue(&b, m.Role)
	if m.Content.Kind != ContentAbsent {
		b.WriteString(`,"content":`)
		c, err := m.Content.MarshalJSON()
		if err != nil {
			return nil, err
		}
		b.Write(c)
	}
	if m.ReasoningContent != nil {
		b.WriteString(`,"reasoning_content":`)
		writeJSONValue(&b, *m.ReasoningContent)
	}
	if len(m.ToolCalls) > 0 {
		b.WriteString(`,"tool_calls":`)
		tc, err := json.Marshal(m.ToolCalls)
		if err != nil {
			return nil, err
		}
		b.Write(tc)
	}
	if m.Name != "" {
		b.WriteString(`,"name":`)
		writeJSONValue(&b, m.Name)
	}
	if m.ToolCallID != "" {
		b.WriteString(`,"tool_call_id":`)
		writeJSONValue(&b, m.ToolCallID)
	}
	for _, f := range m.Extra {
		b.WriteByte(',')
		writeJSONValue(&b, f.Key)
		b.WriteByte(':')
		b.Write(f.Value)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func writeJSONValue(b *bytes.Buffer, v any) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	b.Truncate(b.Len() - 1) // Encode's newline
}

// UnmarshalJSON reads a string, a list of parts or null.
func (c *Content) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	switch {
	case isNull(data):
		*c = Null()
	case len(data) > 0 && data[0] == '"':
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return fmt.Errorf("message: \"content\": %w", err)
		}
		*c = Text(s)
	case len(data) > 0 && data[0] == '[':
		var parts []Part
		if err := json.Unmarshal(data, &parts); err != nil {
			return fmt.Errorf("message: \"content\": %w", err)
		}
		*c = Parts(parts...)
	default:
		if !json.Valid(data) {
			return fmt.Errorf("message: \"content\" is not valid JSON")
		}
		*c = Content{Kind: ContentJSON, Raw: append(json.RawMessage(nil), data...)}
	}
	return nil
}

// MarshalJSON writes the content's JSON form (absent content writes null).
func (c Content) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	switch c.Kind {
	case ContentText:
		writeJSONValue(&b, c.Text)
	case ContentParts:
		p, err := json.Marshal(c.Parts)
		if err != nil {
			return nil, err
		}
		b.Write(p)
	case ContentJSON:
		b.Write(c.Raw)
	default:
		b.WriteString("null")
	}
	return b.Bytes(), nil
}

// UnmarshalJSON reads {"type": ..., "text": ..., ...}.
func (p *Part) UnmarshalJSON(data []byte) error {
	fields, err := orderedObject(data, "content part")
	if err != nil {
		return err
	}
	*p = Part{}
	for _, f := range fields {
		switch f.Key {
		case "type":
			if err := json.Unmarshal(f.Value, &p.Type); err != nil {
				return fmt.Errorf("content part: \"type\" must be a string, got %s", describeJSON(f.Value))
			}
		case "text":
			if err := json.Unmarshal(f.Value, &p.Text); err != nil {
				return fmt.Errorf("content part: \"text\" must be a string, got %s", describeJSON(f.Value))
			}
		default:
			p.Extra = append(p.Extra, f)
		}
	}
	if p.Type == "" {
		return fmt.Errorf("content part: missing \"type\" (e.g. \"text\")")
	}
	return nil
}

// MarshalJSON writes the part's JSON form.
func (p Part) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{"type":`)
	writeJSONValue(&b, p.Type)
	if p.Type == "text" || p.Text != "" {
		b.WriteString(`,"text":`)
		writeJSONValue(&b, p.Text)
	}
	for _, f := range p.Extra {
		b.WriteByte(',')
		writeJSONValue(&b, f.Key)
		b.WriteByte(':')
		b.Write(f.Value)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// UnmarshalJSON reads {"id":..., "type": "function", "function": {"name":..., "arguments":...}}.
func (t *ToolCall) UnmarshalJSON(data []byte) error {
	var raw struct {
		ID       *string         `json:"id"`
		Type     *string         `json:"type"`
		Function json.RawMessage `json:"function"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("tool call: %w", err)
	}
	*t = ToolCall{}
	if raw.ID != nil {
		t.ID = *raw.ID
	}
	if raw.Type != nil {
		t.Type = *raw.Type
	}
	if len(raw.Function) == 0 || isNull(raw.Function) {
		return fmt.Errorf("tool call: missing \"function\" ({\"name\": ..., \"arguments\": ...})")
	}
	var fn struct {
		Name      *string         `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal(raw.Function, &fn); err != nil {
		return fmt.Errorf("tool call: \"function\": %w", err)
	}
	if fn.Name == nil {
		return fmt.Errorf("tool call: \"function\" has no \"name\"")
	}
	t.Function.Name = *fn.Name
	t.Function.Arguments = fn.Arguments
	return nil
}

// MarshalJSON writes the OpenAI shape.
func (t ToolCall) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	if t.ID != "" {
		b.WriteString(`"id":`)
		writeJSONValue(&b, t.ID)
		b.WriteByte(',')
	}
	if t.Type != "" {
		b.WriteString(`"type":`)
		writeJSONValue(&b, t.Type)
		b.WriteByte(',')
	}
	b.WriteString(`"function":{"name":`)
	writeJSONValue(&b, t.Function.Name)
	if len(t.Function.Arguments) > 0 {
		b.WriteString(`,"arguments":`)
		b.Write(t.Function.Arguments)
	}
	b.WriteString("}}")
	return b.Bytes(), nil
}

// ---- template values ----

func rawValue(raw json.RawMessage, what string) (jinja.Value, error) {
	v, err := jinja.FromJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return v, nil
}

// value converts the message to the dict the template sees. Keys come in this order: role,
// content, reasoning_content, tool_calls, name, tool_call_id, then Extra in order.
func (m *Message) value(i int) (jinja.Value, error) {
	d := jinja.NewDict()
	d.Set("role", m.Role)
	switch m.Content.Kind {
	case ContentNull:
		d.Set("content", nil)
	case ContentText:
		d.Set("content", m.Content.Text)
	case ContentParts:
		parts := &jinja.List{}
		for j, p := range m.Content.Parts {
			pd := jinja.NewDict()
			pd.Set("type", p.Type)
			if p.Type == "text" || p.Text != "" {
				pd.Set("text", p.Text)
			}
			for _, f := range p.Extra {
				v, err := rawValue(f.Value, fmt.Sprintf("message %d: content part %d: %q", i, j, f.Key))
				if err != nil {
					return nil, err
				}
				pd.Set(f.Key, v)
			}
			parts.Items = append(parts.Items, pd)
		}
		d.Set("content", parts)
	case ContentJSON:
		v, err := rawValue(m.Content.Raw, fmt.Sprintf("message %d: content", i))
		if err != nil {
			return nil, err
		}
		d.Set("content", v)
	}
	if m.ReasoningContent != nil {
		d.Set("reasoning_content", *m.ReasoningContent)
	}
	if len(m.ToolCalls) > 0 {
		calls := &jinja.List{}
		for j, tc := range m.ToolCalls {
			cd := jinja.NewDict()
			if tc.ID != "" {
				cd.Set("id", tc.ID)
			}
			if tc.Type != "" {
				cd.Set("type", tc.Type)
			}
			fd := jinja.NewDict()
			fd.Set("name", tc.Function.Name)
			if len(tc.Function.Arguments) > 0 {
				v, err := rawValue(tc.Function.Arguments, fmt.Sprintf("message %d: tool call %d: arguments", i, j))
				if err != nil {
					return nil, err
				}
				fd.Set("arguments", v)
			}
			cd.Set("function", fd)
			calls.Items = append(calls.Items, cd)
		}
		d.Set("tool_calls", calls)
	}
	if m.Name != "" {
		d.Set("name", m.Name)
	}
	if m.ToolCallID != "" {
		d.Set("tool_call_id", m.ToolCallID)
	}
	for _, f := range m.Extra {
		v, err := rawValue(f.Value, fmt.Sprintf("message %d: %q", i, f.Key))
		if err != nil {
			return nil, err
		}
		d.Set(f.Key, v)
	}
	return d, nil
}
