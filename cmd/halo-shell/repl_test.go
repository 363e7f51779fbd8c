package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// With no subcommand, halo-shell runs the REPL; a non-terminal input is read as a script.
func TestRootRunsREPLScript(t *testing.T) {
	t.Setenv("HALO_SESSION_DIR", t.TempDir())
	var out, errb bytes.Buffer
	rootCmd.SetIn(strings.NewReader("x := 20\nx + 22\n:help step\n"))
	rootCmd.SetOut(&out)
	rootCmd.SetErr(&errb)
	rootCmd.SetArgs([]string{"--history", "-", "--session", filepath.Join(t.TempDir(), "none.sock")})
	defer func() {
		rootCmd.SetIn(nil)
		rootCmd.SetOut(nil)
		rootCmd.SetErr(nil)
		rootCmd.SetArgs(nil)
	}()
	if err := rootCmd.Execute(); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	if o := out.String(); !strings.Contains(o, "42\n") || !strings.Contains(o, ":step [N]") {
		t.Fatalf("output %q", o)
	}
}
