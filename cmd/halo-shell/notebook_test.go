package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNotebookRunRefusesBadInput: a notebook that cannot be read or is not nbformat 4 is
// refused before any kernel starts, with a message naming the file and the problem.
func TestNotebookRunRefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"missing file", []string{"notebook", "run", filepath.Join(dir, "none.ipynb")}, "none.ipynb: no such file"},
		{"not JSON", []string{"notebook", "run", write("a.ipynb", "# title\n")}, "a.ipynb: nbrun: not a notebook: not JSON"},
		{"nbformat 3", []string{"notebook", "run", write("b.ipynb", `{"nbformat": 3, "nbformat_minor": 0}`)}, "nbformat 3; only version 4"},
		{"no cells", []string{"notebook", "run", write("c.ipynb", `{"nbformat": 4, "nbformat_minor": 5, "metadata": {}}`)}, `no "cells" list`},
		{"negative timeout", []string{"notebook", "run", "--timeout=-1s", write("d.ipynb", `{"nbformat": 4, "nbformat_minor": 5, "cells": []}`)}, "--timeout -1s is negative"},
		{"no notebook", []string{"notebook", "run"}, "accepts 1 arg"},
		{"outputs of a non-notebook", []string{"notebook", "outputs", write("e.ipynb", `[]`)}, "not an nbformat 4 notebook"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := runRootErr(t, "", c.args...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v: error %v, want one containing %q", c.args, err, c.want)
			}
		})
	}
}

// TestNotebookOutputsPrintsTextInOrder reads an executed notebook's outputs: streams given
// as lists of lines, text/plain of a result, an error; images are left out.
func TestNotebookOutputsPrintsTextInOrder(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.ipynb")
	nb := `{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
	 {"cell_type": "markdown", "id": "m", "metadata": {}, "source": "verdict: not an output"},
	 {"cell_type": "code", "id": "a", "metadata": {}, "source": "", "execution_count": 1, "outputs": [
	  {"output_type": "stream", "name": "stdout", "text": ["verdict: holds here: x\n", "more"]},
	  {"output_type": "display_data", "data": {"image/png": "iVBOR", "text/plain": ["<image>"]}, "metadata": {}},
	  {"output_type": "execute_result", "execution_count": 1, "data": {"text/plain": "42"}, "metadata": {}}]},
	 {"cell_type": "code", "id": "b", "metadata": {}, "source": "", "execution_count": 2, "outputs": [
	  {"output_type": "error", "ename": "CompileError", "evalue": "undefined: x", "traceback": []}]}
	]}`
	if err := os.WriteFile(p, []byte(nb), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := runRootErr(t, "", "notebook", "outputs", p)
	if err != nil {
		t.Fatal(err)
	}
	const want = "verdict: holds here: x\nmore\n<image>\n42\nCompileError: undefined: x\n"
	if out != want {
		t.Errorf("notebook outputs printed %q, want %q", out, want)
	}
}
