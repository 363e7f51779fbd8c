package kernel

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/cell"
	"github.com/halo-shell/halo-shell/session"
)

// The tests in this file drive the kernel with Debian's Jupyter clients (jupyter_client,
// nbclient, jupyter_kernel_test) through /usr/bin/python3. They skip when those are missing,
// and fail instead when HALO_CI=1.

const python = "/usr/bin/python3"

var (
	pyOnce   sync.Once
	pyReason string
)

func needJupyter(t *testing.T) {
	t.Helper()
	pyOnce.Do(func() {
		if _, err := os.Stat(python); err != nil {
			pyReason = python + " not found (apt-get install python3)"
			return
		}
		out, err := exec.Command(python, "-c", "import jupyter_client, nbclient, nbformat, jupyter_kernel_test").CombinedOutput()
		if err != nil {
			pyReason = "Jupyter clients missing (apt-get install jupyter-client python3-nbclient python3-nbformat python3-jupyter-kernel-test): " + lastLine(string(out))
		}
	})
	if pyReason == "" {
		return
	}
	if os.Getenv("HALO_CI") == "1" {
		t.Fatal(pyReason)
	}
	t.Skip(pyReason)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// haloBinary builds cmd/halo-shell once into a directory that outlives the tests' temporary
// directories (removed by TestMain).
func haloBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "halo-kernel-bin")
		if buildErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, "halo-shell"), "../cmd/halo-shell").CombinedOutput()
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
	if len(os.Args) > 1 && os.Args[1] == "cell-worker" {
		os.Exit(cell.WorkerMain())
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// jupyterEnv installs the kernelspec of a fresh binary into a private Jupyter path and gives
// sessions a private runtime directory; sessions started there are stopped at the end.
func jupyterEnv(t *testing.T) (env []string, root string) {
	t.Helper()
	exe := haloBinary(t)
	// A short directory: session sockets live under it and unix socket paths are short.
	root, err := os.MkdirTemp("", "hk")
	if err != nil {
		t.Fatal(err)
	}
	prefix := filepath.Join(root, "prefix")
	if _, err := Install(InstallOptions{Prefix: prefix, Executable: exe}); err != nil {
		t.Fatal(err)
	}
	sessions := filepath.Join(root, "s")
	t.Setenv("HALO_SESSION_DIR", sessions) // for session.Stop below
	env = append(os.Environ(),
		"JUPYTER_PATH="+filepath.Join(prefix, "share", "jupyter"),
		"JUPYTER_DATA_DIR="+filepath.Join(root, "data"),
		"JUPYTER_RUNTIME_DIR="+filepath.Join(root, "runtime"),
		"JUPYTER_CONFIG_DIR="+filepath.Join(root, "config"),
		"JUPYTER_PLATFORM_DIRS=1",
		"HALO_SESSION_DIR="+sessions,
		"PYDEVD_DISABLE_FILE_VALIDATION=1",
	)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if infos, err := session.List(ctx); err == nil {
			for _, in := range infos {
				if _, err := session.Stop(ctx, in.Name, 20*time.Second); err != nil {
					t.Logf("stopping session %s: %v", in.Name, err)
				}
			}
		}
		os.RemoveAll(root)
	})
	return env, root
}

func runPython(t *testing.T, env []string, dir string, timeout time.Duration, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, args...)
	cmd.Env, cmd.Dir = env, dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", python, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	if testing.Verbose() {
		t.Logf("stderr of %s:\n%s", args[0], stderr.String())
	}
	return stdout.Bytes()
}

func repoRoot(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestConformance runs jupyter_kernel_test's KernelTests against the kernel: kernel_info,
// stdout and stderr streams, errors, execute results, display data, completion, is_complete,
// history (tail, range, search) and inspect, with every message validated against the 5.x
// message schemas.
func TestConformance(t *testing.T) {
	needJupyter(t)
	env, _ := jupyterEnv(t)
	script, _ := filepath.Abs("testdata/conformance.py")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, script)
	cmd.Env, cmd.Dir = env, repoRoot(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("conformance suite failed: %v\n%s", err, out)
	}
	// Every test ran (none skipped for lack of a sample, apart from the pager and clear_output).
	s := string(out)
	for _, name := range []string{"test_completion", "test_display_data", "test_error", "test_execute_result",
		"test_execute_stderr", "test_execute_stdout", "test_history", "test_inspect", "test_is_complete", "test_kernel_info"} {
		if !regexp.MustCompile(name + ` \(.*\) \.\.\. ok`).MatchString(s) {
			t.Errorf("%s did not pass:\n%s", name, s)
		}
	}
	if testing.Verbose() {
		t.Log(s)
	}
}

