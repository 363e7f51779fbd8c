package kernel

import (
	"os"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/cell"
)

// The README's Jupyter paragraph names every magic that %help lists (both come from cell's
// command table; the README is written by hand).
func TestREADMENamesEveryMagic(t *testing.T) {
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(raw)
	i := strings.Index(s, "\nJupyter: ")
	if i < 0 {
		t.Fatal("README has no paragraph starting \"Jupyter: \"")
	}
	para, _, _ := strings.Cut(s[i+1:], "\n\n")
	for _, c := range cell.Commands() {
		if !strings.Contains(para, "`%"+c.Name+"`") && !strings.Contains(para, "`%"+c.Name+" ") {
			t.Errorf("the README's Jupyter paragraph does not name %%%s (%s)", c.Name, c.Summary)
		}
	}
}
