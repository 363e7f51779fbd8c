package nbrun

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
)

func TestParseRefusesWhatIsNotANotebook(t *testing.T) {
	cell := func(s string) string {
		return `{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [` + s + `]}`
	}
	cases := []struct {
		name, in string
		is       error
		want     string // in the message
	}{
		{"empty file", ``, ErrNotJSON, "not JSON"},
		{"truncated", `{"cells": [`, ErrNotJSON, "not JSON"},
		{"python notebook as text", "# %%\nprint(1)\n", ErrNotJSON, "at byte"},
		{"a list", `[1, 2]`, ErrNotNotebook, "JSON array"},
		{"null", `null`, ErrNotNotebook, "null"},
		{"no nbformat", `{"cells": [], "metadata": {}}`, ErrNotNotebook, `no "nbformat" key`},
		{"nbformat 3", `{"nbformat": 3, "nbformat_minor": 0, "worksheets": []}`, ErrNotNotebook, "nbformat 3; only version 4"},
		{"nbformat a string", `{"nbformat": "4", "nbformat_minor": 5, "cells": []}`, ErrNotNotebook, `"nbformat" is "4"`},
		{"no minor", `{"nbformat": 4, "cells": [], "metadata": {}}`, ErrNotNotebook, "nbformat_minor"},
		{"negative minor", `{"nbformat": 4, "nbformat_minor": -1, "cells": []}`, ErrNotNotebook, "nbformat_minor"},
		{"no cells", `{"nbformat": 4, "nbformat_minor": 5, "metadata": {}}`, ErrNotNotebook, `no "cells" list`},
		{"cells an object", `{"nbformat": 4, "nbformat_minor": 5, "cells": {}}`, ErrNotNotebook, `"cells" is {}`},
		{"cells null", `{"nbformat": 4, "nbformat_minor": 5, "cells": null}`, ErrNotNotebook, `"cells" is null`},
		{"metadata a list", `{"nbformat": 4, "nbformat_minor": 5, "metadata": [], "cells": []}`, ErrNotNotebook, `"metadata" is []`},
		{"cell a string", cell(`"x"`), ErrNotNotebook, `cell 1: "x" is not an object`},
		{"cell without type", cell(`{"source": ""}`), ErrNotNotebook, `cell 1: no "cell_type"`},
		{"unknown cell type", cell(`{"cell_type": "heading", "source": ""}`), ErrNotNotebook, `"heading"; want code, markdown or raw`},
		{"no source", cell(`{"cell_type": "code", "id": "a"}`), ErrNotNotebook, `cell 1: no "source"`},
		{"source a number", cell(`{"cell_type": "code", "id": "a", "source": 3}`), ErrNotNotebook, "neither a string nor a list of strings"},
		{"source of numbers", cell(`{"cell_type": "code", "id": "a", "source": [1]}`), ErrNotNotebook, "neither a string nor a list of strings"},
		{"empty id", cell(`{"cell_type": "code", "id": "", "source": ""}`), ErrNotNotebook, `"id" is ""`},
		{"cell metadata a string", cell(`{"cell_type": "code", "id": "a", "source": "", "metadata": "x"}`), ErrNotNotebook, `"metadata" is "x"`},
		{"tags not a list", cell(`{"cell_type": "code", "id": "a", "source": "", "metadata": {"tags": "x"}}`), ErrNotNotebook, `metadata "tags" is "x"`},
		{"repeated id", cell(`{"cell_type": "code", "id": "a", "source": ""}, {"cell_type": "markdown", "id": "a", "source": ""}`),
			ErrNotNotebook, `cell 2: id "a" is cell 1's too`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			nb, err := Parse([]byte(c.in))
			if err == nil {
				t.Fatalf("Parse accepted %q: %+v", c.in, nb)
			}
			if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Parse(%q) = %v; want %v naming %q", c.in, err, c.is, c.want)
			}
		})
	}
}

