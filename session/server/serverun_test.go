package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect/v2"

	"github.com/halo-shell/halo-shell/engine/train"
	"github.com/halo-shell/halo-shell/session"
)

// TestServeRunIsAttachable serves a batch run (as `launch` does) and drives it from a client
// by name: pause, profile the next steps, resume, and the refusal of Step.
func TestServeRunIsAttachable(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("HALO_SESSION_DIR", dir)
	out := filepath.Join(dir, "out")
	trace := filepath.Join(dir, "trace.json")
	cfg, err := train.LoadConfig(tinyConfig, "sft", []string{"--max_steps=60", "--output_dir=" + out})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTrainer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	type result struct {
		res train.RunResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := ServeRun(context.Background(), Options{Name: "launch", TraceFile: trace, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, tr, train.RunOptions{})
		done <- result{r, err}
	}()
	var c *session.Client
	waitFor(t, "the launch session to answer", func() bool {
		if c == nil {
			c, _ = session.Dial("launch", session.Options{ClientName: "attach"})
		}
		return c != nil && c.Ping(t.Context()) == nil
	})
	defer c.Close()
	ctx := ctxT(t)
	st, err := c.Pause(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != session.StatePaused {
		t.Fatalf("after Pause: %v", st.State)
	}
	at := st.Step
	time.Sleep(50 * time.Millisecond)
	if s := status(t, c); s.Step != at {
		t.Fatalf("paused at %d, now at %d", at, s.Step)
	}
	_, err = c.Step(ctx, 1)
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("Step on a launch session: %v", err)
	}
	mustContain(t, err, "batch run")
	if _, err := c.SetLR(ctx, 1e-3); err != nil {
		t.Fatal(err)
	}
	// A profile asked for while the run is paused (the TUI's p then f) steps the run for it
	// and pauses it again, instead of waiting for a resume that never comes.
	pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
	pp, err := c.Profile(pctx, 3, false)
	pcancel()
	if err != nil {
		t.Fatalf("profile of the paused run: %v", err)
	}
	if len(pp.Steps) != 3 {
		t.Fatalf("profile of the paused run has %d steps, want 3", len(pp.Steps))
	}
	if s := status(t, c); s.State != session.StatePaused || s.Step != at+3 {
		t.Fatalf("after profiling the paused run: %v at step %d, want paused at %d", s.State, s.Step, at+3)
	}
	if _, err := c.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := c.Profile(ctx, 2, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Steps) != 2 || p.Steps[0].Metrics.GetLr() != 1e-3 {
		t.Fatalf("profile of the launch run: %v", p.Steps)
	}
	for _, s := range p.Steps {
		if s.ComputeS["matmul"] <= 0 {
			t.Fatalf("no matmul time in %v", s.ComputeS)
		}
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the launch run did not finish")
	}
	if r.err != nil || r.res.Steps != 60 {
		t.Fatalf("ServeRun = %+v, %v", r.res, r.err)
	}
	if _, err := os.Stat(filepath.Join(dir, "launch.sock")); !os.IsNotExist(err) {
		t.Fatalf("socket left after the run: %v", err)
	}
	raw, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	var tf struct {
		TraceEvents []struct {
			Cat string `json:"cat"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(raw, &tf); err != nil {
		t.Fatalf("trace file: %v", err)
	}
	steps, matmuls := 0, 0
	for _, ev := range tf.TraceEvents {
		switch ev.Cat {
		case "step":
			steps++
		case "matmul":
			matmuls++
		}
	}
	if steps != 60 || matmuls < 60 {
		t.Fatalf("trace has %d steps and %d matmuls, want every one of the 60 steps", steps, matmuls)
	}
}

// TestDialOrStartStartsDetachedSession auto-starts the default session in a new process (this
// test binary acting as halo-shell), refuses to auto-start another name, then stops the
// session with SIGTERM through Stop.
func TestDialOrStartStartsDetachedSession(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("HALO_SESSION_DIR", dir)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	so := session.StartOptions{Command: []string{exe}, Env: []string{"HALO_SESSION_HELPER=serve", "HALO_SESSION_NAME=" + session.DefaultName}, Wait: 30 * time.Second}
	if _, err := session.DialOrStart(ctx, "auto", session.Options{ClientName: "auto"}, so); !errors.Is(err, session.ErrNotRunning) {
		t.Fatalf("DialOrStart of a name that does not run: %v, want ErrNotRunning", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "auto.sock")); err == nil {
		t.Fatal("DialOrStart of a name that does not run left a socket")
	}
	c, err := session.DialOrStart(ctx, session.DefaultName, session.Options{ClientName: "auto"}, so)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st := status(t, c)
	pid := int(st.Pid)
	if pid == os.Getpid() || pid <= 0 {
		t.Fatalf("session pid %d", pid)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if sid, err := sessionID(pid); err != nil || sid != pid {
		t.Fatalf("the session is not detached in its own session: sid %d, %v", sid, err)
	}
	if _, err := os.Stat(filepath.Join(dir, session.DefaultName+".log")); err != nil {
		t.Fatalf("no log beside the socket: %v", err)
	}
	// A second DialOrStart attaches to the same process.
	c2, err := session.DialOrStart(ctx, session.DefaultName, session.Options{}, so)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if st2 := status(t, c2); st2.Pid != st.Pid {
		t.Fatalf("second DialOrStart reached pid %d, want %d", st2.Pid, st.Pid)
	}
	if _, err := session.Start(ctx, session.StartOptions{Command: so.Command, Env: so.Env}); err == nil {
		t.Fatal("Start of a running session succeeded")
	} else {
		mustContain(t, err, "already running")
	}
	if _, err := session.Stop(ctx, session.DefaultName, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the session process to exit", func() bool { return syscall.Kill(pid, 0) == syscall.ESRCH })
	if ss, err := session.List(ctx); err != nil || len(ss) != 0 {
		t.Fatalf("List after Stop = %v, %v", ss, err)
	}
}

// sessionID reads the session id of a process from /proc (field 6 of /proc/PID/stat).
func sessionID(pid int) (int, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(raw)
	i := strings.LastIndexByte(s, ')') // the command name may contain spaces
	f := strings.Fields(s[i+1:])
	if len(f) < 4 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	return strconv.Atoi(f[3])
}
