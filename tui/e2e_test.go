package tui

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// TestEndToEndTmux runs `halo-shell tui` in tmux at 80x24 against a session process on the tiny
// CPU config: another client steps the session and the pane shows the step and its loss; p
// pauses the run, resumes it and pauses it again; q detaches and the session still answers.
func TestEndToEndTmux(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		if os.Getenv("HALO_CI") == "1" {
			t.Fatal("tmux is not installed; CI needs it (apt-get install -y tmux)")
		}
		t.Skip("tmux is not installed (apt-get install -y tmux); the end-to-end test needs it")
	}
	dir, err := os.MkdirTemp("", "halo-e2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "halo-shell")
	build := exec.Command("go", "build", "-o", bin, "../cmd/halo-shell")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building halo-shell: %v\n%s", err, out)
	}
	sessions := filepath.Join(dir, "sessions")
	t.Setenv("HALO_SESSION_DIR", sessions)
	config, err := filepath.Abs(tinyConfig)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if out, err := exec.Command(bin, "session", "start", "--name", "e2e", "--config", config).CombinedOutput(); err != nil {
		t.Fatalf("starting the session: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if _, err := session.Stop(context.Background(), "e2e", 30*time.Second); err != nil {
			t.Errorf("stopping the session: %v", err)
		}
	})

	x := &tmux{t: t, sock: filepath.Join(dir, "tmux.sock")}
	cmd := fmt.Sprintf("env HALO_SESSION_DIR=%s TERM=xterm-256color %s tui --session e2e --no-start --status-every 200ms", sessions, bin)
	if out, err := x.run("new-session", "-d", "-s", "tui", "-x", "80", "-y", "24", cmd); err != nil {
		t.Fatalf("tmux new-session: %v\n%s", err, out)
	}
	t.Cleanup(func() { x.run("kill-server") })
	x.waitPane("the idle session", contains("idle", "step 0/1000"))

	other, err := session.Dial("e2e", session.Options{ClientName: "repl"})
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
	if out, err := x.run("send-keys", "-t", "tui", "p"); err != nil {
		t.Fatalf("send-keys p: %v\n%s", err, out)
	}
	x.waitPane("the pause", contains("paused after step", "│ paused │"))
	// p again resumes the run, and once more pauses it.
	if out, err := x.run("send-keys", "-t", "tui", "p"); err != nil {
		t.Fatalf("send-keys p: %v\n%s", err, out)
	}
	x.waitPane("the run resumed", contains("resumed", "│ running │"))
	if out, err := x.run("send-keys", "-t", "tui", "p"); err != nil {
		t.Fatalf("send-keys p: %v\n%s", err, out)
	}
	x.waitPane("the second pause", contains("paused after step", "│ paused │"))

	if out, err := x.run("send-keys", "-t", "tui", "q"); err != nil {
		t.Fatalf("send-keys q: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := x.run("has-session", "-t", "tui"); err != nil {
			break // the dashboard exited and its tmux session closed
		}
		if time.Now().After(deadline) {
			t.Fatalf("q did not end the dashboard; the pane shows:\n%s", x.pane())
		}
		time.Sleep(100 * time.Millisecond)
	}
	st, err := other.Status(ctx)
	if err != nil {
		t.Fatalf("the session stopped answering after the dashboard detached: %v", err)
	}
	if st.State != session.StatePaused || st.Controller != "" {
		t.Fatalf("after q the session is %v controlled by %q; want it paused, control given back", st.State, st.Controller)
	}
}
