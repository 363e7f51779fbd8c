package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/cell"
	"github.com/halo-shell/halo-shell/kernel/internal/wire"
	"github.com/halo-shell/halo-shell/session"
	"github.com/halo-shell/halo-shell/session/server"
)

func TestProgressKind(t *testing.T) {
	cases := []struct {
		code string
		want progress
	}{
		{"1+2", noProgress},
		{"%status", noProgress},
		{"%step 5", stepProgress},
		{"%profile 3", stepProgress},
		{"%run", runProgress},
		{"%run 10", runProgress},
		{"%resume", runProgress},
		{"%step 2\n%run", runProgress},
		{"ms := halo.Step(3)", stepProgress},
		{"halo.RunSteps(5)", runProgress},
		{"%stepx 5", noProgress}, // not a command
		{"x := 1 // %step 5", noProgress},
	}
	for code, want := range map[string]bool{"%run": true, "%step 2\n%run 5\n": true, "%run 5\nx": false, "%resume": true, "%status": false} {
		if got := endsWithRun(code); got != want {
			t.Errorf("endsWithRun(%q) = %v", code, got)
		}
	}
	for _, c := range cases {
		if got := progressKind(c.code); got != c.want {
			t.Errorf("progressKind(%q) = %d, want %d", c.code, got, c.want)
		}
	}
}

func TestCellErrorNamesTheKind(t *testing.T) {
	cases := []struct {
		err       error
		name      string
		traceback string
	}{
		{&cell.Error{Kind: cell.KindCompile, Message: "cell[1]:1:1: undefined: x"}, "CompileError", "cell[1]:1:1: undefined: x"},
		{&cell.Error{Kind: cell.KindPanic, Message: "panic: boom", Trace: []string{"  at f (cell[2]:3:4)"}}, "Panic", "  at f (cell[2]:3:4)"},
		{&cell.Error{Kind: cell.KindAPI, Message: "halo.Step: no model loaded\nload one with %load"}, "SessionError", "load one with %load"},
		{&cell.Error{Kind: cell.KindInterrupted, Message: "interrupted"}, "Interrupted", "interrupted"},
	}
	for _, c := range cases {
		var e *Error
		if !errors.As(cellError(c.err), &e) {
			t.Fatalf("cellError(%v) is not an *Error", c.err)
		}
		if e.Name != c.name || !strings.Contains(strings.Join(e.Traceback, "\n"), c.traceback) {
			t.Errorf("cellError(%v) = %s %q, want name %s and traceback containing %q", c.err, e.Name, e.Traceback, c.name, c.traceback)
		}
	}
	plain := errors.New("x")
	if cellError(plain) != plain {
		t.Error("cellError changed an error that is not the interpreter's")
	}
}

func TestStableClientID(t *testing.T) {
	a, b := StableClientID("key-1"), StableClientID("key-1")
	if a != b || a == StableClientID("key-2") || !strings.HasPrefix(a, "kernel-") {
		t.Fatalf("StableClientID: %s %s %s", a, b, StableClientID("key-2"))
	}
	if StableClientID("") == StableClientID("") {
		t.Fatal("an empty key must give random ids")
	}
}

// haloKernel runs the notebook interpreter in a kernel attached to an in-process session on
// the CPU, from the repository root (the quickstart config's paths are relative to it).
func haloKernel(t *testing.T) (*client, *server.Server) {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "hks")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	t.Setenv("HALO_SESSION_DIR", dir)
	srv, err := server.New(server.Options{Name: "kt", Socket: filepath.Join(dir, "kt.sock"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(context.Background()) }()
	t.Cleanup(func() {
		srv.Shutdown()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("session did not stop")
		}
	})
	t.Chdir(root)
	h, err := NewHalo(HaloOptions{Session: srv.Socket(), ClientID: "kernel-test"})
	if err != nil {
		t.Fatal(err)
	}
	c, _, _ := startKernel(t, h)
	return c, srv
}

