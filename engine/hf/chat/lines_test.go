package chat

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestRenderLines checks the line protocol behind `halo-shell run chat-template`: a rendered
// JSON string per line, spans with their text, and errors that name the line.
func TestRenderLines(t *testing.T) {
	tmpl, err := Load("testdata/templates/qwen3")
	if err != nil {
		t.Fatal(err)
	}
	in := `[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]

{"messages": [{"role": "user", "content": "Weather?"}], "tools": [{"type": "function", "function": {"name": "w"}}]}
`
	var out bytes.Buffer
	if err := tmpl.RenderLines(strings.NewReader(in), &out, Options{}, false); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines: %q", len(lines), out.String())
	}
	var first, second string
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &second); err != nil {
		t.Fatal(err)
	}
	if want := "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n"; first != want {
		t.Errorf("line 1 = %q, want %q", first, want)
	}
	if !strings.Contains(second, `{"type": "function", "function": {"name": "w"}}`) {
		t.Errorf("line 2 lacks the tool: %q", second)
	}

	out.Reset()
	if err := tmpl.RenderLines(strings.NewReader(strings.Split(in, "\n")[0]), &out, Options{}, true); err != nil {
		t.Fatal(err)
	}
	var res struct {
		Text  string     `json:"text"`
		Spans []SpanJSON `json:"spans"`
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Spans) != 1 || res.Spans[0].Message != 1 || res.Spans[0].Text != "<think>\n\n</think>\n\nHello!<|im_end|>" || res.Text[res.Spans[0].Start:res.Spans[0].End] != res.Spans[0].Text {
		t.Errorf("spans = %+v", res.Spans)
	}

	err = tmpl.RenderLines(strings.NewReader(in+"{\"role\": \"user\"}\n"), &out, Options{}, false)
	if err == nil || !strings.HasPrefix(err.Error(), "line 4:") {
		t.Errorf("bad line: got %v, want an error for line 4", err)
	}
}

// TestEncodeLines checks the ids and mask lines of `halo-shell run chat-template --mask`.
func TestEncodeLines(t *testing.T) {
	tmpl, err := Load("testdata/templates/chatml_tools")
	if err != nil {
		t.Fatal(err)
	}
	enc := &wordEncoder{}
	in := `[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}]` + "\n"
	var out bytes.Buffer
	if err := tmpl.EncodeLines(enc, strings.NewReader(in), &out, Options{}); err != nil {
		t.Fatal(err)
	}
	var res struct {
		IDs  []int `json:"ids"`
		Mask []int `json:"mask"`
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	wantIDs, wantMask, err := tmpl.Encode(enc, []Message{{Role: "user", Content: Text("Hi")}, {Role: "assistant", Content: Text("Hello there")}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.IDs) != len(wantIDs) || len(res.Mask) != len(wantMask) {
		t.Fatalf("got %d ids and %d mask values, want %d", len(res.IDs), len(res.Mask), len(wantIDs))
	}
	ones := 0
	for i := range wantIDs {
		if res.IDs[i] != wantIDs[i] || (res.Mask[i] == 1) != wantMask[i] {
			t.Fatalf("token %d: got id %d mask %d, want %d %v", i, res.IDs[i], res.Mask[i], wantIDs[i], wantMask[i])
		}
		ones += res.Mask[i]
	}
	if ones == 0 {
		t.Fatal("no assistant tokens in the mask")
	}
}
