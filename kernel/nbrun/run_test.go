package nbrun

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/kernel/internal/wire"
	"github.com/halo-shell/halo-shell/session"
)

var update = flag.Bool("update", false, "rewrite testdata/small.golden.ipynb from this run")

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// haloBinary builds cmd/halo-shell once: the kernel these tests run is the one the
// kernelspec starts.
func haloBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "nbrun-bin")
		if buildErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, "halo-shell"), "../../cmd/halo-shell").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "halo-shell")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// kernelOptions are options that run the halo kernel with a private session directory,
// whose sessions are stopped at the end.
func kernelOptions(t *testing.T) Options {
	t.Helper()
	exe := haloBinary(t)
	dir, err := os.MkdirTemp("", "nbr") // short: session sockets live under it
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("HALO_SESSION_DIR", dir)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if infos, err := session.List(ctx); err == nil {
			for _, in := range infos {
				_, _ = session.Stop(ctx, in.Name, 20*time.Second)
			}
		}
		os.RemoveAll(dir)
	})
	var log bytes.Buffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kernel log:\n%s", log.String())
		}
	})
	return Options{Kernel: []string{exe, "kernel", "--connection-file", ConnectionFileArg}, KernelName: "halo",
		Env: append(os.Environ(), "HALO_SESSION_DIR="+dir), Timeout: 2 * time.Minute, KernelLog: &syncWriter{w: &log}}
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func readNotebook(t *testing.T, path string) *Notebook {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	nb, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return nb
}

