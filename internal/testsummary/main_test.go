package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/summary.golden")

// testdata/stream.jsonl is `go test -json` of a package with a passing, a failing, three
// skipped tests (two for the same reason), a skipped subtest and a skip without a reason.
func TestSummaryListsEverySkipWithItsReason(t *testing.T) {
	in, err := os.Open(filepath.Join("testdata", "stream.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var out bytes.Buffer
	failed, err := summarize(in, &out)
	if err != nil {
		t.Fatal(err)
	}
	if !failed {
		t.Error("a failing test was not reported as a failure")
	}
	golden := filepath.Join("testdata", "summary.golden")
	if *update {
		if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), want) {
		t.Errorf("summary:\n%s\nwant (testdata/summary.golden; -update rewrites it):\n%s", out.Bytes(), want)
	}
}

func TestSkipReasonDropsFileAndLine(t *testing.T) {
	for _, tc := range []struct {
		lines []string
		want  string
	}{
		{[]string{"=== RUN   TestX\n", "    x_test.go:7: needs a GPU\n", "--- SKIP: TestX (0.00s)\n"}, "needs a GPU"},
		{[]string{"=== RUN   TestX\n", "--- SKIP: TestX (0.00s)\n"}, "(no reason given)"},
		{[]string{"    x_test.go:7: first\n", "    x_test.go:9: the reason: a b\n"}, "the reason: a b"},
	} {
		if got := skipReason(tc.lines); got != tc.want {
			t.Errorf("skipReason(%q) = %q, want %q", tc.lines, got, tc.want)
		}
	}
}