// TestRestartKeepsSessionStepCount steps a session from a kernel, restarts the kernel and
// checks that the session's step count survived and that the new kernel still controls it;
// on the way, a message signed with the wrong key gets no reply.
func TestRestartKeepsSessionStepCount(t *testing.T) {
	needJupyter(t)
	env, _ := jupyterEnv(t)
	root := repoRoot(t)
	script, _ := filepath.Abs("testdata/restart.py")
	out := runPython(t, env, root, 5*time.Minute, script, "examples/quickstart.yaml")
	var r struct {
		Before           int     `json:"before"`
		TamperedReply    *string `json:"tampered_reply"`
		AfterTampered    int     `json:"after_tampered"`
		AfterRestart     int     `json:"after_restart"`
		AfterRestartStep int     `json:"after_restart_step"`
		Heartbeat        string  `json:"heartbeat"`
	}
	if err := json.Unmarshal(lastJSONLine(out), &r); err != nil {
		t.Fatalf("report %q: %v", out, err)
	}
	if r.Before != 3 || r.AfterRestart != 3 || r.AfterRestartStep != 5 {
		t.Errorf("steps before restart %d, after %d, after 2 more %d; want 3, 3, 5", r.Before, r.AfterRestart, r.AfterRestartStep)
	}
	if r.Heartbeat != "ping-halo" {
		t.Errorf("heartbeat echoed %q, want ping-halo", r.Heartbeat)
	}
	if r.TamperedReply != nil || r.AfterTampered != 3 {
		t.Errorf("a message with a bad signature got reply %v and the step count became %d; want no reply and 3", r.TamperedReply, r.AfterTampered)
	}
}

func lastJSONLine(b []byte) []byte {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	return lines[len(lines)-1]
}

// notebook is the part of an .ipynb the checks read.
type notebook struct {
	Cells []struct {
		CellType string   `json:"cell_type"`
		Source   any      `json:"source"`
		Outputs  []output `json:"outputs"`
	} `json:"cells"`
}

type output struct {
	OutputType string         `json:"output_type"`
	Name       string         `json:"name"`
	Text       any            `json:"text"`
	Data       map[string]any `json:"data"`
	Ename      string         `json:"ename"`
	Evalue     string         `json:"evalue"`
}

// joined is nbformat's multiline string: a string or a list of strings.
func joined(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []any:
		var b strings.Builder
		for _, s := range x {
			b.WriteString(fmt.Sprint(s))
		}
		return b.String()
	}
	return ""
}

