package main

import (
	"fmt"
	"os"
	"testing"

	"github.com/halo-shell/halo-shell/cell"
)

// TestMain lets the test binary run as the REPL's cell worker (the REPL starts this
// executable with the argument cell-worker). Otherwise it gives the run a session directory of
// its own (HALO_SESSION_DIR, which the commands under test and their child processes inherit),
// so that sessions started by the tests never meet a user's sessions or those of another test
// run on the same machine; a test that needs its own directory still sets one.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "cell-worker" {
		os.Exit(cell.WorkerMain())
	}
	// A short path: unix socket paths are short.
	dir, err := os.MkdirTemp("", "hs")
	if err != nil {
		fmt.Fprintln(os.Stderr, "a session directory for the tests:", err)
		os.Exit(1)
	}
	os.Setenv("HALO_SESSION_DIR", dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