// TestRunSmallNotebookMatchesGolden runs testdata/small.ipynb on the halo kernel: stdout,
// stderr, an execute_result, a display with PNG and SVG, markdown and raw cells and their
// metadata kept, an empty code cell skipped and its stale output cleared, timings recorded.
// The written notebook is compared with testdata/small.golden.ipynb (images, the Go version
// and timings replaced by descriptions), and, where Python's nbformat is installed, validated by it and found to
// be written exactly as nbformat writes it.
func TestRunSmallNotebookMatchesGolden(t *testing.T) {
	o := kernelOptions(t)
	nb := readNotebook(t, "testdata/small.ipynb")
	var ran []string
	o.OnCell = func(i int, c *Cell, _ time.Duration, err error) {
		ran = append(ran, fmt.Sprintf("%d:%s:%v", i, c.ID, err))
	}
	res, err := Run(context.Background(), nb, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Ran != 4 || len(res.Failed) != 0 || strings.Join(ran, " ") != "2:print:<nil> 3:result:<nil> 5:plot:<nil> 6:stderr:<nil>" {
		t.Fatalf("result %+v, cells %v", res, ran)
	}
	out, err := nb.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	checkWithNbformat(t, out)
	got := normalize(t, out)
	golden := "testdata/small.golden.ipynb"
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (make it with -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the executed notebook differs from %s (rerun with -update if intended):\n%s", golden, got)
	}
}

// normalize replaces the executed notebook's PNG and SVG data by a line saying what they are
// (a PNG's size, an SVG's root element), the kernel's Go version by "GO" and the cells'
// execution timings by "date".
func normalize(t *testing.T, b []byte) []byte {
	t.Helper()
	var nb map[string]any
	if err := json.Unmarshal(b, &nb); err != nil {
		t.Fatal(err)
	}
	images := 0
	for _, c := range nb["cells"].([]any) {
		outs, _ := c.(map[string]any)["outputs"].([]any)
		for _, o := range outs {
			data, _ := o.(map[string]any)["data"].(map[string]any)
			if p, ok := data["image/png"].(string); ok {
				raw, err := base64.StdEncoding.DecodeString(p)
				if err != nil {
					t.Fatalf("image/png is not base64: %v", err)
				}
				cfg, err := png.DecodeConfig(bytes.NewReader(raw))
				if err != nil {
					t.Fatalf("image/png is not a PNG: %v", err)
				}
				data["image/png"] = fmt.Sprintf("<PNG %dx%d>", cfg.Width, cfg.Height)
				images++
			}
			if s, ok := data["image/svg+xml"].([]any); ok {
				var all strings.Builder
				for _, l := range s {
					all.WriteString(l.(string))
				}
				root := regexp.MustCompile(`<svg[^>]*?(width="[^"]*")[^>]*?(height="[^"]*")`).FindStringSubmatch(all.String())
				if root == nil {
					t.Fatalf("image/svg+xml has no <svg> root with a size: %.200s", all.String())
				}
				data["image/svg+xml"] = fmt.Sprintf("<SVG %s %s>", root[1], root[2])
				images++
			}
		}
	}
	if images != 2 {
		t.Errorf("%d images (PNG or SVG) in the executed notebook, want 2", images)
	}
	li := nb["metadata"].(map[string]any)["language_info"].(map[string]any)
	li["version"] = "GO"
	// Timings are the kernel's clock: each is replaced by the word "date" once checked.
	for _, c := range nb["cells"].([]any) {
		meta := c.(map[string]any)["metadata"].(map[string]any)
		ex, ok := meta["execution"].(map[string]any)
		if !ok {
			continue
		}
		for k, v := range ex {
			if _, err := time.Parse(time.RFC3339Nano, v.(string)); err != nil {
				t.Errorf("execution %s = %q is not a date", k, v)
			}
			ex[k] = "date"
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", " ")
	if err := enc.Encode(nb); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// checkWithNbformat validates b with Python's nbformat and checks that nbformat writes it
// back unchanged; it logs and returns when nbformat is not installed.
func checkWithNbformat(t *testing.T, b []byte) {
	t.Helper()
	const py = "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import nbformat").Run(); err != nil {
		t.Logf("not checked with nbformat: %s cannot import it", py)
		return
	}
	f := filepath.Join(t.TempDir(), "nb.ipynb")
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}
	script := `import sys, nbformat
nb = nbformat.read(sys.argv[1], as_version=4)
nbformat.validate(nb)
s = nbformat.writes(nb)
sys.stdout.write(s if s.endswith("\n") else s + "\n")`
	out, err := exec.Command(py, "-c", script, f).CombinedOutput()
	if err != nil {
		t.Fatalf("nbformat refuses the written notebook: %v\n%s", err, out)
	}
	if !bytes.Equal(out, b) {
		t.Errorf("nbformat writes the notebook differently:\n%s\n--- ours:\n%s", out, b)
	}
}

// errorsNotebook has a cell that prints, one that fails to compile after printing, one that
// sleeps for an hour and one that prints after them.
func errorsNotebook(t *testing.T) *Notebook {
	t.Helper()
	nb, err := Parse([]byte(`{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
	 {"cell_type": "code", "id": "first", "metadata": {}, "source": "fmt.Println(\"before\")", "outputs": [], "execution_count": null},
	 {"cell_type": "code", "id": "bad", "metadata": {}, "source": "fmt.Println(\"x\")\nundefinedThing + 1", "outputs": [], "execution_count": null},
	 {"cell_type": "code", "id": "sleep", "metadata": {}, "source": "import \"time\"\ntime.Sleep(time.Hour)", "outputs": [], "execution_count": null},
	 {"cell_type": "code", "id": "last", "metadata": {}, "source": "fmt.Println(\"after\")", "outputs": [{"output_type": "stream", "name": "stdout", "text": "stale"}], "execution_count": 9}
	]}`))
	if err != nil {
		t.Fatal(err)
	}
	return nb
}

func outputTypes(c *Cell) string {
	var s []string
	for _, o := range c.Outputs {
		s = append(s, o.Type)
	}
	return strings.Join(s, " ")
}

// TestRunStopsAtTheFirstError: the failing cell's output and error are recorded, the run
// returns a CellError naming the cell and the kernel's error, and later cells are left
// without outputs (their stale ones cleared).
func TestRunStopsAtTheFirstError(t *testing.T) {
	o := kernelOptions(t)
	nb := errorsNotebook(t)
	res, err := Run(context.Background(), nb, o)
	var ce *CellError
	if !errors.As(err, &ce) || ce.Index != 2 || ce.ID != "bad" || ce.Ename != "CompileError" || !strings.Contains(ce.Evalue, "undefinedThing") || ce.Timeout != 0 {
		t.Fatalf("Run = %v (%#v), want the CompileError of cell 2", err, ce)
	}
	if msg := err.Error(); !strings.Contains(msg, `cell 2 (id bad) "fmt.Println(\"x\")" failed: CompileError`) {
		t.Errorf("error message %q does not name the cell and the error", msg)
	}
	if res.Ran != 2 || len(res.Failed) != 1 {
		t.Errorf("result %+v, want 2 cells run and 1 failed", res)
	}
	bad := nb.Cells[1]
	if got := outputTypes(bad); got != "stream error" || bad.Outputs[0].Text != "x\n" || bad.Outputs[1].Ename != "CompileError" || len(bad.Outputs[1].Traceback) == 0 {
		t.Errorf("failed cell outputs %q: %+v", got, bad.Outputs)
	}
	if bad.ExecutionCount == nil || *bad.ExecutionCount != 2 {
		t.Errorf("failed cell execution_count %v, want 2", bad.ExecutionCount)
	}
	for _, c := range nb.Cells[2:] {
		if len(c.Outputs) != 0 || c.ExecutionCount != nil {
			t.Errorf("cell %s after the error has outputs %q, count %v", c.ID, outputTypes(c), c.ExecutionCount)
		}
	}
	out, _ := nb.Marshal()
	if bytes.Contains(out, []byte("stale")) {
		t.Error("a cell the run did not reach kept its old output")
	}
}

// TestRunInterruptsACellPastItsTimeout: with errors allowed, the failing cell is passed, the
// sleeping one is interrupted at the timeout, the run fails naming it, and the last cell is
// not run.
func TestRunInterruptsACellPastItsTimeout(t *testing.T) {
	o := kernelOptions(t)
	o.AllowErrors = true
	o.Timeout = 2 * time.Second
	nb := errorsNotebook(t)
	start := time.Now()
	res, err := Run(context.Background(), nb, o)
	took := time.Since(start)
	var ce *CellError
	if !errors.As(err, &ce) || ce.Index != 3 || ce.ID != "sleep" || ce.Timeout != 2*time.Second {
		t.Fatalf("Run = %v, want cell 3 past its 2s timeout", err)
	}
	if msg := err.Error(); !strings.Contains(msg, `cell 3 (id sleep)`) || !strings.Contains(msg, "ran past the cell timeout of 2s and was interrupted") {
		t.Errorf("error message %q", msg)
	}
	if took > time.Minute {
		t.Errorf("the run took %v; the interrupt should end it within seconds of the timeout", took)
	}
	if res.Ran != 3 || len(res.Failed) != 2 || res.Failed[0].ID != "bad" {
		t.Errorf("result %+v, want 3 cells run, cells bad and sleep failed", res)
	}
	if got := outputTypes(nb.Cells[2]); got != "error" || nb.Cells[2].Outputs[0].Ename != "Interrupted" {
		t.Errorf("interrupted cell outputs %q %+v, want the kernel's Interrupted error", got, nb.Cells[2].Outputs)
	}
	if c := nb.Cells[3]; len(c.Outputs) != 0 || c.ExecutionCount != nil {
		t.Errorf("the cell after the timeout ran: %q", outputTypes(c))
	}
}

// TestRunGoesOnPastErrorsWhenAllowed runs the error notebook without its sleeping cell.
func TestRunGoesOnPastErrorsWhenAllowed(t *testing.T) {
	o := kernelOptions(t)
	o.AllowErrors = true
	nb := errorsNotebook(t)
	nb.Cells = append(nb.Cells[:2], nb.Cells[3])
	res, err := Run(context.Background(), nb, o)
	if err != nil {
		t.Fatal(err)
	}
	last := nb.Cells[2]
	if res.Ran != 3 || len(res.Failed) != 1 || outputTypes(last) != "stream" || last.Outputs[0].Text != "after\n" || *last.ExecutionCount != 3 {
		t.Errorf("result %+v, last cell %q count %v", res, outputTypes(last), last.ExecutionCount)
	}
}

func TestRunReportsAKernelThatCannotStart(t *testing.T) {
	nb := errorsNotebook(t)
	for _, c := range []struct {
		name string
		argv []string
		want string
	}{
		{"no such program", []string{"/nonexistent/halo-shell", "kernel"}, "starting the kernel /nonexistent/halo-shell"},
		{"exits at once", []string{"sh", "-c", "echo 'no such flag' >&2; exit 3"}, "the kernel exited (exit status 3) while starting; its stderr ends:\nno such flag"},
		{"never listens", []string{"sleep", "30"}, "did not answer within 1s of starting"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Run(context.Background(), nb, Options{Kernel: c.argv, StartTimeout: time.Second})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Run = %v, want an error containing %q", err, c.want)
			}
		})
	}
	if _, err := Run(context.Background(), nb, Options{}); err == nil || !strings.Contains(err.Error(), "no kernel command") {
		t.Errorf("Run without a kernel = %v", err)
	}
}

