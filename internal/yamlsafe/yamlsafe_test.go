package yamlsafe

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/goccy/go-yaml"
)

// bomb is an alias bomb: levels anchors, each a list of width aliases of the one before.
func bomb(levels, width int) string {
	var b strings.Builder
	b.WriteString("init:\n  overrides:\n    l0: &l0 [" + strings.TrimSuffix(strings.Repeat("x, ", width), ", ") + "]\n")
	for i := 1; i < levels; i++ {
		refs := strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*l%d, ", i-1), width), ", ")
		fmt.Fprintf(&b, "    l%d: &l%d [%s]\n", i, i, refs)
	}
	return b.String()
}

func TestCheckRefusesHostileDocuments(t *testing.T) {
	deepBlock := func(n int) string {
		var b strings.Builder
		for i := range n {
			b.WriteString(strings.Repeat(" ", i) + "k:\n")
		}
		return b.String()
	}
	cases := []struct {
		name  string
		src   string
		limit string // "" when accepted
		msg   string
	}{
		{"a config", "method: sft\ninit: {arch: qwen3, overrides: {hidden_size: 64}}\ndataset:\n  path: [a.jsonl, b.jsonl]\n", "", ""},
		{"a few aliases", "base: &b {lr: 1, wd: 2}\nrun1: *b\nrun2:\n  <<: *b\n  lr: 3\n", "", ""},
		{"alias bomb of nine levels of ten", bomb(9, 10), "MaxNodes", "aliases expand the document to more than 100000 nodes at *l"},
		{"aliases doubling over 20 levels", "a: &a {x: 1, y: 2, z: 3, w: 4}\n" + doubling(20), "MaxNodes", "aliases expand"},
		{"merge keys of a large mapping", "base: &b {k: [" + strings.Repeat("1, ", 5000) + "1]}\n" + merges(30), "MaxNodes", "aliases expand the document to more than 100000 nodes at *b"},
		{"deep flow nesting of 400 KB", "a: " + strings.Repeat("[", 200000) + strings.Repeat("]", 200000) + "\n", "MaxBytes", "the document has 400004 bytes"},
		{"deep flow nesting", "a: " + strings.Repeat("[", 30000) + strings.Repeat("]", 30000) + "\n", "MaxDepth", "collections nest 65 deep"},
		{"deep flow mappings", strings.Repeat("{a: ", 100) + "1" + strings.Repeat("}", 100), "MaxDepth", "collections nest 65 deep"},
		{"deep block nesting", deepBlock(100), "MaxDepth", "collections nest 65 deep"},
		{"nested block sequences on one line", strings.Repeat("- ", 80) + "x\n", "MaxDepth", "collections nest 65 deep"},
		{"depth 60 is fine", "a: " + strings.Repeat("[", 60) + strings.Repeat("]", 60) + "\n", "", ""},
		{"a large document", "a: " + strings.Repeat("x", 100000) + "\n", "MaxBytes", "the document has 100004 bytes"},
		{"many plain nodes", "a: [" + strings.Repeat("1,", 150000) + "1]\n", "MaxBytes", "the document has 300007 bytes"},
		{"many plain nodes within MaxBytes", "a: [" + strings.Repeat("1,", 30000) + "1]\n", "", ""},
		{"brackets inside strings are not nesting", "a: \"" + strings.Repeat("[", 1000) + "\"\nb: '" + strings.Repeat("{", 1000) + "'\n", "", ""},
		{"an anchor defined twice", "a: &x [1]\nb: &x [2]\n", "", "anchor &x is defined again (first at line 1)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			err := Check([]byte(tc.src), Limits{})
			var le *LimitError
			switch {
			case tc.limit == "" && tc.msg == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.limit != "" && !errors.As(err, &le):
				t.Fatalf("err = %v, want a *LimitError", err)
			case tc.limit != "" && le.Limit != tc.limit:
				t.Fatalf("limit %s broken, want %s: %v", le.Limit, tc.limit, err)
			case tc.msg != "" && (err == nil || !strings.Contains(err.Error(), tc.msg)):
				t.Fatalf("err = %v, want one containing %q", err, tc.msg)
			}
			if tc.limit != "" && !strings.Contains(err.Error(), "yamlsafe "+tc.limit) {
				t.Errorf("the error does not name the limit: %v", err)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("Check took %v", d)
			}
		})
	}
}

// merges makes n mappings that each merge the anchor b.
func merges(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "c%d: {<<: *b}\n", i)
	}
	return b.String()
}

// doubling makes levels mappings, each holding the previous one twice.
func doubling(levels int) string {
	var b strings.Builder
	prev := "a"
	for i := range levels {
		name := fmt.Sprintf("m%d", i)
		fmt.Fprintf(&b, "%s: &%s {p: *%s, q: *%s}\n", name, name, prev, prev)
		prev = name
	}
	return b.String()
}

func TestCheckLocatesTheBrokenLimit(t *testing.T) {
	err := Check([]byte(bomb(9, 10)), Limits{})
	var le *LimitError
	if !errors.As(err, &le) || le.Line < 3 || le.Column == 0 {
		t.Fatalf("err = %#v, want a position inside the bomb", err)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("line %d, column %d", le.Line, le.Column)) {
		t.Errorf("the message does not give the position: %v", err)
	}
}

