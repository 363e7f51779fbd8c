package cell

import (
	"strings"
	"testing"
)

func FuzzParseCommand(f *testing.F) {
	for _, s := range []string{":step 10", "%set lr=1e-5 max_grad_norm=0.5", ":generate \"a\\nb\"", ":", "%", ":help set", ":save  a  b", ":set =", ":step 99999999999999999999", ":plot lr"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		c, err := ParseCommand(line)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if lookup(c.Name) == nil {
			t.Fatalf("accepted unknown command %q", c.Name)
		}
		if c.N < 0 || c.N > maxCount {
			t.Fatalf("count %d out of range", c.N)
		}
	})
}

func FuzzSplitCell(f *testing.F) {
	for _, s := range []string{"x := 1\nfor i := 0; i < 3; i++ {\n}\n", "import \"fmt\"\nfunc (t T) M() {}\nfunc() {}()", "a := `raw", "/* c", "if x; y {", "})]", "x := []int{1,2}[0]; y := 2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		IsComplete(src) // must not panic
		chunks, err := splitCell(src)
		if err != nil {
			return
		}
		for _, c := range chunks {
			if c.line < 1 || c.col < 1 {
				t.Fatalf("chunk %q at %d:%d", c.src, c.line, c.col)
			}
			if !strings.Contains(src, c.src) {
				t.Fatalf("chunk %q is not part of the cell", c.src)
			}
		}
	})
}