func TestParseKeepsWhatItDoesNotRead(t *testing.T) {
	in := `{"nbformat": 4, "nbformat_minor": 5, "extra": {"k": [1]},
	 "metadata": {"kernelspec": {"name": "halo"}, "custom": "<b>&</b>"},
	 "cells": [
	  {"cell_type": "markdown", "id": "m", "metadata": {"tags": ["t"]}, "source": ["a\n", "b"], "attachments": {}},
	  {"cell_type": "code", "id": "c", "metadata": {"x": 1}, "source": "1\n2", "outputs": [{"output_type": "stream", "name": "stdout", "text": "old\n"}], "execution_count": 4}
	 ]}`
	nb, err := Parse([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if nb.Minor != 5 || len(nb.Cells) != 2 || nb.Cells[0].Source != "a\nb" || nb.Cells[1].Source != "1\n2" || nb.Cells[1].ID != "c" {
		t.Fatalf("parsed %+v", nb)
	}
	out, err := nb.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	_ = json.Unmarshal([]byte(in), &want)
	// Sources are written as lists of lines; everything else as it was.
	want["cells"].([]any)[1].(map[string]any)["source"] = []any{"1\n", "2"}
	if a, b := canon(t, got), canon(t, want); a != b {
		t.Fatalf("written notebook differs from the one read:\n got %s\nwant %s", a, b)
	}
	if !bytes.Contains(out, []byte(`"<b>&</b>"`)) {
		t.Errorf("HTML in strings is escaped: %s", out)
	}
	// A run replaces a code cell's outputs and count.
	n := 7
	nb.Cells[1].reset, nb.Cells[1].ExecutionCount = true, &n
	nb.Cells[1].Outputs = []*Output{{Type: "execute_result", ExecutionCount: 7, Data: map[string]json.RawMessage{"text/plain": json.RawMessage(`"x\ny"`)}}}
	out, _ = nb.Marshal()
	if !bytes.Contains(out, []byte(`"execution_count": 7`)) || bytes.Contains(out, []byte("old")) || !bytes.Contains(out, []byte("\"x\\n\",\n")) {
		t.Errorf("after a run the cell is written as\n%s", out)
	}
}

// canon is v as JSON with sorted keys.
func canon(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseGivesIDsWhereNbformat45WantsThem(t *testing.T) {
	in := `{"nbformat": 4, "nbformat_minor": %d, "metadata": {}, "cells": [{"cell_type": "code", "source": ""}, {"cell_type": "raw", "source": ""}]}`
	for minor, wantIDs := range map[int]bool{4: false, 5: true} {
		nb, err := Parse([]byte(strings.Replace(in, "%d", string(rune('0'+minor)), 1)))
		if err != nil {
			t.Fatal(err)
		}
		a, b := nb.Cells[0].ID, nb.Cells[1].ID
		if wantIDs && (len(a) != 8 || len(b) != 8 || a == b) || !wantIDs && (a != "" || b != "") {
			t.Errorf("nbformat_minor %d: ids %q %q", minor, a, b)
		}
	}
}

func TestLines(t *testing.T) {
	for in, want := range map[string]string{"": "[]", "a": `["a"]`, "a\n": `["a\n"]`, "a\nb": `["a\n","b"]`, "\n\n": `["\n","\n"]`} {
		if got := canon(t, lines(in)); got != want {
			t.Errorf("lines(%q) = %s, want %s", in, got, want)
		}
	}
}

// FuzzParse checks that Parse never panics, and that what it accepts it writes as a
// notebook it accepts again and writes the same way.
func FuzzParse(f *testing.F) {
	if b, err := os.ReadFile("testdata/small.ipynb"); err == nil {
		f.Add(b)
	}
	f.Add([]byte(`{"nbformat": 4, "nbformat_minor": 4, "metadata": {}, "cells": [{"cell_type": "code", "source": ["a", "b"], "outputs": [], "execution_count": null}]}`))
	f.Add([]byte(`{"nbformat": 4, "nbformat_minor": 5, "cells": []}`))
	f.Add([]byte(`{"nbformat": 3}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		nb, err := Parse(b)
		if err != nil {
			return
		}
		out, err := nb.Marshal()
		if err != nil {
			t.Fatalf("Marshal of an accepted notebook: %v", err)
		}
		nb2, err := Parse(out)
		if err != nil {
			t.Fatalf("the written notebook is refused: %v\n%s", err, out)
		}
		out2, err := nb2.Marshal()
		if err != nil || !bytes.Equal(out, out2) {
			t.Fatalf("writing is not stable (%v):\n%s\n---\n%s", err, out, out2)
		}
	})
}
