package tui

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/session"
)

// tmux drives a tmux server of its own (its socket in a temporary directory).
type tmux struct {
	t    *testing.T
	sock string
}

func (x *tmux) run(args ...string) (string, error) {
	out, err := exec.Command("tmux", append([]string{"-S", x.sock}, args...)...).CombinedOutput()
	return string(out), err
}

// pane is the visible text of the dashboard's pane.
func (x *tmux) pane() string {
	out, err := x.run("capture-pane", "-p", "-t", "tui")
	if err != nil {
		return "(no pane: " + strings.TrimSpace(out) + ")"
	}
	return out
}

func (x *tmux) waitPane(what string, ok func(string) bool) string {
	x.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s := x.pane()
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("the pane never showed %s; it shows:\n%s", what, s)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// binary builds halo-shell once per test binary, into binDir (removed by TestMain).
var (
	buildOnce sync.Once
	binDir    string
	binPath   string
	buildErr  error
)

func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "halo-e2e-bin")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "halo-shell")
		build := exec.Command("go", "build", "-o", binPath, "../cmd/halo-shell")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("building halo-shell: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// e2e is a session process on a config and `halo-shell tui` attached to it in tmux at 80x24.
type e2e struct {
	*tmux
	bin, name string
}

// startE2E starts a session on configPath (relative paths in it resolve against workDir) and the
// dashboard attached to it; totalSteps is the config's planned number of steps.
func startE2E(t *testing.T, name, configPath, workDir string, totalSteps int) *e2e {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		if os.Getenv("HALO_CI") == "1" {
			t.Fatal("tmux is not installed; CI needs it (apt-get install -y tmux)")
		}
		t.Skip("tmux is not installed (apt-get install -y tmux); the end-to-end test needs it")
	}
	bin := binary(t)
	dir, err := os.MkdirTemp("", "halo-e2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sessions := filepath.Join(dir, "sessions")
	t.Setenv("HALO_SESSION_DIR", sessions)
	config, err := filepath.Abs(configPath)
	if err != nil {
		t.Fatal(err)
	}
	// Outputs go to the test's directory.
	start := exec.Command(bin, "session", "start", "--name", name, "--config", config,
		"--set", "output_dir="+filepath.Join(dir, "out"))
	start.Dir = workDir
	if out, err := start.CombinedOutput(); err != nil {
		t.Fatalf("starting the session: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if _, err := session.Stop(context.Background(), name, 30*time.Second); err != nil {
			t.Errorf("stopping the session: %v", err)
		}
	})
	x := &tmux{t: t, sock: filepath.Join(dir, "tmux.sock")}
	cmd := fmt.Sprintf("exec env HALO_SESSION_DIR=%s TERM=xterm-256color %s tui --session %s --no-start --status-every 200ms", sessions, bin, name)
	if out, err := x.run("new-session", "-d", "-s", "tui", "-x", "80", "-y", "24", cmd); err != nil {
		t.Fatalf("tmux new-session: %v\n%s", err, out)
	}
	t.Cleanup(func() { x.run("kill-server") })
	x.waitPane("the idle session", contains("idle", fmt.Sprintf("step 0/%d", totalSteps)))
	return &e2e{tmux: x, bin: bin, name: name}
}

// key presses one key in the dashboard.
func (x *tmux) key(k string) {
	x.t.Helper()
	if out, err := x.run("send-keys", "-t", "tui", k); err != nil {
		x.t.Fatalf("send-keys %s: %v\n%s", k, err, out)
	}
}

