package chat

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type maskGolden struct {
	Case   string                     `json:"case"`
	Kwargs map[string]json.RawMessage `json:"kwargs"`
	Text   string                     `json:"text"`
	Spans  [][2]int                   `json:"spans"`
}

// TestAssistantSpansMatchGenerationMarkers checks the mask finder on templates without
// {% generation %} blocks against the spans Python jinja2 reports for the same templates
// rewritten with generation blocks around the assistant output (scripts/chat-goldens), and
// checks that the Go engine reports the same spans for the rewritten templates.
func TestAssistantSpansMatchGenerationMarkers(t *testing.T) {
	cases := loadCases(t)
	for _, name := range []string{"qwen3", "llama3"} {
		t.Run(name, func(t *testing.T) {
			tmpl, err := Load(templateDir(t, name))
			if err != nil {
				t.Fatal(err)
			}
			src, err := os.ReadFile(filepath.Join("../../../scripts/chat-goldens/templates", name+"_generation.jinja"))
			if err != nil {
				t.Fatal(err)
			}
			marked, err := FromSource(string(src), tmpl.BOS, tmpl.EOS)
			if err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(filepath.Join("testdata/golden", "masks_"+name+".json"))
			if err != nil {
				t.Fatal(err)
			}
			var goldens []maskGolden
			if err := json.Unmarshal(data, &goldens); err != nil {
				t.Fatal(err)
			}
			if len(goldens) < 10 {
				t.Fatalf("only %d mask goldens", len(goldens))
			}
			for _, g := range goldens {
				c := cases[g.Case]
				opts := caseOptions(c, false)
				for k, v := range g.Kwargs {
					if opts.Kwargs == nil {
						opts.Kwargs = map[string]any{}
					}
					opts.Kwargs[k] = v
				}
				label := g.Case
				if len(g.Kwargs) > 0 {
					label += "+kwargs"
				}
				for _, variant := range []struct {
					name string
					t    *Template
				}{{"inferred", tmpl}, {"generation-blocks", marked}} {
					text, spans, err := variant.t.AssistantSpans(c.Messages, opts)
					if err != nil {
						t.Errorf("%s (%s): %v", label, variant.name, err)
						continue
					}
					if text != g.Text {
						t.Errorf("%s (%s): text differs from jinja2:\n got %q\nwant %q", label, variant.name, text, g.Text)
						continue
					}
					var got [][2]int
					for _, s := range spans {
						got = append(got, [2]int{s.Start, s.End})
					}
					want := g.Spans
					if _, off := g.Kwargs["enable_thinking"]; off && variant.name == "inferred" {
						// With thinking off the empty think block belongs to the generation
						// prompt, so it is not output; the marked template includes it.
						want = nil
						for _, s := range g.Spans {
							if strings.HasPrefix(text[s[0]:s[1]], emptyThink) {
								s[0] += len(emptyThink)
							}
							want = append(want, s)
						}
					}
					if !equalSpans(got, want) {
						t.Errorf("%s (%s): spans %v, want %v\n got %q\nwant %q", label, variant.name, got, want, spanTexts(text, got), spanTexts(text, want))
					}
				}
			}
		})
	}
}

const emptyThink = "<think>\n\n</think>\n\n"

func equalSpans(a, b [][2]int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func spanTexts(text string, spans [][2]int) []string {
	var out []string
	for _, s := range spans {
		out = append(out, text[s[0]:s[1]])
	}
	return out
}

// TestAssistantSpansRefuse checks that conversations whose assistant output cannot be
// located give a MaskError naming the message instead of a wrong mask.
func TestAssistantSpansRefuse(t *testing.T) {
	tests := []struct {
		name    string
		src     string
		msgs    []Message
		message int
		want    string
	}{
		{
			name:    "generation prompt unlike turn header",
			src:     `{% for m in messages %}[{{ m.role }}]{{ m.content }}<|im_end|>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}`,
			msgs:    []Message{{Role: "user", Content: Text("hi")}, {Role: "assistant", Content: Text("hello")}},
			message: 1,
			want:    "unlike its generation prompt",
		},
		{
			name:    "past turn rewritten",
			src:     `{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' and not loop.last %}SUMMARY{% else %}{{ m.content }}{% endif %}<|im_end|>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}`,
			msgs:    []Message{{Role: "user", Content: Text("hi")}, {Role: "assistant", Content: Text("hello there")}, {Role: "user", Content: Text("bye")}},
			message: 1,
			want:    "neither the turn rendered last",
		},
		{
			name:    "prefix cannot render",
			src:     `{% if messages[-1].role != 'assistant' and not add_generation_prompt %}{{ raise_exception('must end with assistant') }}{% endif %}{% for m in messages %}<{{ m.role }}>{{ m.content }}<|im_end|>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}`,
			msgs:    []Message{{Role: "user", Content: Text("hi")}, {Role: "assistant", Content: Text("hello")}},
			message: 1,
			want:    "must end with assistant",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmpl, err := FromSource(tt.src, "", "")
			if err != nil {
				t.Fatal(err)
			}
			_, spans, err := tmpl.AssistantSpans(tt.msgs, Options{})
			var me *MaskError
			if !errors.As(err, &me) {
				t.Fatalf("got spans %v, err %v; want a MaskError", spans, err)
			}
			if me.Message != tt.message || !strings.Contains(me.Msg, tt.want) {
				t.Fatalf("error %v; want message %d and %q", err, tt.message, tt.want)
			}
		})
	}
}

