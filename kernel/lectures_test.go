package kernel

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/cell/halo"
)

// lecturesOut, when set, is a directory each executed lecture notebook is copied into, to read
// its measurements and verdicts: go test ./kernel -run TestLectureNotebooks -lectures-out DIR.
var lecturesOut = flag.String("lectures-out", "", "copy each executed lecture notebook into this directory")

// lecturesExecutor picks what executes the lecture notebooks: Python's nbclient, halo-shell's
// own executor (halo-shell notebook run, package kernel/nbrun), or auto: nbclient where
// python3 has it, else halo-shell's.
var lecturesExecutor = flag.String("lectures-executor", "auto", "execute the lecture notebooks with nbclient, go (halo-shell notebook run) or auto (nbclient when python3 has it)")

var (
	nbclientOnce sync.Once
	nbclientOK   bool
)

// lectureExecutor resolves -lectures-executor.
func lectureExecutor(t *testing.T) string {
	t.Helper()
	switch *lecturesExecutor {
	case "nbclient":
		needJupyter(t)
		return "nbclient"
	case "go":
		return "go"
	case "auto":
		nbclientOnce.Do(func() {
			nbclientOK = exec.Command(python, "-c", "import nbclient, nbformat").Run() == nil
		})
		if nbclientOK {
			return "nbclient"
		}
		return "go"
	}
	t.Fatalf("-lectures-executor %q: want nbclient, go or auto", *lecturesExecutor)
	return ""
}

// lectureNotebookLimit bounds one lecture notebook's run; they are written to finish in well
// under 90 seconds on a 2-core CPU.
const lectureNotebookLimit = 4 * time.Minute

// TestLectureNotebooks runs every notebooks/NN-*.ipynb headless against a session on this
// machine's device, with nbclient where python3 has it and with `halo-shell notebook run`
// otherwise (-lectures-executor chooses), and fails on a cell error, on a claim whose verdict
// could not be computed (halo.VerdictUnknownMarker), and on a notebook that checks no claim
// at all.
func TestLectureNotebooks(t *testing.T) {
	executor := lectureExecutor(t)
	t.Logf("executing the lecture notebooks with %s", executor)
	root := repoRoot(t)
	nbs, err := filepath.Glob(filepath.Join(root, "notebooks", "[0-9][0-9]-*.ipynb"))
	if err != nil {
		t.Fatal(err)
	}
	if len(nbs) == 0 {
		t.Fatal("no lecture notebooks (notebooks/NN-*.ipynb)")
	}
	script, _ := filepath.Abs("testdata/run_notebook.py")
	for _, nbPath := range nbs {
		name := strings.TrimSuffix(filepath.Base(nbPath), ".ipynb")
		t.Run(name, func(t *testing.T) {
			// A session of its own: the previous notebook's kernel may still hold control of a
			// shared one for a few seconds after it exits, and measurements are control calls.
			env, tmp := jupyterEnv(t)
			executed := filepath.Join(tmp, name+".executed.ipynb")
			start := time.Now()
			if executor == "nbclient" {
				runPython(t, env, root, lectureNotebookLimit, script, nbPath, executed, root)
			} else {
				runNotebookCommand(t, env, root, nbPath, executed)
			}
			t.Logf("%s ran in %.1fs", name, time.Since(start).Seconds())
			b, err := os.ReadFile(executed)
			if err != nil {
				t.Fatal(err)
			}
			if *lecturesOut != "" {
				if err := os.MkdirAll(*lecturesOut, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(*lecturesOut, name+".ipynb"), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for _, p := range lectureProblems(b) {
				t.Error(p)
			}
		})
	}
}

// runNotebookCommand executes nbPath into executed with `halo-shell notebook run`. A run that
// fails still writes the notebook up to the failing cell, whose error lectureProblems reports;
// the command's own message is reported when the notebook names no problem.
func runNotebookCommand(t *testing.T, env []string, root, nbPath, executed string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), lectureNotebookLimit+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, haloBinary(t), "notebook", "run", nbPath, "--out", executed,
		"--timeout", lectureNotebookLimit.String(), "--dir", root)
	cmd.Env, cmd.Dir = env, root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if testing.Verbose() || err != nil {
		t.Logf("halo-shell notebook run: %v\n%s", err, stderr.String())
	}
	b, rerr := os.ReadFile(executed)
	if rerr != nil {
		t.Fatalf("halo-shell notebook run wrote no notebook (%v): %v\n%s", rerr, err, stderr.String())
	}
	if err != nil && len(lectureProblems(b)) == 0 {
		t.Errorf("halo-shell notebook run failed: %v\n%s", err, stderr.String())
	}
}

