package chat

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestMessageValues checks what a template sees for each message shape: string, list and
// null content, absent content, reasoning, tool calls with object or string arguments, and
// extra fields kept in order.
func TestMessageValues(t *testing.T) {
	tmpl, err := FromSource("{{ messages | tojson }}", "", "")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name, in, want string }{
		{"text", `{"role": "user", "content": "hi"}`, `{"role": "user", "content": "hi"}`},
		{"null", `{"role": "assistant", "content": null}`, `{"role": "assistant", "content": null}`},
		{"absent", `{"role": "assistant"}`, `{"role": "assistant"}`},
		{"parts", `{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image", "url": "x.png"}]}`,
			`{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image", "url": "x.png"}]}`},
		{"number content", `{"role": "user", "content": 7}`, `{"role": "user", "content": 7}`},
		{"reasoning", `{"role": "assistant", "content": "a", "reasoning_content": "r"}`, `{"role": "assistant", "content": "a", "reasoning_content": "r"}`},
		{"null reasoning", `{"role": "assistant", "content": "a", "reasoning_content": null}`, `{"role": "assistant", "content": "a"}`},
		{"object args", `{"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"z": 1, "a": [1.0, "é"]}}}]}`,
			`{"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"z": 1, "a": [1.0, "é"]}}}]}`},
		{"string args", `{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{\"q\": 1}"}}]}`,
			`{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{\"q\": 1}"}}]}`},
		{"tool", `{"role": "tool", "tool_call_id": "c1", "name": "f", "content": "42"}`, `{"role": "tool", "content": "42", "name": "f", "tool_call_id": "c1"}`},
		{"extra fields", `{"role": "user", "weight": 0.5, "content": "x", "meta": {"b": 1, "a": 2}}`, `{"role": "user", "content": "x", "weight": 0.5, "meta": {"b": 1, "a": 2}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m Message
			if err := json.Unmarshal([]byte(tt.in), &m); err != nil {
				t.Fatal(err)
			}
			got, err := tmpl.Render([]Message{m}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if got != "["+tt.want+"]" {
				t.Fatalf("template sees %s, want [%s]", got, tt.want)
			}
			// JSON round trip keeps the message
			out, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			var again Message
			if err := json.Unmarshal(out, &again); err != nil {
				t.Fatalf("re-decoding %s: %v", out, err)
			}
			got2, err := tmpl.Render([]Message{again}, Options{})
			if err != nil || got2 != got {
				t.Fatalf("after a JSON round trip (%s) the template sees %s, want %s", out, got2, got)
			}
		})
	}
}

// TestMessageErrors checks that malformed messages are refused with the field named.
func TestMessageErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{`"hi"`, "expected a JSON object"},
		{`{"content": "x"}`, `missing "role"`},
		{`{"role": 3}`, `"role" must be a string`},
		{`{"role": "user", "content": [{"text": "x"}]}`, `missing "type"`},
		{`{"role": "assistant", "tool_calls": [{"type": "function"}]}`, `missing "function"`},
		{`{"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}`, `no "name"`},
		{`{"role": "assistant", "reasoning_content": 1}`, `"reasoning_content" must be a string`},
	}
	for _, tt := range tests {
		var m Message
		err := json.Unmarshal([]byte(tt.in), &m)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: got %v, want an error containing %q", tt.in, err, tt.want)
		}
	}
}
