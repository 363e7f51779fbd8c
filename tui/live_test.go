package tui

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/x/exp/teatest/v2"

	"github.com/halo-shell/halo-shell/session"
	"github.com/halo-shell/halo-shell/session/server"
)

// tinyConfig is a tiny CPU model that trains in milliseconds per step.
const tinyConfig = "testdata/tiny.yaml"

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// startSession serves a session on the tiny config in this process, on a socket in a
// temporary directory, and returns the socket path.
func startSession(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "halo-tui")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	t.Setenv("HALO_SESSION_DIR", filepath.Join(dir, "run"))
	sock := filepath.Join(dir, "s.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- server.Serve(ctx, server.Options{Name: "live", Socket: sock, ConfigPath: tinyConfig,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("the session did not stop")
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := session.Dial(sock, session.Options{})
		if err == nil {
			err = c.Ping(ctx)
			c.Close()
		}
		if err == nil {
			return sock
		}
		select {
		case err := <-done:
			t.Fatalf("the session ended before answering: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session does not answer on %s: %v", sock, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLiveSession attaches the dashboard to a real session on the CPU engine: steps taken by
// another client show up, p pauses the run, f profiles it, and q detaches leaving the session
// paused and answering.
func TestLiveSession(t *testing.T) {
	sock := startSession(t)
	ctx := context.Background()
	other, err := session.Dial(sock, session.Options{ClientName: "repl"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	me, err := session.Dial(sock, session.Options{ClientName: "tui"})
	if err != nil {
		t.Fatal(err)
	}
	defer me.Close()
	h := attach(t, me, Options{StatusEvery: 100 * time.Millisecond}, 100, 30)
	h.waitScreen("the idle session", contains("idle", "step 0/1000"))

	ms, err := other.Step(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	loss := "loss " + fmtLoss(ms[2].Loss) + " at step 3"
	h.waitScreen("step 3 and its loss", contains("step 3/1000", loss, "controller repl"))

	// The other client starts a run and lets go; the dashboard pauses it.
	if _, err := other.Run(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	h.waitScreen("the run", contains("│ running │"))
	h.tm.Type("p")
	s := h.waitScreen("the pause", contains("│ paused │", "paused after step", "controller (you)"))
	st, err := other.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != session.StatePaused || st.Controller != me.ID() {
		t.Fatalf("after p the session is %v controlled by %q, want paused controlled by the dashboard (%s); screen:\n%s", st.State, st.Controller, me.ID(), s)
	}

	h.tm.Type("f")
	s = h.waitScreen("the profile", contains("profiled steps"))
	if !strings.Contains(s, "parts add up to 100.0%") || strings.Contains(s, "parts sum to") {
		t.Fatalf("the profile's parts do not add up to the step time:\n%s", s)
	}
	for _, want := range []string{"matmul", "idle/host", "MFU – (peak unknown)", "FLOP/s"} {
		if !strings.Contains(s, want) {
			t.Errorf("screen lacks %q after the profile:\n%s", want, s)
		}
	}

	h.tm.Type("q")
	h.tm.WaitFinished(t, teatest.WithFinalTimeout(10*time.Second))
	st, err = other.Status(ctx)
	if err != nil {
		t.Fatalf("the session stopped answering after the dashboard detached: %v", err)
	}
	if st.State != session.StatePaused || st.Controller != "" {
		t.Fatalf("after q the session is %v controlled by %q, want paused with control given back", st.State, st.Controller)
	}
}

// charted returns the steps the dashboard's charts hold.
func (h *harness) charted() []int64 {
	h.t.Helper()
	reply := make(chan []int64, 1)
	h.tm.Send(stepsProbe{reply})
	select {
	case s := <-reply:
		return s
	case <-time.After(waitFor):
		h.t.Fatal("the program does not answer")
		return nil
	}
}

// A dashboard that attaches to a session that has trained already charts the steps before it
// attached (the session sends them first), not only the ones after.
func TestAttachChartsTheStepsSoFar(t *testing.T) {
	sock := startSession(t)
	ctx := context.Background()
	other, err := session.Dial(sock, session.Options{ClientName: "repl"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.Step(ctx, 8); err != nil {
		t.Fatal(err)
	}
	me, err := session.Dial(sock, session.Options{ClientName: "tui"})
	if err != nil {
		t.Fatal(err)
	}
	defer me.Close()
	h := attach(t, me, Options{}, 100, 30)
	h.waitScreen("step 8", contains("step 8/1000"))
	want := []int64{1, 2, 3, 4, 5, 6, 7, 8}
	deadline := time.Now().Add(waitFor)
	for got := h.charted(); !slices.Equal(got, want); got = h.charted() {
		if time.Now().After(deadline) {
			t.Fatalf("after attaching at step 8 the charts hold steps %v, want %v", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Steps after the attach extend the same charts.
	if _, err := other.Step(ctx, 2); err != nil {
		t.Fatal(err)
	}
	want = append(want, 9, 10)
	for got := h.charted(); !slices.Equal(got, want); got = h.charted() {
		if time.Now().After(deadline) {
			t.Fatalf("after two more steps the charts hold steps %v, want %v", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRunSaysHowToStartAMissingSession(t *testing.T) {
	t.Setenv("HALO_SESSION_DIR", t.TempDir())
	err := Run(context.Background(), RunOptions{Session: "nope", NoStart: true})
	if err == nil || !strings.Contains(err.Error(), "session nope does not answer") || !strings.Contains(err.Error(), "halo-shell session start --name nope") {
		t.Fatalf("attaching to a missing session: %v", err)
	}
}
