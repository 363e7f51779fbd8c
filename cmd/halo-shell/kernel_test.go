package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/kernel"
)

func TestKernelCommand(t *testing.T) {
	run := func(args ...string) (string, error) { return runRoot(t, args...) }
	if _, err := run("kernel"); err == nil || !strings.Contains(err.Error(), "--connection-file is required") {
		t.Errorf("kernel without a connection file: %v", err)
	}
	dir := t.TempDir()
	bad := filepath.Join(dir, "conn.json")
	os.WriteFile(bad, []byte(`{"transport":"tcp","ip":"127.0.0.1","shell_port":0}`), 0o600)
	if _, err := run("kernel", "--connection-file", bad); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "shell_port") {
		t.Errorf("kernel with a bad connection file: %v", err)
	}
	out, err := run("kernel", "install", "--prefix", dir)
	if err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(dir, "share", "jupyter", "kernels", "halo", "kernel.json")
	if !strings.Contains(out, filepath.Dir(spec)) {
		t.Errorf("install printed %q, want the directory", out)
	}
	b, err := os.ReadFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	var s kernel.Spec
	if err := json.Unmarshal(b, &s); err != nil || len(s.Argv) != 4 || !filepath.IsAbs(s.Argv[0]) || s.Argv[1] != "kernel" {
		t.Errorf("kernel.json = %s (%v)", b, err)
	}
}
