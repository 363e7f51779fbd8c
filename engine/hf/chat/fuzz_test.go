package chat

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

// FuzzFromConfigJSON loads arbitrary tokenizer_config.json bytes and renders a conversation
// with whatever loads: errors are fine, panics (internal errors) are not.
func FuzzFromConfigJSON(f *testing.F) {
	for _, dir := range []string{"qwen3", "deepseek_v3", "stress", "chatml_tools"} {
		data, err := os.ReadFile("testdata/templates/" + dir + "/tokenizer_config.json")
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"chat_template": [{"name": "default", "template": "{{ messages }}"}], "bos_token": {"content": "<s>"}}`))
	f.Add([]byte(`{"chat_template": null}`))
	f.Add([]byte(`[]`))
	msgs := []Message{
		{Role: "system", Content: Text("s")},
		{Role: "user", Content: Text("hello")},
		{Role: "assistant", Content: Text("<think>\nr\n</think>\n\nhi"), ToolCalls: []ToolCall{{Type: "function", Function: FunctionCall{Name: "f", Arguments: json.RawMessage(`{"x": 1}`)}}}},
		{Role: "user", Content: Parts(Part{Type: "text", Text: "again"})},
		{Role: "assistant", Content: Text("bye")},
	}
	now := func() time.Time { return time.Unix(0, 0).UTC() }
	f.Fuzz(func(t *testing.T, data []byte) {
		tmpl, err := FromConfigJSON(data)
		if err != nil {
			if strings.Contains(err.Error(), "internal error") {
				t.Fatal(err)
			}
			return
		}
		for _, agp := range []bool{false, true} {
			if _, err := tmpl.Render(msgs, Options{AddGenerationPrompt: agp, Now: now}); err != nil && strings.Contains(err.Error(), "internal error") {
				t.Fatal(err)
			}
		}
		if _, _, err := tmpl.AssistantSpans(msgs, Options{Now: now}); err != nil && strings.Contains(err.Error(), "internal error") {
			t.Fatal(err)
		}
	})
}

// FuzzMessageJSON decodes arbitrary bytes as a message list and renders it with Qwen3.
func FuzzMessageJSON(f *testing.F) {
	data, err := os.ReadFile("testdata/cases.json")
	if err != nil {
		f.Fatal(err)
	}
	var cases []struct {
		Messages json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(data, &cases); err != nil {
		f.Fatal(err)
	}
	for _, c := range cases {
		f.Add([]byte(c.Messages))
	}
	var tmpls []*Template
	for _, name := range []string{"qwen3", "glm5", "gpt_oss", "chatml_tools"} {
		tmpl, err := Load("testdata/templates/" + name)
		if err != nil {
			f.Fatal(err)
		}
		tmpls = append(tmpls, tmpl)
	}
	enc := &wordEncoder{}
	f.Fuzz(func(t *testing.T, data []byte) {
		var msgs []Message
		if err := json.Unmarshal(data, &msgs); err != nil {
			return
		}
		for _, tmpl := range tmpls {
			if _, err := tmpl.Render(msgs, Options{}); err != nil && strings.Contains(err.Error(), "internal error") {
				t.Fatal(err)
			}
			// the mask is found or refused, never a panic; found spans lie in the text, in order
			text, spans, err := tmpl.AssistantSpans(msgs, Options{})
			if err != nil {
				continue
			}
			last := 0
			for _, s := range spans {
				if s.Start < last || s.End < s.Start || s.End > len(text) {
					t.Fatalf("bad span %+v in text of %d bytes (previous end %d)", s, len(text), last)
				}
				last = s.End
			}
			if _, _, err := tmpl.Encode(plainEncoder{enc}, msgs, Options{}); err != nil {
				t.Fatalf("Encode failed where AssistantSpans succeeded: %v", err)
			}
		}
		// a message that decodes re-encodes to JSON that decodes to the same message
		out, err := json.Marshal(msgs)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		var again []Message
		if err := json.Unmarshal(out, &again); err != nil {
			t.Fatalf("re-decoding %s: %v", out, err)
		}
		out2, _ := json.Marshal(again)
		if string(out) != string(out2) {
			t.Fatalf("round trip changed the messages:\n%s\n%s", out, out2)
		}
	})
}
