package jinja

import (
	"encoding/json"
	"os"
	"sort"
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

// FuzzBuiltins calls filters, tests and methods with arguments drawn from a pool of values of
// every type, steered by the fuzzer's bytes: errors are fine, panics are not.
func FuzzBuiltins(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7})
	f.Add([]byte{200, 13, 7, 1, 99, 250, 3})
	d := NewDict()
	d.Set("a", int64(1))
	d.Set("b", &List{Items: []Value{"x", 2.5}})
	pool := []Value{nil, true, false, int64(0), int64(-3), int64(7), int64(1 << 40), 2.5, -0.0, "", "a", "Hello World ß İ",
		"  x\ny  ", "%s %d", "{} {0} {x}", "{:>5}", "a,b", &List{}, &List{Items: []Value{int64(3), int64(1)}},
		&List{Items: []Value{"b", "A"}, Tuple: true}, d, &Undefined{hint: "u"}, &List{Items: []Value{d, d}}}
	var filterNames, methodNames []string
	for name := range filters {
		filterNames = append(filterNames, name)
	}
	for name := range strMethods {
		methodNames = append(methodNames, name)
	}
	sort.Strings(filterNames)
	sort.Strings(methodNames)
	tests := []string{"defined", "none", "odd", "divisibleby", "sameas", "lower", "in", "eq", "lt", "iterable", "string"}
	kwNames := []string{"attribute", "default", "reverse", "case_sensitive", "indent", "separators", "sort_keys", "width", "first", "blank", "boolean", "count"}
	r := &renderer{out: &strings.Builder{}}
	f.Fuzz(func(t *testing.T, data []byte) {
		next := func() int {
			if len(data) == 0 {
				return 0
			}
			b := int(data[0])
			data = data[1:]
			return b
		}
		for len(data) > 0 {
			kind := next() % 4
			v := pool[next()%len(pool)]
			var args []Value
			for n := next() % 4; n > 0; n-- {
				args = append(args, pool[next()%len(pool)])
			}
			kw := NewDict()
			if next()%3 == 0 {
				kw.Set(kwNames[next()%len(kwNames)], pool[next()%len(pool)])
			}
			switch kind {
			case 0:
				_, _ = filters[filterNames[next()%len(filterNames)]](r, v, args, kw)
			case 1:
				_, _ = r.runTest(tests[next()%len(tests)], v, args)
			case 2:
				if s, ok := v.(string); ok {
					_, _ = strMethod(r, s, methodNames[next()%len(methodNames)], args, kw)
				}
			case 3:
				for _, m := range []string{"items", "keys", "values", "get", "copy", "index", "count"} {
					if bm, err := getAttrOnly(v, m); err == nil && bm != nil {
						_, _ = r.call(bm, args, kw)
					}
				}
				for _, op := range []string{"+", "-", "*", "/", "//", "%", "**", "~"} {
					if len(args) > 0 {
						_, _ = binaryOp(op, v, args[0])
					}
				}
			}
		}
	})
}
