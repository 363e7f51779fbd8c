package chat

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoadSources checks where templates and special tokens come from: a string template, a
// list of named templates, and chat_template.jinja taking precedence over the config.
func TestLoadSources(t *testing.T) {
	tests := []struct {
		dir       string
		names     []string
		bos, eos  string
		srcPrefix string
	}{
		{"testdata/templates/qwen3", []string{"default"}, "", "<|im_end|>", "{%- if tools %}"},
		{"testdata/templates/deepseek_v3", []string{"default"}, "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "{% if not add_generation_prompt is defined %}"},
		{"testdata/templates/stress", []string{"default", "tool_use"}, "<s>", "</s>", "{#- A template written"},
		{"testdata/templates/chatml_tools", []string{"default"}, "", "<|im_end|>", "{#- ChatML with tools"},
	}
	for _, tt := range tests {
		tmpl, err := Load(tt.dir)
		if err != nil {
			t.Fatalf("%s: %v", tt.dir, err)
		}
		if got := tmpl.Names(); strings.Join(got, ",") != strings.Join(tt.names, ",") {
			t.Errorf("%s: names %v, want %v", tt.dir, got, tt.names)
		}
		if tmpl.BOS != tt.bos || tmpl.EOS != tt.eos {
			t.Errorf("%s: bos %q eos %q, want %q %q", tt.dir, tmpl.BOS, tmpl.EOS, tt.bos, tt.eos)
		}
		if !strings.HasPrefix(tmpl.Sources["default"], tt.srcPrefix) {
			t.Errorf("%s: default template starts %q, want %q", tt.dir, tmpl.Sources["default"][:min(40, len(tmpl.Sources["default"]))], tt.srcPrefix)
		}
	}
}

// TestTemplateSelection checks which named template renders: tool_use when tools are given,
// default otherwise, and an explicit name wins.
func TestTemplateSelection(t *testing.T) {
	cfg := `{"chat_template": [{"name": "default", "template": "D{{ tools is none }}"}, {"name": "tool_use", "template": "T{{ tools | length }}"}, {"name": "other", "template": "O"}]}`
	tmpl, err := FromConfigJSON([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	tool := json.RawMessage(`{"type": "function", "function": {"name": "f"}}`)
	tests := []struct {
		opts Options
		want string
	}{
		{Options{}, "DTrue"},
		{Options{Tools: []json.RawMessage{tool, tool}}, "T2"},
		{Options{TemplateName: "other", Tools: []json.RawMessage{tool}}, "O"},
		{Options{TemplateName: "default", Tools: []json.RawMessage{tool}}, "DFalse"},
	}
	for _, tt := range tests {
		got, err := tmpl.Render(nil, tt.opts)
		if err != nil || got != tt.want {
			t.Errorf("Render(%+v) = %q, %v; want %q", tt.opts, got, err, tt.want)
		}
	}
	if _, err := tmpl.Render(nil, Options{TemplateName: "missing"}); err == nil || !strings.Contains(err.Error(), `"missing"`) {
		t.Errorf("unknown template name: got %v", err)
	}
}

// TestConfigErrors checks that bad tokenizer configs fail with an error that names the key and
// the problem.
func TestConfigErrors(t *testing.T) {
	tests := []struct{ name, cfg, want string }{
		{"not json", `{"chat_template": `, "not a JSON object"},
		{"array", `[1, 2]`, "not a JSON object"},
		{"no template", `{"eos_token": "</s>"}`, "no chat_template"},
		{"template number", `{"chat_template": 7}`, `key "chat_template": expected a string or a list`},
		{"named without template", `{"chat_template": [{"name": "default"}]}`, `"chat_template"[0]`},
		{"duplicate name", `{"chat_template": [{"name": "a", "template": "x"}, {"name": "a", "template": "y"}]}`, `"a" appears twice`},
		{"bad token", `{"chat_template": "x", "eos_token": 5}`, `key "eos_token"`},
		{"bad additional tokens", `{"chat_template": "x", "additional_special_tokens": "<a>"}`, `key "additional_special_tokens"`},
		{"syntax error", `{"chat_template": "{% if x %}never closed"}`, `template "default": template syntax error: line 1`},
		{"several without default", `{"chat_template": [{"name": "a", "template": "x"}, {"name": "b", "template": "y"}]}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmpl, err := FromConfigJSON([]byte(tt.cfg))
			if tt.want == "" {
				// loads, but rendering must ask for a name
				if err != nil {
					t.Fatal(err)
				}
				_, err = tmpl.Render(nil, Options{})
				if err == nil || !strings.Contains(err.Error(), "TemplateName") {
					t.Fatalf("got %v, want an error asking for Options.TemplateName", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
	_, err := FromConfigJSON([]byte(`{}`))
	if !errors.Is(err, ErrNoTemplate) {
		t.Errorf("missing chat_template: %v is not ErrNoTemplate", err)
	}
}

// TestLoadErrors checks the errors of Load for directories without a usable template.
func TestLoadErrors(t *testing.T) {
	empty := t.TempDir()
	_, err := Load(empty)
	if !errors.Is(err, ErrNoTemplate) || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), empty) {
		t.Errorf("empty dir: %v", err)
	}
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "tokenizer_config.json"), []byte(`{"chat_template": "{{ x"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(bad)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(bad, "tokenizer_config.json")) || !strings.Contains(err.Error(), "not closed") {
		t.Errorf("bad template: %v", err)
	}
	// chat_template.jinja alone is enough, and overrides the config's template
	only := t.TempDir()
	if err := os.WriteFile(filepath.Join(only, "chat_template.jinja"), []byte("{% for m in messages %}{{ m.content }}{% endfor %}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tmpl, err := Load(only)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := tmpl.Render([]Message{{Role: "user", Content: Text("x")}, {Role: "assistant", Content: Text("y")}}, Options{}); err != nil || got != "xy" {
		t.Errorf("chat_template.jinja render = %q, %v", got, err)
	}
}

// TestRenderErrorKinds checks that template failures report the Python exception jinja2
// raises in the same place.
func TestRenderErrorKinds(t *testing.T) {
	tests := []struct{ src, kind, msg string }{
		{"{{ raise_exception('Conversation roles must alternate') }}", "TemplateError", "Conversation roles must alternate"},
		{"{{ messages[5].content }}", "UndefinedError", "no element 5"},
		{"{{ 'a' + 1 }}", "TypeError", "can only concatenate"},
		{"{% set m = [] %}{{ m.append(1) }}", "SecurityError", "unsafe"},
	}
	for _, tt := range tests {
		tmpl, err := FromSource(tt.src, "", "")
		if err != nil {
			t.Fatal(err)
		}
		_, err = tmpl.Render(nil, Options{})
		var re *RenderError
		if !errors.As(err, &re) || re.Kind != tt.kind || !strings.Contains(re.Msg, tt.msg) {
			t.Errorf("%s: got %v, want %s containing %q", tt.src, err, tt.kind, tt.msg)
		}
	}
}

// TestKwargsGoValues checks template variables given as Go values and as raw JSON.
func TestKwargsGoValues(t *testing.T) {
	tmpl, err := FromSource(`{{ flag }}|{{ n + 1 }}|{{ f }}|{{ names | join(',') }}|{{ m.b }}{{ m | tojson }}|{{ raw.x[1] }}|{{ nothing is none }}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	got, err := tmpl.Render(nil, Options{Kwargs: map[string]any{
		"flag": false, "n": 41, "f": 2.0, "names": []string{"a", "b"}, "m": map[string]int{"b": 2, "a": 1},
		"raw": json.RawMessage(`{"x": [1, 2.5]}`), "nothing": nil,
	}})
	if err != nil {
		t.Fatal(err)
	}
	if want := `False|42|2.0|a,b|2{"a": 1, "b": 2}|2.5|True`; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if _, err := tmpl.Render(nil, Options{Kwargs: map[string]any{"raw": json.RawMessage(`{bad`)}}); err == nil || !strings.Contains(err.Error(), `template argument "raw"`) {
		t.Fatalf("bad raw kwarg: %v", err)
	}
}
