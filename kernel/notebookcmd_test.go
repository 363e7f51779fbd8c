package kernel

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestNotebookRunCommand drives `halo-shell notebook run` and `notebook outputs` as a user
// would: a notebook that runs through exits 0 and is written where --out says; one with a
// failing cell exits 1 naming the cell, and is written up to it.
func TestNotebookRunCommand(t *testing.T) {
	env, tmp := jupyterEnv(t)
	exe := haloBinary(t)
	run := func(args ...string) (string, string, error) {
		cmd := exec.Command(exe, args...)
		cmd.Env, cmd.Dir = env, tmp
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}
	small, _ := filepath.Abs("nbrun/testdata/small.ipynb")
	out := filepath.Join(tmp, "small.out.ipynb")
	_, stderr, err := run("notebook", "run", small, "--out", out, "-v")
	if err != nil {
		t.Fatalf("notebook run: %v\n%s", err, stderr)
	}
	for _, want := range []string{"cell 2 (1 of 4) ok", "4 code cell(s) ran", "0 failed; wrote " + out} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	text, stderr, err := run("notebook", "outputs", out)
	if err != nil || !strings.HasPrefix(text, "hello\n<world> & more\n42\n<image \"squares\"") || !strings.HasSuffix(text, "after the plot\nto stderr\n") {
		t.Errorf("notebook outputs: %v %q\n%s", err, text, stderr)
	}

	bad := filepath.Join(tmp, "bad.ipynb")
	nb := `{"nbformat": 4, "nbformat_minor": 5, "metadata": {"kernelspec": {"name": "python3"}}, "cells": [
	 {"cell_type": "code", "id": "ok", "metadata": {}, "source": "fmt.Println(1)", "outputs": [], "execution_count": null},
	 {"cell_type": "code", "id": "py", "metadata": {}, "source": "import numpy as np", "outputs": [], "execution_count": null},
	 {"cell_type": "code", "id": "never", "metadata": {}, "source": "fmt.Println(2)", "outputs": [], "execution_count": null}]}`
	if err := os.WriteFile(bad, []byte(nb), 0o644); err != nil {
		t.Fatal(err)
	}
	_, stderr, err = run("notebook", "run", bad)
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("notebook run of a failing notebook: %v, want exit status 1\n%s", err, stderr)
	}
	for _, want := range []string{`names the kernel "python3"`, `cell 2 (id py) "import numpy as np" failed: `, "1 failed; wrote " + filepath.Join(tmp, "bad.executed.ipynb")} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	text, _, err = run("notebook", "outputs", filepath.Join(tmp, "bad.executed.ipynb"))
	if err != nil || !strings.HasPrefix(text, "1\n") || strings.Count(text, "\n") != 2 {
		t.Errorf("outputs of the failed run: %v %q, want 1 and the error", err, text)
	}
}