// TestQuickstartNotebook runs notebooks/quickstart.ipynb headless with nbclient against a
// session on the CPU and checks the MIME types and values of its outputs.
func TestQuickstartNotebook(t *testing.T) {
	needJupyter(t)
	env, tmp := jupyterEnv(t)
	root := repoRoot(t)
	script, _ := filepath.Abs("testdata/run_notebook.py")
	executed := filepath.Join(tmp, "executed.ipynb")
	runPython(t, env, root, 8*time.Minute, script, filepath.Join(root, "notebooks", "quickstart.ipynb"), executed, root)
	b, err := os.ReadFile(executed)
	if err != nil {
		t.Fatal(err)
	}
	var nb notebook
	if err := json.Unmarshal(b, &nb); err != nil {
		t.Fatal(err)
	}
	// Outputs by the first line of their cell's source.
	outs := map[string][]output{}
	for _, c := range nb.Cells {
		if c.CellType != "code" {
			continue
		}
		src := joined(c.Source)
		for _, o := range c.Outputs {
			if o.OutputType == "error" {
				t.Errorf("cell %q failed: %s: %s", src, o.Ename, o.Evalue)
			}
		}
		outs[strings.SplitN(src, "\n", 2)[0]] = c.Outputs
	}
	find := func(cellFirstLine, outputType string) output {
		t.Helper()
		for _, o := range outs[cellFirstLine] {
			if o.OutputType == outputType {
				return o
			}
		}
		t.Fatalf("cell %q has no %s output; outputs %+v", cellFirstLine, outputType, outs[cellFirstLine])
		return output{}
	}
	text := func(o output, mime string) string {
		t.Helper()
		v, ok := o.Data[mime]
		if !ok {
			t.Fatalf("%s output has no %s (has %v)", o.OutputType, mime, keys(o.Data))
		}
		return joined(v)
	}

	if s := text(find("%load examples/quickstart.yaml", "execute_result"), "text/plain"); !strings.Contains(s, "idle, step 0/3000") {
		t.Errorf("%%load result = %q, want an idle session at step 0/3000", s)
	}
	// %step 20: the live progress display ends on the last step (updated in place), and the
	// result lists the 20 steps.
	prog := find("%step 20", "display_data")
	if s := text(prog, "text/plain"); !strings.HasPrefix(s, "step 20 ") || !strings.Contains(s, "steps in this cell 20") {
		t.Errorf("progress display after %%step 20 = %q, want the 20th step", s)
	}
	if s := text(prog, "text/html"); !strings.Contains(s, `<table class="halo-progress">`) {
		t.Errorf("progress display html = %q", s)
	}
	if s := text(find("%step 20", "execute_result"), "text/plain"); strings.Count(s, "\n")+1 != 20 || !strings.HasPrefix(s, "step 1 ") {
		t.Errorf("%%step 20 result = %q, want 20 lines from step 1", s)
	}
	// The metrics cell prints the loss before and after: training lowers it.
	m := regexp.MustCompile(`steps (\d+), loss ([0-9.]+) -> ([0-9.]+)`).FindStringSubmatch(joined(find("ms := halo.Metrics()", "stream").Text))
	if m == nil {
		t.Fatalf("metrics cell printed %q", joined(find("ms := halo.Metrics()", "stream").Text))
	}
	first, _ := strconv.ParseFloat(m[2], 64)
	last, _ := strconv.ParseFloat(m[3], 64)
	if m[1] != "20" || !(last < first) {
		t.Errorf("metrics: %s steps, loss %v -> %v; want 20 steps and a lower loss", m[1], first, last)
	}
	if s := text(find("%set lr=2e-3", "execute_result"), "text/plain"); !strings.Contains(s, "0.002") {
		t.Errorf("%%set result = %q, want the new learning rate", s)
	}
	prof := find("%profile 3", "execute_result")
	if s := text(prof, "text/html"); !strings.Contains(s, "<table") || !strings.Contains(s, "profile of 3 step(s)") {
		t.Errorf("profile html = %q", s)
	}
	if s := text(prof, "text/plain"); !strings.Contains(s, "profile of 3 step(s)") {
		t.Errorf("profile text = %q", s)
	}
	for _, c := range []struct{ cell, kind string }{{"%plot loss", "execute_result"}, {"%plot lr", "execute_result"}} {
		o := find(c.cell, c.kind)
		png, err := base64.StdEncoding.DecodeString(strings.ReplaceAll(text(o, "image/png"), "\n", ""))
		if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
			t.Errorf("%s: image/png is not a PNG (%v)", c.cell, err)
		}
		if s := text(o, "image/svg+xml"); !strings.Contains(s, "<svg") {
			t.Errorf("%s: image/svg+xml = %.80q", c.cell, s)
		}
		if s := text(o, "text/plain"); s == "" {
			t.Errorf("%s: empty text/plain", c.cell)
		}
	}
	summary := find(`t := halo.Table{Title: "parameters", Header: []string{"name", "shape", "rms", "max |x|"}}`, "execute_result")
	if s := text(summary, "text/html"); !strings.Contains(s, "<table") || !strings.Contains(s, "embed") {
		t.Errorf("model summary html = %.200q, want a table of parameters", s)
	}
	text(summary, "text/plain")
	// %run 10 follows the background run to its end: steps 24..33 after 20 stepped and 3 profiled.
	if s := text(find("%run 10", "display_data"), "text/plain"); !strings.HasPrefix(s, "step 33 ") {
		t.Errorf("progress display after %%run 10 = %q, want step 33", s)
	}
	if s := text(find("%run 10", "execute_result"), "text/plain"); !strings.HasPrefix(s, "run ended: session default idle at step 33/3000") {
		t.Errorf("%%run 10 result = %q, want the run's end at step 33", s)
	}
	if s := text(find("%status", "execute_result"), "text/plain"); !strings.Contains(s, "step 33/3000") {
		t.Errorf("final %%status = %q, want step 33/3000", s)
	}
	// The kernel shut down for good (not a restart): the session outlives it, with nobody in
	// control.
	if c := controllerOf(t); c != "" {
		t.Errorf("after the kernel shut down the session is still controlled by %s", c)
	}
}