// detach presses q and waits for the dashboard to end (its tmux session closes with it).
func (x *tmux) detach() {
	x.t.Helper()
	x.key("q")
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := x.run("has-session", "-t", "tui"); err != nil {
			return
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("q did not end the dashboard; the pane shows:\n%s", x.pane())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestEndToEndTmux runs `halo-shell tui` in tmux at 80x24 against a session process on the tiny
// CPU config: another client steps the session and the pane shows the step and its loss; p
// pauses the run, resumes it and pauses it again; q detaches and the session still answers.
func TestEndToEndTmux(t *testing.T) {
	x := startE2E(t, "e2e", tinyConfig, ".", 1000)
	ctx := context.Background()
	other, err := session.Dial(x.name, session.Options{ClientName: "repl"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ms, err := other.Step(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	x.waitPane("step 3 and its loss", contains("step 3/1000", "loss "+fmtLoss(ms[2].Loss)+" at step 3"))
	ms, err = other.Step(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	x.waitPane("step 5 and its loss", contains("step 5/1000", "loss "+fmtLoss(ms[1].Loss)+" at step 5"))

	// The other client starts a run and lets go of control; p in the dashboard pauses it.
	if _, err := other.Run(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	x.waitPane("the run", contains("│ running │"))
	x.key("p")
	x.waitPane("the pause", contains("paused after step", "│ paused │"))
	x.key("p")
	x.waitPane("the run resumed", contains("resumed", "│ running │"))
	x.key("p")
	x.waitPane("the second pause", contains("paused after step", "│ paused │"))

	x.detach()
	st, err := other.Status(ctx)
	if err != nil {
		t.Fatalf("the session stopped answering after the dashboard detached: %v", err)
	}
	if st.State != session.StatePaused || st.Controller != "" {
		t.Fatalf("after q the session is %v controlled by %q; want it paused, control given back", st.State, st.Controller)
	}
}

// TestEndToEndWithTheREPL is the interactive workflow on the quickstart config (a session
// started with examples/quickstart.yaml, as the README shows): the REPL runs 5 steps while the
// dashboard shows step 5 and its loss; the dashboard is refused control (naming the REPL)
// until it takes over; the REPL is killed and the session goes on serving the dashboard, which runs,
// pauses and resumes the session, and profiles 3 steps whose parts add up to the step time.
func TestEndToEndWithTheREPL(t *testing.T) {
	// The quickstart's own config, as a newcomer would start it.
	x := startE2E(t, "e2e-repl", "../examples/quickstart.yaml", "..", 3000)
	ctx := context.Background()
	repl := exec.Command(x.bin, "repl", "--session", x.name, "--history", "-")
	stdin, err := repl.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	repl.Stdout, repl.Stderr = &out, &out
	if err := repl.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { repl.Process.Kill(); repl.Wait() })
	if _, err := io.WriteString(stdin, ":step 5\n"); err != nil {
		t.Fatal(err)
	}
	watcher, err := session.Dial(x.name, session.Options{ClientName: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close()
	var st *session.StatusResponse
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if st, err = watcher.Status(ctx); err == nil && st.Step == 5 && st.LastMetrics != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the REPL did not run 5 steps (status %v, %v); it wrote:\n%s", st, err, out.String())
		}
	}
	x.waitPane("step 5 and its loss", contains("step 5/3000", "loss "+fmtLoss(st.LastMetrics.Loss)+" at step 5", "controller repl"))

	// The live REPL holds control: p is refused, naming it; t takes control from it.
	x.key("p")
	x.waitPane("the refusal naming the controller", contains("run failed", "controlled by"))
	x.key("t")
	x.waitPane("control", contains("controller (you)"))
	if err := repl.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	repl.Wait()
	x.key("p")
	x.waitPane("the run", contains("started a run", "│ running │"))
	x.key("p")
	x.waitPane("the pause", contains("paused after step", "│ paused │"))
	x.key("p")
	x.waitPane("the run resumed", contains("resumed", "│ running │"))
	x.key("p")
	x.waitPane("the second pause", contains("paused after step", "│ paused │"))
	// A profile of 3 steps: its parts add up to the measured step time (within 5%).
	x.key("f")
	pane := x.waitPane("the profile", contains("profiled steps"))
	m := regexp.MustCompile(`parts add up to ([0-9.]+)%`).FindStringSubmatch(pane)
	if m == nil {
		t.Fatalf("the profile's notice has no share:\n%s", pane)
	}
	if share, err := strconv.ParseFloat(m[1], 64); err != nil || math.Abs(share-100) > 5 {
		t.Fatalf("the profile's parts add up to %s%% of the step time, want 100%% within 5%%:\n%s", m[1], pane)
	}
	x.detach()
	if st, err = watcher.Status(ctx); err != nil || st.State != session.StatePaused || st.Step <= 5 {
		t.Fatalf("after the dashboard detached: %v, %v; want the session paused past step 5", st, err)
	}
}

// TestKilledTUILosesControl starts a run from the dashboard (so that it controls the session),
// SIGKILLs the dashboard's process and checks that control passes on within seconds.
func TestKilledTUILosesControl(t *testing.T) {
	x := startE2E(t, "e2e-kill", tinyConfig, ".", 1000)
	ctx := context.Background()
	x.key("p")
	x.waitPane("the run", contains("│ running │", "controller (you)"))
	other, err := session.Dial(x.name, session.Options{ClientName: "other"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.Claim(ctx); !session.IsNotController(err) {
		t.Fatalf("Claim while the dashboard controls: %v, want a refusal", err)
	}
	out, err := x.run("list-panes", "-t", "tui", "-F", "#{pane_pid}")
	if err != nil {
		t.Fatalf("tmux list-panes: %v\n%s", err, out)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("pane pid %q: %v", out, err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	for {
		err := other.Claim(ctx)
		if err == nil {
			break
		}
		if !session.IsNotController(err) {
			t.Fatal(err)
		}
		if time.Since(killed) > 15*time.Second {
			t.Fatalf("the killed dashboard still controls the session %s after SIGKILL: %v", time.Since(killed).Round(time.Second), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("control passed on %s after SIGKILL", time.Since(killed).Round(100*time.Millisecond))
	if st, err := other.Status(ctx); err != nil || st.Controller != other.ID() {
		t.Fatalf("status after the claim: %v, %v; want %s controlling", st, err, other.ID())
	}
}

// TestProfileOfAPausedLaunchRun: on a `halo-shell launch` run, p pauses it and f profiles 3
// steps, which run for the profile (the pane shows them) before the run pauses again.
func TestProfileOfAPausedLaunchRun(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("tmux is not installed (apt-get install -y tmux); the end-to-end test needs it")
	}
	bin := binary(t)
	dir, err := os.MkdirTemp("", "halo-e2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sessions := filepath.Join(dir, "sessions")
	t.Setenv("HALO_SESSION_DIR", sessions)
	config, _ := filepath.Abs(tinyConfig)
	launch := exec.Command(bin, "launch", "sft", config, "--max_steps=1000000", "--save_steps=0", "--output_dir="+filepath.Join(dir, "run"))
	var out syncWriter
	launch.Stdout, launch.Stderr = &out, &out
	if err := launch.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { launch.Process.Kill(); launch.Wait() })
	const name = "launch-run"
	var c *session.Client
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if c == nil {
			c, _ = session.Dial(name, session.Options{ClientName: "test"})
		}
		if c != nil {
			if st, err := c.Status(context.Background()); err == nil && st.State == session.StateRunning {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the launch run did not answer as %s; it wrote:\n%s", name, out.String())
		}
	}
	defer c.Close()
	x := &tmux{t: t, sock: filepath.Join(dir, "tmux.sock")}
	cmd := fmt.Sprintf("exec env HALO_SESSION_DIR=%s TERM=xterm-256color %s tui --session %s --no-start --status-every 200ms", sessions, bin, name)
	if out, err := x.run("new-session", "-d", "-s", "tui", "-x", "80", "-y", "24", cmd); err != nil {
		t.Fatalf("tmux new-session: %v\n%s", err, out)
	}
	t.Cleanup(func() { x.run("kill-server") })
	x.waitPane("the run", contains("│ running │"))
	x.key("p")
	x.waitPane("the pause", contains("│ paused │"))
	before, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	x.key("f")
	x.waitPane("the profile", contains("profiled steps"))
	st, err := c.Status(context.Background())
	if err != nil || st.State != session.StatePaused || st.Step != before.Step+3 {
		t.Fatalf("after the profile: %v, %v; want paused at step %d", st, err, before.Step+3)
	}
}

// syncWriter is a strings.Builder safe for concurrent writers.
type syncWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
