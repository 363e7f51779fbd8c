package main

import (
	"os"
	"testing"

	"github.com/halo-shell/halo-shell/cell"
)

// TestMain lets the test binary run as the REPL's cell worker (the REPL starts this
// executable with the argument cell-worker).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "cell-worker" {
		os.Exit(cell.WorkerMain())
	}
	os.Exit(m.Run())
}
