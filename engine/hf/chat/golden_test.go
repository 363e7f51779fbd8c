package chat

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// goldenNow is the clock the golden generator gives strftime_now (scripts/chat-goldens/gen.py).
var goldenNow = time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)

type goldenCase struct {
	Name     string                     `json:"name"`
	Messages []Message                  `json:"messages"`
	Tools    []json.RawMessage          `json:"tools"`
	Kwargs   map[string]json.RawMessage `json:"kwargs"`
}

type goldenEntry struct {
	Case                string  `json:"case"`
	AddGenerationPrompt bool    `json:"add_generation_prompt"`
	Output              *string `json:"output"`
	Error               string  `json:"error"`
}

func loadCases(t *testing.T) map[string]goldenCase {
	t.Helper()
	data, err := os.ReadFile("testdata/cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []goldenCase
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatalf("testdata/cases.json: %v", err)
	}
	out := map[string]goldenCase{}
	for _, c := range cases {
		out[c.Name] = c
	}
	return out
}

// llama3Dir is where scripts/fetch-testdata.sh puts the Llama-3 tokenizer, which may not be
// committed.
const llama3Dir = "../../../.cache/testdata/llama3"

// templateDir returns the directory of a golden template, skipping (or failing under
// HALO_CI=1) when a fetched one is missing.
func templateDir(t *testing.T, name string) string {
	t.Helper()
	if name != "llama3" {
		return filepath.Join("testdata/templates", name)
	}
	if _, err := os.Stat(filepath.Join(llama3Dir, "tokenizer_config.json")); err != nil {
		if os.Getenv("HALO_CI") == "1" {
			t.Fatalf("Llama-3 tokenizer missing at %s: run scripts/fetch-testdata.sh", llama3Dir)
		}
		t.Skipf("Llama-3 tokenizer not fetched (run scripts/fetch-testdata.sh): %v", err)
	}
	return llama3Dir
}

func caseOptions(c goldenCase, agp bool) Options {
	opts := Options{AddGenerationPrompt: agp, Tools: c.Tools, Now: func() time.Time { return goldenNow }}
	if len(c.Kwargs) > 0 {
		opts.Kwargs = map[string]any{}
		for k, v := range c.Kwargs {
			opts.Kwargs[k] = v
		}
	}
	return opts
}

// TestRenderMatchesPythonJinja2 renders every golden conversation with every template and
// compares with the text Python jinja2 produced (or the error it raised).
func TestRenderMatchesPythonJinja2(t *testing.T) {
	cases := loadCases(t)
	for _, name := range []string{"qwen3", "llama3", "deepseek_v3", "chatml_tools", "stress", "gpt_oss", "qwen3_5", "ministral3", "deepseek_v4", "glm5"} {
		t.Run(name, func(t *testing.T) {
			dir := templateDir(t, name)
			tmpl, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(filepath.Join("testdata/golden", name+".json"))
			if err != nil {
				t.Fatal(err)
			}
			var entries []goldenEntry
			if err := json.Unmarshal(data, &entries); err != nil {
				t.Fatal(err)
			}
			if len(entries) == 0 {
				t.Fatal("no golden entries")
			}
			for _, e := range entries {
				c, ok := cases[e.Case]
				if !ok {
					t.Fatalf("golden names unknown case %q", e.Case)
				}
				got, err := tmpl.Render(c.Messages, caseOptions(c, e.AddGenerationPrompt))
				label := e.Case
				if e.AddGenerationPrompt {
					label += "+gen"
				}
				if e.Output == nil {
					var re *RenderError
					if err == nil {
						t.Errorf("%s: rendered %q, want error %q", label, got, e.Error)
					} else if !errors.As(err, &re) {
						t.Errorf("%s: error %v is not a RenderError (jinja2: %s)", label, err, e.Error)
					}
					continue
				}
				if err != nil {
					t.Errorf("%s: %v", label, err)
					continue
				}
				if got != *e.Output {
					t.Errorf("%s: render differs from jinja2 at byte %d:\n got: %q\nwant: %q", label, firstDiff(got, *e.Output), got, *e.Output)
				}
			}
		})
	}
}

func firstDiff(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
