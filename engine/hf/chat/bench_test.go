package chat

import (
	"fmt"
	"testing"
)

// longConversation is a system prompt and n user/assistant exchanges with thinking.
func longConversation(n int) []Message {
	msgs := []Message{{Role: "system", Content: Text("You are a careful assistant. Answer briefly.")}}
	for i := 0; i < n; i++ {
		msgs = append(msgs,
			Message{Role: "user", Content: Text(fmt.Sprintf("Question %d: what is %d + %d?", i, i, 2*i))},
			Message{Role: "assistant", Content: Text(fmt.Sprintf("<think>\nAdd %d and %d.\n</think>\n\n%d + %d = %d.", i, 2*i, i, 2*i, 3*i))},
		)
	}
	return msgs
}

// BenchmarkRenderQwen3 renders a 20-exchange conversation with the Qwen3 template.
func BenchmarkRenderQwen3(b *testing.B) {
	tmpl, err := Load("testdata/templates/qwen3")
	if err != nil {
		b.Fatal(err)
	}
	msgs := longConversation(20)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tmpl.Render(msgs, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAssistantSpansQwen3 finds the assistant spans of the same conversation (three
// prefix renders per assistant turn).
func BenchmarkAssistantSpansQwen3(b *testing.B) {
	tmpl, err := Load("testdata/templates/qwen3")
	if err != nil {
		b.Fatal(err)
	}
	msgs := longConversation(20)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := tmpl.AssistantSpans(msgs, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