// TestApplyDisplayUpdatesAndClears feeds iopub messages to a runner: consecutive stream
// writes merge, update_display_data replaces every output of its display (in any cell),
// clear_output clears now or, with wait, at the next output.
func TestApplyDisplayUpdatesAndClears(t *testing.T) {
	a, b := &Cell{Type: "code"}, &Cell{Type: "code"}
	r := &runner{nb: &Notebook{Cells: []*Cell{a, b}}}
	msg := func(typ, content string) *wire.Message {
		return &wire.Message{Header: wire.Header{MsgType: typ}, Content: json.RawMessage(content)}
	}
	var clear bool
	r.apply(a, msg("display_data", `{"data": {"text/plain": "v1"}, "metadata": {}, "transient": {"display_id": "p"}}`), &clear)
	r.apply(b, msg("stream", `{"name": "stdout", "text": "a"}`), &clear)
	r.apply(b, msg("stream", `{"name": "stdout", "text": "b\n"}`), &clear)
	r.apply(b, msg("stream", `{"name": "stderr", "text": "e"}`), &clear)
	r.apply(b, msg("update_display_data", `{"data": {"text/plain": "v2", "text/html": "<b>2</b>"}, "metadata": {}, "transient": {"display_id": "p"}}`), &clear)
	if got := string(a.Outputs[0].Data["text/plain"]); got != `"v2"` || len(a.Outputs[0].Data) != 2 {
		t.Errorf("display after the update = %v", a.Outputs[0].Data)
	}
	if outputTypes(b) != "stream stream" || b.Outputs[0].Text != "ab\n" || b.Outputs[1].Name != "stderr" {
		t.Errorf("streams = %+v", b.Outputs)
	}
	r.apply(b, msg("clear_output", `{"wait": true}`), &clear)
	if len(b.Outputs) != 2 {
		t.Error("clear_output with wait cleared before the next output")
	}
	r.apply(b, msg("stream", `{"name": "stderr", "text": "new"}`), &clear)
	if outputTypes(b) != "stream" || b.Outputs[0].Text != "new" {
		t.Errorf("after a waiting clear and a write: %+v", b.Outputs)
	}
	r.apply(b, msg("execute_result", `{"data": {"text/plain": "1"}, "metadata": {}, "execution_count": 4}`), &clear)
	r.apply(b, msg("clear_output", `{"wait": false}`), &clear)
	if len(b.Outputs) != 0 {
		t.Errorf("clear_output left %+v", b.Outputs)
	}
	r.apply(b, msg("error", `{"ename": "E", "evalue": "v", "traceback": ["t"]}`), &clear)
	r.apply(b, msg("stream", `not json`), &clear)
	if outputTypes(b) != "error" || b.Outputs[0].Ename != "E" {
		t.Errorf("after an error and a malformed message: %+v", b.Outputs)
	}
}

