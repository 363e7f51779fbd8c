package jinja

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

func fuzzVars() map[string]Value {
	msgs, _ := FromJSON([]byte(`[{"role": "system", "content": "sys"}, {"role": "user", "content": "hi <b>"},
		{"role": "assistant", "content": "<think>\nr\n</think>\n\nok", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
		{"role": "tool", "content": [{"type": "text", "text": "t"}]}]`))
	tools, _ := FromJSON([]byte(`[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]`))
	return map[string]Value{
		"messages": msgs, "tools": tools, "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
		"strftime_now": StrftimeNow(func() time.Time { return time.Unix(0, 0).UTC() }),
	}
}

// FuzzTemplate compiles and renders arbitrary template sources: errors are fine, panics
// (reported as internal errors) and runaway output are not.
func FuzzTemplate(f *testing.F) {
	data, err := os.ReadFile("../../testdata/golden/snippets.json")
	if err != nil {
		f.Fatal(err)
	}
	var snippets []snippet
	if err := json.Unmarshal(data, &snippets); err != nil {
		f.Fatal(err)
	}
	for _, s := range snippets {
		f.Add(s.Template)
	}
	for _, dir := range []string{"qwen3", "deepseek_v3"} {
		raw, err := os.ReadFile("../../testdata/templates/" + dir + "/tokenizer_config.json")
		if err != nil {
			f.Fatal(err)
		}
		var cfg struct {
			ChatTemplate string `json:"chat_template"`
		}
		if err := json.Unmarshal(raw, &cfg); err != nil {
			f.Fatal(err)
		}
		f.Add(cfg.ChatTemplate)
	}
	f.Add("{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}")
	f.Add("{{ 'x' * 1000000000 }}")
	f.Add("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}")
	vars := fuzzVars()
	f.Fuzz(func(t *testing.T, src string) {
		tmpl, err := Compile(src)
		if err != nil {
			if strings.Contains(err.Error(), "internal error") {
				t.Fatalf("compile panicked: %v", err)
			}
			return
		}
		out, _, err := tmpl.Render(vars)
		if err != nil && strings.Contains(err.Error(), "internal error") {
			t.Fatalf("render panicked: %v", err)
		}
		if len(out) > maxOutput {
			t.Fatalf("output of %d bytes exceeds the limit", len(out))
		}
	})
}

// FuzzFromJSON decodes arbitrary bytes as a template value and prints it both ways.
func FuzzFromJSON(f *testing.F) {
	f.Add([]byte(`{"a": [1, 2.5, "x", null, true, {"b": {}}]}`))
	f.Add([]byte(`[[[[[]]]]]`))
	f.Add([]byte(`12345678901234567890123`))
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := FromJSON(data)
		if err != nil {
			return
		}
		_ = repr(v)
		var b strings.Builder
		_ = writeJSON(&b, v, &jsonOptions{itemSep: ", ", keySep: ": "}, 0)
	})
}

// FuzzStrFormat runs str.format with arbitrary format strings over values of each type.
func FuzzStrFormat(f *testing.F) {
	for _, s := range []string{"{} {}", "{0:>10}", "{:,.2f}", "{name!r:^9}", "{0[a]}{1.x}", "{:0=+8d}", "{{}}", "{:%}", "{:x}"} {
		f.Add(s)
	}
	d := NewDict()
	d.Set("a", int64(1))
	kw := NewDict()
	kw.Set("name", "n")
	args := []Value{int64(-42), 3.25, "str", d, nil, true, &List{Items: []Value{int64(1)}}}
	f.Fuzz(func(t *testing.T, format string) {
		for i := range args {
			_, _ = strFormat(format, args[i:], kw)
		}
	})
}