func statusOf(t *testing.T, sock string) *session.StatusResponse {
	t.Helper()
	c, err := session.Dial(sock, session.Options{ClientName: "observer"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// lastProgress returns the text of the last progress display (display_data or its updates).
func lastProgress(t *testing.T, msgs []*wire.Message) (text string, updates int, id string) {
	t.Helper()
	for _, m := range msgs {
		if m.Header.MsgType != "display_data" && m.Header.MsgType != "update_display_data" {
			continue
		}
		var c struct {
			Data      map[string]string `json:"data"`
			Transient map[string]string `json:"transient"`
		}
		json.Unmarshal(m.Content, &c)
		if !strings.HasPrefix(c.Transient["display_id"], "halo-progress-") {
			continue
		}
		if id != "" && c.Transient["display_id"] != id {
			t.Fatalf("progress display id changed within a cell: %s then %s", id, c.Transient["display_id"])
		}
		id = c.Transient["display_id"]
		if m.Header.MsgType == "update_display_data" {
			updates++
		}
		text = c.Data["text/plain"]
	}
	return text, updates, id
}

func resultText(msgs []*wire.Message) string {
	for _, m := range msgs {
		if m.Header.MsgType == "execute_result" {
			var c struct {
				Data map[string]string `json:"data"`
			}
			json.Unmarshal(m.Content, &c)
			return c.Data["text/plain"]
		}
	}
	return ""
}

func TestRunFollowsProgressAndInterruptLeavesTheSessionRunning(t *testing.T) {
	c, srv := haloKernel(t)
	if r, _ := c.execute("%load examples/quickstart.yaml", nil); r["status"] != "ok" {
		t.Fatalf("%%load: %v", r)
	}
	// %run N follows the background run until it stops, updating one display in place.
	r, msgs := c.execute("%run 8", nil)
	if r["status"] != "ok" {
		t.Fatalf("%%run 8: %v", r)
	}
	text, _, id := lastProgress(t, msgs)
	if id == "" || !strings.HasPrefix(text, "step 8 ") {
		t.Fatalf("%%run 8 progress ended on %q (display %q), want step 8", text, id)
	}
	if res := resultText(msgs); !strings.HasPrefix(res, "run ended: session kt idle at step 8/3000, loss ") {
		t.Errorf("%%run 8 result = %q, want how the run ended", res)
	}
	if st := statusOf(t, srv.Socket()); st.Step != 8 || st.State == session.StateRunning {
		t.Fatalf("after %%run 8 the session is %v at step %d; want stopped at 8", st.State, st.Step)
	}

	// Interrupting a followed run stops the cell, not the run.
	id2 := c.send(c.shell, "execute_request", map[string]any{"code": "%run", "silent": false, "store_history": true})
	deadline := time.Now().Add(30 * time.Second)
	for statusOf(t, srv.Socket()).Step < 12 {
		if time.Now().After(deadline) {
			t.Fatal("the run did not reach step 12")
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.send(c.control, "interrupt_request", map[string]any{})
	c.recv(c.controlR, "interrupt_reply")
	r = c.recv(c.shellR, "execute_reply")
	if r["status"] != "error" || r["ename"] != "Interrupted" {
		t.Fatalf("interrupted %%run reply: %v", r)
	}
	c.iopubUntilIdle(id2)
	// The run goes on: it takes further steps (however slowly this machine steps).
	s1 := statusOf(t, srv.Socket())
	s2 := s1
	for deadline := time.Now().Add(30 * time.Second); s2.State == session.StateRunning && s2.Step <= s1.Step && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		s2 = statusOf(t, srv.Socket())
	}
	if s2.State != session.StateRunning || s2.Step <= s1.Step {
		t.Fatalf("after interrupting the cell the session is %v, step %d -> %d; want still running", s2.State, s1.Step, s2.Step)
	}
	if r, _ := c.execute("%pause", nil); r["status"] != "ok" {
		t.Fatalf("%%pause: %v", r)
	}
	if st := statusOf(t, srv.Socket()); st.State != session.StatePaused {
		t.Fatalf("after %%pause the session is %v", st.State)
	}
}

func TestInterruptStepCellKeepsTheSessionUsable(t *testing.T) {
	c, srv := haloKernel(t)
	if r, _ := c.execute("%load examples/quickstart.yaml", nil); r["status"] != "ok" {
		t.Fatalf("%%load: %v", r)
	}
	id := c.send(c.shell, "execute_request", map[string]any{"code": "%step 2000", "silent": false, "store_history": true})
	deadline := time.Now().Add(30 * time.Second)
	for statusOf(t, srv.Socket()).Step < 3 {
		if time.Now().After(deadline) {
			t.Fatal("the steps did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.send(c.control, "interrupt_request", map[string]any{})
	c.recv(c.controlR, "interrupt_reply")
	r := c.recv(c.shellR, "execute_reply")
	if r["status"] != "error" || r["ename"] != "Interrupted" {
		t.Fatalf("interrupted %%step reply: %v", r)
	}
	if st := statusOf(t, srv.Socket()); st.Step >= 2000 {
		t.Errorf("the interrupted cell ended only after all its steps (step %d)", st.Step)
	}
	c.iopubUntilIdle(id)
	// The session answers and the next cell steps.
	before := statusOf(t, srv.Socket()).Step
	waitIdle := time.Now().Add(60 * time.Second)
	for statusOf(t, srv.Socket()).State == session.StateRunning && time.Now().Before(waitIdle) {
		time.Sleep(20 * time.Millisecond)
	}
	r, _ = c.execute("%step 1", nil)
	if r["status"] != "ok" {
		t.Fatalf("%%step 1 after the interrupt: %v", r)
	}
	if after := statusOf(t, srv.Socket()).Step; after <= before {
		t.Fatalf("step count %d -> %d after %%step 1", before, after)
	}
}

func TestAttachPicksAnotherSession(t *testing.T) {
	c, srv := haloKernel(t)
	missing := filepath.Join(t.TempDir(), "nobody.sock")
	r, _ := c.execute("%attach "+missing, nil)
	if r["status"] != "error" || r["ename"] != "SessionError" || !strings.Contains(r["evalue"].(string), missing) {
		t.Fatalf("%%attach to a missing socket: %v", r)
	}
	r, msgs := c.execute("%attach "+srv.Socket(), nil)
	if r["status"] != "ok" || !strings.HasPrefix(resultText(msgs), "session kt ") {
		t.Fatalf("%%attach %s: %v %q", srv.Socket(), r, resultText(msgs))
	}
	// The kernel is a client of the session under its own id.
	st := statusOf(t, srv.Socket())
	found := false
	for _, cl := range st.Clients {
		found = found || (cl.Id == "kernel-test" && cl.Name == "kernel")
	}
	if !found {
		t.Fatalf("session clients %v lack the kernel", st.Clients)
	}
}

// %profile N shows N steps in its progress display: a profiled step arrives as metrics and
// as a profile, and is counted once.
func TestProfileCellCountsEachStepOnce(t *testing.T) {
	c, srv := haloKernel(t)
	if r, _ := c.execute("%load examples/quickstart.yaml", nil); r["status"] != "ok" {
		t.Fatalf("%%load: %v", r)
	}
	r, msgs := c.execute("%profile 3", nil)
	if r["status"] != "ok" {
		t.Fatalf("%%profile 3: %v", r)
	}
	text, _, _ := lastProgress(t, msgs)
	if !strings.HasPrefix(text, "step 3 ") || !strings.HasSuffix(text, "steps in this cell 3") {
		t.Fatalf("%%profile 3 progress ended on %q, want step 3 and 3 steps in this cell", text)
	}
	if st := statusOf(t, srv.Socket()); st.Step != 3 {
		t.Fatalf("after %%profile 3 the session is at step %d", st.Step)
	}
}