func TestAliasSizeDoesNotDependOnDecodeOrder(t *testing.T) {
	// A struct is decoded field by field, so an alias may be decoded before the anchor it
	// names; a forward reference is counted as what it stands for.
	src := "z: [*big, *big, *big, *big, *big, *big, *big, *big, *big, *big, *big, *big]\nbig: &big [" +
		strings.TrimSuffix(strings.Repeat("1, ", 10000), ", ") + "]\n"
	err := Check([]byte(src), Limits{})
	var le *LimitError
	if !errors.As(err, &le) || le.Limit != "MaxNodes" {
		t.Fatalf("err = %v, want MaxNodes broken by the forward aliases", err)
	}
	// Without aliases the limit counts plain nodes.
	err = Check([]byte("a: ["+strings.Repeat("1,", 3000)+"1]\n"), Limits{MaxNodes: 2000})
	if !errors.As(err, &le) || le.Limit != "MaxNodes" || !strings.Contains(err.Error(), "the document has more than 2000 nodes") {
		t.Fatalf("err = %v, want the plain MaxNodes message", err)
	}
}

func TestUnmarshalOneDocument(t *testing.T) {
	type cfg struct {
		A int `yaml:"a"`
		B int `yaml:"b"`
	}
	cases := []struct {
		src  string
		want cfg
		err  string
	}{
		{"a: 1\nb: 2\n", cfg{1, 2}, ""},
		{"---\na: 1\n", cfg{A: 1}, ""},
		{"a: 1\n...\n", cfg{A: 1}, ""},
		{"a: 1\n---\n", cfg{A: 1}, ""},
		{"a: 1\n---\n# nothing but a comment\n", cfg{A: 1}, ""},
		{"", cfg{}, ""},
		{"# only a comment\n", cfg{}, ""},
		{"a: 1\n---\nb: 2\n", cfg{}, "line 2, column 1: a second YAML document starts here"},
		{"a: 1\n---\nb: 2\n---\nb: 3\n", cfg{}, "(3 documents)"},
		{"a: 1\nc: 2\n", cfg{}, `unknown field "c"`},
		{bomb(9, 10), cfg{}, "MaxNodes"},
	}
	for _, tc := range cases {
		var got cfg
		err := Unmarshal([]byte(tc.src), &got, yaml.DisallowUnknownField())
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("Unmarshal(%q) err = %v, want %q", tc.src, err, tc.err)
			continue
		}
		if tc.err == "" && got != tc.want {
			t.Errorf("Unmarshal(%q) = %+v, want %+v", tc.src, got, tc.want)
		}
	}
}

func TestReadFileBounds(t *testing.T) {
	dir := t.TempDir()
	small := filepath.Join(dir, "small.yaml")
	os.WriteFile(small, []byte("a: 1\n"), 0o644)
	if b, err := ReadFile(small, 0); err != nil || string(b) != "a: 1\n" {
		t.Fatalf("ReadFile(small) = %q, %v", b, err)
	}
	big := filepath.Join(dir, "big.yaml")
	os.WriteFile(big, make([]byte, 2000), 0o644)
	var le *LimitError
	if _, err := ReadFile(big, 1000); !errors.As(err, &le) || le.Limit != "MaxBytes" {
		t.Fatalf("ReadFile(big) err = %v, want MaxBytes", err)
	}
	if _, err := ReadFile("/dev/zero", 1000); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("ReadFile(/dev/zero) err = %v, want ErrNotRegular", err)
	}
	if _, err := ReadFile(dir, 1000); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("ReadFile(dir) err = %v, want ErrNotRegular", err)
	}
	// A pipe is read, up to the limit (process substitution: launch sft <(...)).
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skip("no mkfifo:", err)
	}
	go func() {
		f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
		if err == nil {
			f.Write(make([]byte, 5000))
			f.Close()
		}
	}()
	if _, err := ReadFile(fifo, 1000); !errors.As(err, &le) {
		t.Fatalf("ReadFile(fifo of 5000 bytes) err = %v, want MaxBytes", err)
	}
}

// expanded counts the nodes of a decoded value as a consumer walking it would, stopping at
// budget+1.
func expanded(v any, budget int64) int64 {
	var n int64
	var walk func(v any)
	walk = func(v any) {
		if n > budget {
			return
		}
		n++
		rv := reflect.ValueOf(v)
		switch rv.Kind() {
		case reflect.Map:
			for _, k := range rv.MapKeys() {
				n++
				walk(rv.MapIndex(k).Interface())
			}
		case reflect.Slice:
			for i := range rv.Len() {
				walk(rv.Index(i).Interface())
			}
		}
	}
	walk(v)
	return n
}

// FuzzUnmarshal checks that no input panics or runs away, and that an accepted document
// decodes to a value a consumer can walk within the node limit.
func FuzzUnmarshal(f *testing.F) {
	for _, s := range []string{"a: 1\n", bomb(4, 5), doubling(3), "a: [[[[1]]]]\n", "- - - x\n", "a: &a [1]\nb: *a\n",
		"z: *big\nbig: &big [1, 2]\n", "a: 1\n---\nb: 2\n", "{a: [b, {c: d}]}", "a: !!str 1\nb: |\n  text\n"} {
		f.Add([]byte(s))
	}
	lim := Limits{MaxBytes: 4096, MaxDepth: 16, MaxNodes: 2000}
	f.Fuzz(func(t *testing.T, src []byte) {
		var v any
		if err := UnmarshalLimits(src, &v, lim); err != nil {
			return
		}
		if n := expanded(v, 4*lim.MaxNodes); n > 4*lim.MaxNodes {
			t.Fatalf("accepted a document that decodes to more than %d nodes", n)
		}
	})
}
