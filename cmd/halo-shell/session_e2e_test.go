package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/session"
)

// The tests in this file run the halo-shell binary, as a user does: `session start` detaches
// a session process that re-executes the binary, which a test binary cannot stand in for.

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// haloBinary builds halo-shell once into a directory removed by the first test's cleanup
// that outlives it (the test binary's temporary directory).
func haloBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "halo-cmd-bin")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "halo-shell")
		build := exec.Command("go", "build", "-o", binPath, ".")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("building halo-shell: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// cli runs the binary with a private session directory.
type cli struct {
	t        *testing.T
	bin, dir string
}

func newCLI(t *testing.T) *cli {
	t.Helper()
	// A short directory: unix socket paths are short.
	dir, err := os.MkdirTemp("", "hc")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("HALO_SESSION_DIR", dir)
	c := &cli{t: t, bin: haloBinary(t), dir: dir}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if infos, err := session.List(ctx); err == nil {
			for _, in := range infos {
				session.Stop(ctx, in.Name, 20*time.Second)
			}
		}
		os.RemoveAll(dir)
	})
	return c
}

// run runs the binary with args (stdin from in) and returns its combined output and error.
func (c *cli) run(in string, args ...string) (string, error) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin, args...)
	cmd.Env = append(os.Environ(), "HALO_SESSION_DIR="+c.dir)
	cmd.Dir = "../../repl" // where the tiny config's relative paths resolve
	cmd.Stdin = strings.NewReader(in)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (c *cli) sessions() []string {
	c.t.Helper()
	infos, err := session.List(context.Background())
	if err != nil {
		c.t.Fatal(err)
	}
	var names []string
	for _, in := range infos {
		names = append(names, in.Name)
	}
	return names
}

const tinyConfig = "../../repl/testdata/tiny.yaml"

// TestStartReportsTheTruth: a missing config and one with a misspelt key fail `session start`
// with the error (and leave no session); of two concurrent starts of one name one starts it
// and the other says it is running; the session that answers is the one reported.
func TestStartReportsTheTruth(t *testing.T) {
	c := newCLI(t)
	out, err := c.run("", "session", "start", "--config", "nosuch.yaml")
	if err == nil || !strings.Contains(out, "nosuch.yaml: no such file or directory") {
		t.Errorf("start with a missing config: %v\n%s", err, out)
	}
	typo := filepath.Join(t.TempDir(), "typo.yaml")
	if err := os.WriteFile(typo, []byte("learnng_rate: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = c.run("", "session", "start", "--name", "typo", "--config", typo)
	if err == nil || !strings.Contains(out, `unknown key "learnng_rate" (did you mean "learning_rate"?)`) || strings.Contains(out, "started") {
		t.Errorf("start with a misspelt key: %v\n%s", err, out)
	}
	if s := c.sessions(); len(s) != 0 {
		t.Errorf("sessions left after failed starts: %v", s)
	}

	cfg, _ := filepath.Abs(tinyConfig)
	type result struct {
		out string
		err error
	}
	results := make(chan result, 2)
	for range 2 {
		go func() {
			out, err := c.run("", "session", "start", "--name", "twin", "--config", cfg)
			results <- result{out, err}
		}()
	}
	var started, refused []string
	for range 2 {
		r := <-results
		switch {
		case r.err == nil && strings.Contains(r.out, "session twin started"):
			started = append(started, r.out)
		case r.err != nil && strings.Contains(r.out, `a session named "twin" is already running`):
			refused = append(refused, r.out)
		default:
			t.Errorf("concurrent start: %v\n%s", r.err, r.out)
		}
	}
	if len(started) != 1 || len(refused) != 1 {
		t.Fatalf("concurrent starts: %d started, %d refused; want 1 and 1", len(started), len(refused))
	}
	infos, err := session.List(context.Background())
	if err != nil || len(infos) != 1 {
		t.Fatalf("List after the concurrent starts: %v, %v", infos, err)
	}
	if want := fmt.Sprintf("pid %d", infos[0].Status.Pid); !strings.Contains(started[0], want) {
		t.Errorf("start reported %q; the session that answers has %s", started[0], want)
	}
	if infos[0].Status.State != session.StateIdle {
		t.Errorf("the started session is %v, want idle with its config loaded", infos[0].Status.State)
	}
}

// TestAttachingByNameNeverCreatesSessions: a REPL on an unknown name is an error that lists
// the running sessions, and no session of that name is left; status and stop of an unknown
// name (and a second stop) say so plainly.
func TestAttachingByNameNeverCreatesSessions(t *testing.T) {
	c := newCLI(t)
	cfg, _ := filepath.Abs(tinyConfig)
	if out, err := c.run("", "session", "start", "--name", "exp1", "--config", cfg); err != nil {
		t.Fatalf("start: %v\n%s", err, out)
	}
	out, err := c.run(":status\n", "repl", "--session", "nosuch", "--history", "-")
	if err == nil || !strings.Contains(out, `no session named "nosuch" is running (running: exp1)`) {
		t.Errorf("repl --session nosuch: %v\n%s", err, out)
	}
	if s := c.sessions(); len(s) != 1 || s[0] != "exp1" {
		t.Errorf("sessions after repl --session nosuch: %v, want only exp1", s)
	}
	if _, err := os.Stat(filepath.Join(c.dir, "nosuch.sock")); err == nil {
		t.Error("repl --session nosuch left a socket")
	}
	out, err = c.run("", "session", "status", "--name", "nosuch")
	if err == nil || !strings.Contains(out, `no session named "nosuch" is running (running: exp1)`) {
		t.Errorf("status of an unknown name: %v\n%s", err, out)
	}
	if out, err := c.run("", "session", "stop", "--name", "exp1"); err != nil || !strings.Contains(out, "session exp1") {
		t.Fatalf("stop: %v\n%s", err, out)
	}
	out, err = c.run("", "session", "stop", "--name", "exp1")
	if err == nil || !strings.Contains(out, `no session named "exp1" is running (no session is running); nothing to stop`) {
		t.Errorf("second stop: %v\n%s", err, out)
	}
}

// TestStartRefusesARemoteBindWithoutOptIn: --listen on every interface is refused without
// --allow-remote; with it the session starts and start warns that it is plaintext.
func TestStartRefusesARemoteBindWithoutOptIn(t *testing.T) {
	c := newCLI(t)
	out, err := c.run("", "session", "start", "--name", "wide", "--listen", "tcp://0.0.0.0:0")
	if err == nil || !strings.Contains(out, "binds an address other machines can reach; pass --allow-remote") || !strings.Contains(out, "ssh -N -L") {
		t.Errorf("start --listen tcp://0.0.0.0:0: %v\n%s", err, out)
	}
	if s := c.sessions(); len(s) != 0 {
		t.Errorf("sessions after the refusal: %v", s)
	}
	out, err = c.run("", "session", "start", "--name", "wide", "--listen", "tcp://0.0.0.0:0", "--allow-remote")
	if err != nil || !strings.Contains(out, "warning: serving tcp://0.0.0.0:0 to other machines in plaintext") || !strings.Contains(out, "session wide started") {
		t.Errorf("start --allow-remote: %v\n%s", err, out)
	}
}