// lectureProblems lists what is wrong with an executed lecture notebook: failed cells,
// verdicts that could not be computed, and no verdict at all.
func lectureProblems(executed []byte) []string {
	var nb notebook
	if err := json.Unmarshal(executed, &nb); err != nil {
		return []string{"reading the executed notebook: " + err.Error()}
	}
	var problems []string
	verdicts := 0
	for _, c := range nb.Cells {
		if c.CellType != "code" {
			continue
		}
		first := strings.SplitN(joined(c.Source), "\n", 2)[0]
		for _, o := range c.Outputs {
			if o.OutputType == "error" {
				problems = append(problems, fmt.Sprintf("cell %q failed: %s: %s", first, o.Ename, o.Evalue))
			}
			text := joined(o.Text)
			if v, ok := o.Data["text/plain"]; ok {
				text += "\n" + joined(v)
			}
			for _, line := range strings.Split(text, "\n") {
				switch {
				case strings.HasPrefix(line, halo.VerdictUnknownMarker):
					problems = append(problems, fmt.Sprintf("cell %q could not compute a verdict: %s", first, line))
				case strings.HasPrefix(line, "verdict: holds here: "), strings.HasPrefix(line, "verdict: differs here, because "):
					verdicts++
				}
			}
		}
	}
	if verdicts == 0 {
		problems = append(problems, "the notebook printed no verdict: every lecture checks its claims on the reader's machine")
	}
	return problems
}

// TestLectureProblems checks the checker on hand-made executed notebooks.
func TestLectureProblems(t *testing.T) {
	for _, tc := range []struct {
		name     string
		outputs  string
		problems int
	}{
		{"verdicts", `[{"output_type":"stream","name":"stdout","text":["verdict: holds here: x (1)\n","verdict: differs here, because y (claim: z)\n"]}]`, 0},
		{"unknown", `[{"output_type":"stream","name":"stdout","text":"verdict: holds here: x\nverdict: unknown: y (no samples)\n"}]`, 1},
		{"error", `[{"output_type":"stream","name":"stdout","text":"verdict: holds here: x\n"},{"output_type":"error","ename":"SessionError","evalue":"boom"}]`, 1},
		{"no verdict", `[{"output_type":"execute_result","data":{"text/plain":"42"}}]`, 1},
		{"unreadable", `[`, 1},
	} {
		nb := `{"cells":[{"cell_type":"code","source":"fmt.Println()","outputs":` + tc.outputs + `}]}`
		if got := lectureProblems([]byte(nb)); len(got) != tc.problems {
			t.Errorf("%s: problems %q, want %d", tc.name, got, tc.problems)
		}
	}
}

// TestLecturesHaveNotebooks checks that every lecture text (lectures/NN-name.md) has its notebook
// (notebooks/NN-name.ipynb) and the other way round, that each text links its notebook, and that
// the lectures' README lists every lecture.
func TestLecturesHaveNotebooks(t *testing.T) {
	root := repoRoot(t)
	names := func(pattern, ext string) map[string]bool {
		files, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, f := range files {
			out[strings.TrimSuffix(filepath.Base(f), ext)] = true
		}
		return out
	}
	texts := names("lectures/[0-9][0-9]-*.md", ".md")
	nbs := names("notebooks/[0-9][0-9]-*.ipynb", ".ipynb")
	if len(texts) == 0 {
		t.Fatal("no lectures (lectures/NN-*.md)")
	}
	index, err := os.ReadFile(filepath.Join(root, "lectures", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for name := range texts {
		if !nbs[name] {
			t.Errorf("lectures/%s.md has no notebook notebooks/%s.ipynb", name, name)
		}
		text, err := os.ReadFile(filepath.Join(root, "lectures", name+".md"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(text), "../notebooks/"+name+".ipynb") {
			t.Errorf("lectures/%s.md does not link its notebook ../notebooks/%s.ipynb", name, name)
		}
		if !strings.Contains(string(index), "("+name+".md)") {
			t.Errorf("lectures/README.md does not list %s.md", name)
		}
	}
	for name := range nbs {
		if !texts[name] {
			t.Errorf("notebooks/%s.ipynb has no lecture text lectures/%s.md", name, name)
		}
	}
}