// TestRunHonoursCellTags: a cell tagged skip-execution is not run, one tagged
// raises-exception fails without stopping the run or counting as failed, and every cell run
// records nbclient's four timings.
func TestRunHonoursCellTags(t *testing.T) {
	o := kernelOptions(t)
	nb, err := Parse([]byte(`{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
	 {"cell_type": "code", "id": "skip", "metadata": {"tags": ["skip-execution"]}, "source": "fmt.Println(\"skipped\")", "outputs": [], "execution_count": null},
	 {"cell_type": "code", "id": "raises", "metadata": {"tags": ["raises-exception"], "execution": {"old": "x"}}, "source": "undefinedThing", "outputs": [], "execution_count": null},
	 {"cell_type": "code", "id": "last", "metadata": {}, "source": "fmt.Println(\"after\")", "outputs": [], "execution_count": null}
	]}`))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), nb, o)
	if err != nil || res.Ran != 2 || len(res.Failed) != 0 {
		t.Fatalf("Run = %+v, %v; want 2 cells run, none failed", res, err)
	}
	skip, raises, last := nb.Cells[0], nb.Cells[1], nb.Cells[2]
	if len(skip.Outputs) != 0 || skip.ExecutionCount != nil || skip.Timing != nil {
		t.Errorf("the skip-execution cell ran: %q", outputTypes(skip))
	}
	if outputTypes(raises) != "error" || outputTypes(last) != "stream" || *last.ExecutionCount != 2 {
		t.Errorf("outputs %q and %q", outputTypes(raises), outputTypes(last))
	}
	for _, c := range []*Cell{raises, last} {
		for _, k := range []string{"iopub.status.busy", "iopub.execute_input", "shell.execute_reply", "iopub.status.idle"} {
			if c.Timing[k] == "" {
				t.Errorf("cell %s: no %s timing in %v", c.ID, k, c.Timing)
			}
		}
	}
	out, _ := nb.Marshal()
	if bytes.Contains(out, []byte(`"old"`)) {
		t.Error("an earlier run's timings were kept")
	}
}
