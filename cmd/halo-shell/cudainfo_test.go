package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend/cuda"
)

// TestRunCudaInfo checks both output forms. On a machine without a GPU (CI) they must say the
// backend is unusable and name the library and the variable that overrides its search; with one
// they must list the device.
func TestRunCudaInfo(t *testing.T) {
	run := func(args ...string) string {
		var out bytes.Buffer
		rootCmd.SetOut(&out)
		rootCmd.SetArgs(args)
		defer rootCmd.SetArgs(nil)
		if err := rootCmd.Execute(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return out.String()
	}
	text := run("run", "cuda-info")
	var dg cuda.Diagnostics
	if err := json.Unmarshal([]byte(run("run", "cuda-info", "--json")), &dg); err != nil {
		t.Fatalf("--json output is not JSON: %v", err)
	}
	if len(dg.Libraries) != 3 {
		t.Errorf("--json lists %d libraries, want 3", len(dg.Libraries))
	}
	if cuda.Available() == nil {
		if !strings.Contains(text, "usable:      yes") || len(dg.Devices) == 0 || !strings.Contains(text, dg.Devices[0].Arch) {
			t.Errorf("GPU machine: output lacks the device:\n%s", text)
		}
		return
	}
	if dg.Usable || dg.Reason == "" {
		t.Errorf("--json says usable=%v reason=%q on a machine where Available fails", dg.Usable, dg.Reason)
	}
	for _, want := range []string{"usable:      no", "CUDA driver:", "HALO_LIBCUDA"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
}
