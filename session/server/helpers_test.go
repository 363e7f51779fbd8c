package server

import (
	"context"
	"fmt"
	"github.com/halo-shell/halo-shell/session"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const tinyConfig = "testdata/tiny.yaml"

// TestMain lets the test binary act as a second process: a client or a session server.
func TestMain(m *testing.M) {
	if h := os.Getenv("HALO_SESSION_HELPER"); h != "" {
		os.Exit(helperMain(h))
	}
	os.Exit(m.Run())
}

// helperMain runs a helper process and returns its exit code.
func helperMain(kind string) int {
	ctx := context.Background()
	switch kind {
	case "serve":
		// A session server in its own process: SIGTERM stops it.
		ctx, stop := signalContext()
		defer stop()
		err := Serve(ctx, Options{Name: os.Getenv("HALO_SESSION_NAME"), SaveOnStop: os.Getenv("HALO_SAVE_ON_STOP"),
			ConfigPath: tinyConfig, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	case "control-and-hold":
		// Takes control and holds it without a stream or any call but the lease renewals.
		c, err := session.Dial(os.Getenv("HALO_SOCKET"), session.Options{ClientName: "holder"})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := c.Claim(ctx); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("controlling", c.ID())
		select {}
	case "control-and-watch":
		// Takes control, starts a run, watches events forever (until killed).
		c, err := session.Dial(os.Getenv("HALO_SOCKET"), session.Options{ClientName: "victim"})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if _, err := c.Run(ctx, 0); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		st, err := c.Subscribe(ctx, 4)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("watching")
		for {
			if _, err := st.Recv(); err != nil {
				return 0
			}
		}
	case "score-and-hang":
		// Scores rollouts but never answers: its reward function blocks until the process is
		// killed.
		c, err := session.Dial(os.Getenv("HALO_SOCKET"), session.Options{ClientName: "hanging scorer"})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		err = c.ScoreRollouts(ctx, func(context.Context, *session.RolloutBatch) ([]float64, error) {
			fmt.Println("got a batch")
			select {}
		}, nil)
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Fprintln(os.Stderr, "unknown helper", kind)
	return 2
}

// testServer is an in-process session on a socket in a temporary directory.
type testServer struct {
	*Server
	done chan error
}

func startServer(t *testing.T, o Options) *testServer {
	t.Helper()
	dir := t.TempDir()
	if o.Socket == "" {
		o.Socket = filepath.Join(dir, "s.sock")
	}
	if o.Name == "" {
		o.Name = "test"
	}
	t.Setenv("HALO_SESSION_DIR", dir)
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{Server: s, done: make(chan error, 1)}
	go func() { ts.done <- s.Serve(context.Background()) }()
	t.Cleanup(func() {
		s.Shutdown()
		select {
		case <-ts.done:
		case <-time.After(30 * time.Second):
			t.Error("the server did not stop within 30s")
		}
	})
	return ts
}

func dial(t *testing.T, target, name string) *session.Client {
	t.Helper()
	c, err := session.Dial(target, session.Options{ClientName: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// loaded starts a server, loads the tiny config and returns a controlling client.
func loaded(t *testing.T, overrides ...string) (*testServer, *session.Client) {
	t.Helper()
	s := startServer(t, Options{})
	c := dial(t, s.Socket(), "controller")
	if _, err := c.Load(ctxT(t), tinyConfig, "sft", overrides...); err != nil {
		t.Fatal(err)
	}
	return s, c
}

// waitFor polls cond every 5ms until it holds or 30s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func status(t *testing.T, c *session.Client) *session.StatusResponse {
	t.Helper()
	st, err := c.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func mustContain(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one containing %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("error %q does not contain %q", err, p)
		}
	}
}
