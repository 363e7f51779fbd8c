// Command testsummary reads the JSON stream of `go test -json` on stdin and writes what a
// plain `go test` writes (one line per package, the full output of a failing test), then one
// line per package and skip reason naming the tests it skipped, so that a run says what it did
// not check, and a closing line "tests: N passed, N failed, N skipped".
// It exits with status 1 when a test or a package failed. scripts/test.sh runs it.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

func main() {
	failed, err := summarize(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// skip is one skipped test and the reason it logged.
type skip struct{ pkg, test, reason string }

// summarize copies r's test results to w as a plain `go test` run shows them, followed by the
// skipped tests, and reports whether anything failed.
func summarize(r io.Reader, w io.Writer) (failed bool, err error) {
	outputs := map[string][]string{} // package + test -> output lines
	var skips []skip
	var passed, failedTests int
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		line := sc.Bytes()
		var ev event
		if err := json.Unmarshal(line, &ev); err != nil || ev.Action == "" {
			// go test writes build errors as plain text.
			fmt.Fprintln(w, string(line))
			continue
		}
		key := ev.Package + " " + ev.Test
		switch ev.Action {
		case "output":
			outputs[key] = append(outputs[key], ev.Output)
		case "build-output":
			fmt.Fprint(w, ev.Output) // compiler errors
		case "build-fail":
			failed = true
		case "skip":
			if ev.Test != "" {
				skips = append(skips, skip{ev.Package, ev.Test, skipReason(outputs[key])})
			} else {
				fmt.Fprintf(w, "?   \t%s\t[no test files]\n", ev.Package)
			}
			delete(outputs, key)
		case "pass":
			if ev.Test != "" {
				passed++
			}
			if ev.Test == "" {
				fmt.Fprintf(w, "ok  \t%s\t%.3fs\n", ev.Package, ev.Elapsed)
			}
			delete(outputs, key)
		case "fail":
			failed = true
			if ev.Test != "" {
				failedTests++
				fmt.Fprint(w, strings.Join(outputs[key], ""))
			} else {
				// The package's own output: panics, TestMain's output, its FAIL line.
				out := strings.Join(outputs[key], "")
				fmt.Fprint(w, out)
				if !strings.Contains(out, "FAIL\t"+ev.Package) {
					fmt.Fprintf(w, "FAIL\t%s\t%.3fs\n", ev.Package, ev.Elapsed)
				}
			}
			delete(outputs, key)
		}
	}
	if err := sc.Err(); err != nil {
		return failed, err
	}
	writeSkips(w, skips)
	// The closing line counts tests and subtests.
	fmt.Fprintf(w, "\ntests: %d passed, %d failed, %d skipped\n", passed, failedTests, len(skips))
	return failed, nil
}

// writeSkips writes one line per package and reason: how many tests skipped, which, and why.
func writeSkips(w io.Writer, skips []skip) {
	if len(skips) == 0 {
		return
	}
	type group struct {
		pkg, reason string
		tests       []string
	}
	var groups []*group
	byKey := map[[2]string]*group{}
	for _, s := range skips {
		k := [2]string{s.pkg, s.reason}
		g := byKey[k]
		if g == nil {
			g = &group{pkg: s.pkg, reason: s.reason}
			byKey[k] = g
			groups = append(groups, g)
		}
		g.tests = append(g.tests, s.test)
	}
	sort.SliceStable(groups, func(i, j int) bool { return groups[i].pkg < groups[j].pkg })
	fmt.Fprintf(w, "\n%d test(s) skipped:\n", len(skips))
	for _, g := range groups {
		sort.Strings(g.tests)
		names := strings.Join(g.tests, ", ")
		if len(g.tests) > 3 {
			names = strings.Join(g.tests[:3], ", ") + fmt.Sprintf(" and %d more", len(g.tests)-3)
		}
		fmt.Fprintf(w, "  %s: %s: %s\n", g.pkg, names, g.reason)
	}
}

// skipReason is the message a skipped test logged ("    file_test.go:12: reason"), without
// its file and line; the last such line when it logged several.
func skipReason(lines []string) string {
	reason := "(no reason given)"
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- ") {
			continue
		}
		if file, msg, ok := strings.Cut(t, ": "); ok && strings.Contains(file, "_test.go:") {
			reason = msg
		} else if reason != "(no reason given)" {
			reason += " " + t // a message on several lines, joined
		}
	}
	return reason
}
