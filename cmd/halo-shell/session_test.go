package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/session/server"
)

func TestSessionCommands(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("HALO_SESSION_DIR", dir)
	s, err := server.New(server.Options{Name: "cmdtest", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	defer func() { cancel(); <-done }()
	run := func(args ...string) (string, error) { return runRoot(t, args...) }
	tests := []struct {
		args []string
		want []string
		err  string
	}{
		{[]string{"session", "list"}, []string{"NAME", "cmdtest", "empty", s.Socket()}, ""},
		{[]string{"session", "status", "--name", "cmdtest"}, []string{"session cmdtest", "empty, step 0"}, ""},
		{[]string{"session", "status", "--name", "nobody"}, nil, `no session named "nobody" is running (running: cmdtest)`},
		{[]string{"session", "start", "--listen", "http://x:1"}, nil, "want tcp://HOST:PORT"},
		{[]string{"session", "stop", "--name", "nobody"}, nil, `no session named "nobody" is running (running: cmdtest); nothing to stop`},
		{[]string{"session", "status", "--name", "a/b"}, nil, "not allowed"},
	}
	for _, tc := range tests {
		out, err := run(tc.args...)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", tc.args, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%v: output lacks %q:\n%s", tc.args, w, out)
			}
		}
	}
}
