package jinja

import (
	"encoding/json"
	"os"
	"testing"
	"time"
)

type snippet struct {
	Name     string                     `json:"name"`
	Template string                     `json:"template"`
	Vars     map[string]json.RawMessage `json:"vars"`
	Output   *string                    `json:"output"`
	Error    string                     `json:"error"`
}

// TestSnippetsMatchPythonJinja2 renders each snippet of scripts/chat-goldens/snippets.py
// and compares with Python jinja2's output or error.
func TestSnippetsMatchPythonJinja2(t *testing.T) {
	testGoldenSnippets(t, "snippets.json")
}

// TestWhitespaceMatchesPythonJinja2 renders random nestings of blocks, expressions, comments
// and raw blocks with every whitespace-control marker (gen.py makes them with a fixed seed).
func TestWhitespaceMatchesPythonJinja2(t *testing.T) {
	testGoldenSnippets(t, "whitespace.json")
}

func testGoldenSnippets(t *testing.T, file string) {
	data, err := os.ReadFile("../../testdata/golden/" + file)
	if err != nil {
		t.Fatal(err)
	}
	var snippets []snippet
	if err := json.Unmarshal(data, &snippets); err != nil {
		t.Fatal(err)
	}
	if len(snippets) < 50 {
		t.Fatalf("only %d snippets", len(snippets))
	}
	now := time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)
	for _, s := range snippets {
		t.Run(s.Name, func(t *testing.T) {
			vars := map[string]Value{"strftime_now": StrftimeNow(func() time.Time { return now })}
			for k, raw := range s.Vars {
				v, err := FromJSON(raw)
				if err != nil {
					t.Fatal(err)
				}
				vars[k] = v
			}
			tmpl, err := Compile(s.Template)
			var got string
			if err == nil {
				got, _, err = tmpl.Render(vars)
			}
			if s.Output == nil {
				if err == nil {
					t.Fatalf("rendered %q; jinja2 raised %s", got, s.Error)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v; jinja2 rendered %q", err, *s.Output)
			}
			if got != *s.Output {
				t.Fatalf("differs from jinja2:\n got: %q\nwant: %q", got, *s.Output)
			}
		})
	}
}

// TestExpressionsMatchPythonJinja2 renders random expressions over the values, operators,
// filters, tests and methods chat templates use (gen.py makes them with a fixed seed); where
// jinja2 raised, the engine must fail too.
func TestExpressionsMatchPythonJinja2(t *testing.T) {
	testGoldenSnippets(t, "expressions.json")
}

// TestProgramsMatchPythonJinja2 renders random statement sequences that stress scoping (set
// in loops, conditionals and macros, namespaces, loop variables, break and continue) and
// random nestings of macros, call, filter, set and with blocks.
func TestProgramsMatchPythonJinja2(t *testing.T) {
	testGoldenSnippets(t, "programs.json")
}
