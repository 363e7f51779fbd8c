package repl

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/cell"
	"github.com/halo-shell/halo-shell/session"
	"github.com/halo-shell/halo-shell/session/server"
)

// TestMain lets the test binary run as the REPL process of the pty test.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "cell-worker" {
		os.Exit(cell.WorkerMain())
	}
	if os.Getenv("HALO_REPL_HELPER") == "1" {
		err := Run(context.Background(), Options{Session: os.Getenv("HALO_REPL_SESSION"), TakeOver: os.Getenv("HALO_REPL_TAKEOVER") == "1"})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// startSession serves a real session (CPU engine) in this process on a socket in a temporary
// directory and returns its socket path.
func startSession(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("HALO_SESSION_DIR", dir)
	s, err := server.New(server.Options{Name: "repltest", Socket: filepath.Join(dir, "repltest.sock"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(context.Background()) }()
	t.Cleanup(func() {
		s.Shutdown()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("the session did not stop within 30s")
		}
	})
	return s.Socket()
}

func dialT(t *testing.T, sock string) *session.Client {
	t.Helper()
	c, err := session.Dial(sock, session.Options{ClientName: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
