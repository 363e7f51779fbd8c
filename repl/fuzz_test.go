package repl

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func FuzzLoadHistory(f *testing.F) {
	for _, s := range []string{":step 2\nx := 1\n", "\"multi\\nline\"\n", "\"bad\n", "", "\n\n\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, content string) {
		path := filepath.Join(t.TempDir(), "h")
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		h, err := LoadHistory(path)
		if err != nil {
			t.Fatal(err)
		}
		if h.Len() > MaxHistory {
			t.Fatalf("%d entries", h.Len())
		}
		for _, e := range h.Entries() {
			if e == "" {
				t.Fatal("empty entry")
			}
		}
		// What is added comes back after a reload.
		h.Add("added\nline")
		h2, err := LoadHistory(path)
		if err != nil || h2.Len() == 0 || h2.At(0) != "added\nline" {
			t.Fatalf("reload: %v, newest %q", err, strings.Join(h2.Entries(), "|"))
		}
	})
}
