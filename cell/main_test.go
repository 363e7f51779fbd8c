package cell

import (
	"os"
	"testing"
)

// TestMain lets the test binary run as a Supervised interpreter's worker.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "cell-worker" {
		os.Exit(WorkerMain())
	}
	os.Exit(m.Run())
}