// TestAssistantSpansOtherTemplates pins the spans found in templates with other turn
// structures: gpt-oss (past turns end with <|end|>, the last with <|return|>), GLM-5 (no
// end-of-turn marker: a turn ends with the next <|user|>; past turns lose their reasoning),
// Qwen3.5 (the generation prompt opens the think block), Ministral 3 (tool calls) and
// DeepSeek-V4.
func TestAssistantSpansOtherTemplates(t *testing.T) {
	cases := loadCases(t)
	tests := []struct {
		tmpl, conv string
		want       []string
	}{
		{"gpt_oss", "multi_turn", []string{
			"<|channel|>final<|message|>Why did the cat sit on the computer? To keep an eye on the mouse.<|end|>",
			"<|channel|>final<|message|>What do you call a pile of kittens? A meowntain.\n<|end|>"}},
		{"gpt_oss", "system_user_assistant", []string{"<|channel|>final<|message|>2 + 2 = 4.<|return|>"}},
		{"glm5", "thinking_inline", []string{"</think>x = 2.<|user|>", "\nSubtract 4.\n</think>x = 1."}},
		{"glm5", "multi_turn", []string{
			"</think>Why did the cat sit on the computer? To keep an eye on the mouse.<|user|>",
			"</think>What do you call a pile of kittens? A meowntain.<|user|>"}},
		{"qwen3_5", "system_user_assistant", []string{"\n</think>\n\n2 + 2 = 4.<|im_end|>"}},
		{"qwen3_5", "thinking_inline", []string{"x = 2.<|im_end|>", "Subtract 4.\n</think>\n\nx = 1.<|im_end|>"}},
		{"ministral3", "tool_call_object_args", []string{
			`[TOOL_CALLS]get_weather[ARGS]{"city": "Zürich", "unit": "c"}[TOOL_CALLS]add[ARGS]{"a": 2.5, "b": 1, "flags": [true, false, null], "nested": {"z": 1, "a": "é"}}</s>`,
			"It is 21°C and clear in Zürich; 2.5 + 1 = 3.5.</s>"}},
		{"deepseek_v4", "thinking_inline", []string{
			"<think>\nSubtract 3 from both sides.\n</think>\n\nx = 2.<｜end▁of▁sentence｜>",
			"<think>\nSubtract 4.\n</think>\n\nx = 1.<｜end▁of▁sentence｜>"}},
	}
	for _, tt := range tests {
		t.Run(tt.tmpl+"/"+tt.conv, func(t *testing.T) {
			tmpl, err := Load(filepath.Join("testdata/templates", tt.tmpl))
			if err != nil {
				t.Fatal(err)
			}
			c := cases[tt.conv]
			text, spans, err := tmpl.AssistantSpans(c.Messages, caseOptions(c, false))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range spans {
				got = append(got, text[s.Start:s.End])
			}
			if strings.Join(got, "\x00") != strings.Join(tt.want, "\x00") {
				t.Fatalf("spans %q, want %q", got, tt.want)
			}
		})
	}
}

// TestAssistantSpansTurnMissingFromFullRender checks a template that renders a turn when it is
// the last one but drops it from the full conversation: the mask is refused, not guessed.
func TestAssistantSpansTurnMissingFromFullRender(t *testing.T) {
	src := `{% for m in messages %}{% if m.role != 'assistant' or loop.last %}<{{ m.role }}>{{ m.content }}{% endif %}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}`
	tmpl, err := FromSource(src, "", "")
	if err != nil {
		t.Fatal(err)
	}
	msgs := []Message{{Role: "user", Content: Text("q")}, {Role: "assistant", Content: Text("first answer")}, {Role: "user", Content: Text("q2")}, {Role: "assistant", Content: Text("second")}}
	_, _, err = tmpl.AssistantSpans(msgs, Options{})
	var me *MaskError
	if !errors.As(err, &me) || me.Message != 1 {
		t.Fatalf("got %v, want a MaskError for message 1", err)
	}
}