// controllerOf returns the controller of the default session in the test's session directory.
func controllerOf(t *testing.T) string {
	t.Helper()
	c, err := session.Dial(session.DefaultName, session.Options{ClientName: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatalf("the notebook's session does not answer after the kernel stopped: %v", err)
	}
	return st.Controller
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestNotebookTakesOverFromTheREPL runs a REPL that steps the session (so that it controls
// it), then a notebook kernel: observing needs no control, a control cell is refused with the
// ways to take over, %takeover takes control and the next step runs; once the kernel has shut
// down, the REPL steps again.
func TestNotebookTakesOverFromTheREPL(t *testing.T) {
	needJupyter(t)
	env, _ := jupyterEnv(t)
	root := repoRoot(t)
	exe := haloBinary(t)
	start := exec.Command(exe, "session", "start", "--config", "examples/quickstart.yaml")
	start.Env, start.Dir = env, root
	if out, err := start.CombinedOutput(); err != nil {
		t.Fatalf("session start: %v\n%s", err, out)
	}
	repl := exec.Command(exe, "repl", "--history", "-")
	repl.Env, repl.Dir = env, root
	stdin, err := repl.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out syncBuf
	repl.Stdout, repl.Stderr = &out, &out
	if err := repl.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); repl.Process.Kill(); repl.Wait() })
	fmt.Fprintln(stdin, ":step 1")
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(out.String(), "step 1  loss"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the REPL did not step; it wrote:\n%s", out.String())
		}
	}
	script, _ := filepath.Abs("testdata/takeover.py")
	var r struct {
		StatusCell     string `json:"status_cell"`
		RefusedStatus  string `json:"refused_status"`
		RefusedError   string `json:"refused_error"`
		TakeoverStatus string `json:"takeover_status"`
		StepStatus     string `json:"step_status"`
		StepError      string `json:"step_error"`
		Step           int    `json:"step"`
	}
	if err := json.Unmarshal(lastJSONLine(runPython(t, env, root, 5*time.Minute, script)), &r); err != nil {
		t.Fatal(err)
	}
	if r.StatusCell != "ok" {
		t.Errorf("%%status while the REPL controls: %s, want ok (observing needs no control)", r.StatusCell)
	}
	if r.RefusedStatus != "error" || !strings.Contains(r.RefusedError, "(repl)") || !strings.Contains(r.RefusedError, "%takeover") {
		t.Errorf("%%step while the REPL controls: %s %q, want an error naming the REPL and %%takeover", r.RefusedStatus, r.RefusedError)
	}
	if r.TakeoverStatus != "ok" || r.StepStatus != "ok" || r.Step != 2 {
		t.Errorf("after %%takeover: takeover %s, step %s %q, step count %d; want ok, ok, 2", r.TakeoverStatus, r.StepStatus, r.StepError, r.Step)
	}
	// The kernel shut down for good and gave control up: the REPL steps again.
	fmt.Fprintln(stdin, ":step 1")
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(out.String(), "step 3  loss"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the REPL did not step after the kernel left; it wrote:\n%s", out.String())
		}
	}
}

// syncBuf is a strings.Builder safe for concurrent writers.
type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestCrashingCellsLeaveTheKernelServing runs, through jupyter-client, a cell of unbounded
// recursion and one allocating more than the machine has: each gets an error reply naming the
// cause, the heartbeat goes on echoing, and the next cell runs with the earlier functions.
func TestCrashingCellsLeaveTheKernelServing(t *testing.T) {
	needJupyter(t)
	env, _ := jupyterEnv(t)
	env = append(env, "HALO_CELL_MAX_STACK=64MiB")
	script, _ := filepath.Abs("testdata/crash.py")
	var r struct {
		Cells []struct {
			Status, Ename, Evalue, Heartbeat, After string
		} `json:"cells"`
		Alive bool `json:"alive"`
	}
	if err := json.Unmarshal(lastJSONLine(runPython(t, env, repoRoot(t), 5*time.Minute, script)), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Cells) != 2 || !r.Alive {
		t.Fatalf("report %+v", r)
	}
	for i, want := range []string{"stack overflow", "out of memory"} {
		c := r.Cells[i]
		if c.Status != "error" || c.Ename != "InterpreterCrash" || !strings.Contains(c.Evalue, want) {
			t.Errorf("cell %d: %s %s %q, want an InterpreterCrash error naming %q", i, c.Status, c.Ename, c.Evalue, want)
		}
		if c.Heartbeat != "ping" || c.After != "42" {
			t.Errorf("after cell %d: heartbeat %q, next cell %q; want ping and 42", i, c.Heartbeat, c.After)
		}
	}
}
