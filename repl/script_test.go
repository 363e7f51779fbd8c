package repl

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestScriptModeAgainstLiveSession(t *testing.T) {
	sock := startSession(t)
	script := `:load testdata/tiny.yaml
:step 2
st := halo.Status()
st.Step * 100
for i := 0; i < 2; i++ {
	fmt.Println("line", i)
}
panic("boom")
:stpe
func twice(x int) int {
	return 2 * x
}
twice(int(st.Step))
:set lr=1e-4
:profile 2
halo.Metrics()[3].Step
:plot
:quit
:step 1
`
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	images := t.TempDir()
	err := Run(ctx, Options{Session: sock, In: strings.NewReader(script), Out: &out, Err: &errb, ImageDir: images})
	if err == nil || !strings.Contains(err.Error(), "2 cell(s) failed") {
		t.Fatalf("Run err = %v, want 2 failed cells", err)
	}
	o := out.String()
	for _, want := range []string{
		"idle, step 0/1000",
		"step 1  loss ",
		"step 2  loss ",
		"\n200\n",
		"line 0\nline 1\n",
		"\n4\n",
		"lr=0.0001",
		"compute/matmul",
		"sum of parts",
		"\n4\n",
	} {
		if !strings.Contains(o, want) {
			t.Errorf("output lacks %q:\n%s", want, o)
		}
	}
	png := filepath.Join(images, "image-1.png")
	if !strings.Contains(o, `<image "loss"`) || !strings.Contains(o, "-> "+png) {
		t.Errorf(":plot output does not name the image file %s:\n%s", png, o)
	}
	if b, err := os.ReadFile(png); err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Errorf("image file: %v", err)
	}
	e := errb.String()
	for _, want := range []string{"error: panic: boom", "at cell[", "error: unknown command :stpe"} {
		if !strings.Contains(e, want) {
			t.Errorf("errors lack %q:\n%s", want, e)
		}
	}
	// The REPL detached; the session goes on serving at step 4 (2 steps + 2 profiled).
	st, err := dialT(t, sock).Status(ctx)
	if err != nil || st.Step != 4 {
		t.Fatalf("after the script: step %d, %v", st.GetStep(), err)
	}
	if st.Controller != "" {
		t.Fatalf("the REPL still controls the session after detaching: %q", st.Controller)
	}
}

func TestScriptIncompleteCellIsReported(t *testing.T) {
	var out, errb bytes.Buffer
	err := Run(context.Background(), Options{Session: filepath.Join(t.TempDir(), "none.sock"),
		In: strings.NewReader("x := 1\nfunc f() {\n"), Out: &out, Err: &errb})
	if err == nil || !strings.Contains(errb.String(), "error: cell[2]") {
		t.Fatalf("err = %v, stderr %q", err, errb.String())
	}
}

func TestHistoryPersists(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "hist")
	h, err := LoadHistory(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []string{":step 2", "", "   ", ":step 2", "x := 1", "multi\nline", `"quoted"`, "x := 1"} {
		h.Add(e)
	}
	want := []string{":step 2", "x := 1", "multi\nline", `"quoted"`, "x := 1"}
	if got := h.Entries(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("entries = %q, want %q", got, want)
	}
	if h.At(0) != "x := 1" || h.At(h.Len()-1) != ":step 2" {
		t.Fatalf("At: %q %q", h.At(0), h.At(h.Len()-1))
	}
	h2, err := LoadHistory(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := h2.Entries(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("reloaded = %q, want %q", got, want)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("history file mode %v, %v", st.Mode(), err)
	}
	// Garbage lines are skipped, the bound holds.
	os.WriteFile(path, []byte("\"unterminated\nok\n"+strings.Repeat("l\nm\n", MaxHistory)), 0o600)
	h3, err := LoadHistory(path)
	if err != nil {
		t.Fatal(err)
	}
	if h3.Len() != MaxHistory || h3.At(0) != "m" {
		t.Fatalf("len %d, newest %q", h3.Len(), h3.At(0))
	}
}

// :generate prints what the model generated, and says so when that is nothing (a model early
// in training often ends the sequence at once), instead of printing an empty line.
func TestGeneratePrintsTheTextOrSaysThereIsNone(t *testing.T) {
	sock := startSession(t)
	// The quickstart at step 5 is the case users met: its model generates nothing yet.
	script := `:load ../examples/quickstart.yaml
:step 5
fmt.Printf("halo.Generate=%q\n", halo.Generate("What is 2+2?"))
fmt.Println("<<")
:generate What is 2+2?
fmt.Println(">>")
`
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if err := Run(ctx, Options{Session: sock, In: strings.NewReader(script), Out: &out, Err: &errb}); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	o := out.String()
	var api string
	if i := strings.Index(o, "halo.Generate="); i >= 0 {
		api = o[i+len("halo.Generate=") : i+strings.Index(o[i:], "\n")]
	}
	a, b := strings.Index(o, "<<\n"), strings.Index(o, ">>\n")
	if api == "" || a < 0 || b < a {
		t.Fatalf("output %q", o)
	}
	shown := strings.TrimSpace(o[a+3 : b])
	text, err := strconv.Unquote(api)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case text == "" && !strings.Contains(shown, "the model generated no text"):
		t.Errorf(":generate of nothing printed %q, want it said", shown)
	case strings.TrimSpace(text) == "" && text != "" && shown != fmt.Sprintf("(only white space: %q)", text):
		t.Errorf(":generate of white space %q printed %q", text, shown)
	case strings.TrimSpace(text) != "" && shown != strings.TrimSpace(text):
		t.Errorf(":generate printed %q, the model generated %q", shown, text)
	}
}

// TestLoadRefusesToDiscardUnsavedSteps: :load over a model with trained steps that were not
// saved is refused and says how to go on; after :save it loads, and --force loads anyway.
func TestLoadRefusesToDiscardUnsavedSteps(t *testing.T) {
	sock := startSession(t)
	ckpt := filepath.Join(t.TempDir(), "ckpt")
	script := `:load testdata/tiny.yaml
:step 3
:load testdata/tiny.yaml
halo.Status().Step
:save ` + ckpt + `
:load testdata/tiny.yaml
:step 2
:load --force testdata/tiny.yaml
halo.Status().Step
`
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	err := Run(ctx, Options{Session: sock, In: strings.NewReader(script), Out: &out, Err: &errb})
	if err == nil || !strings.Contains(err.Error(), "1 cell(s) failed") {
		t.Fatalf("Run err = %v, want 1 failed cell; errors:\n%s", err, errb.String())
	}
	e := errb.String()
	for _, want := range []string{"3 trained step(s) not saved", "step 3, last saved or loaded at step 0", ":save DIR", ":load --force"} {
		if !strings.Contains(e, want) {
			t.Errorf("the refused :load does not say %q:\n%s", want, e)
		}
	}
	o := out.String()
	if !strings.Contains(o, "\n3\n") || !strings.Contains(o, "saved to "+ckpt) || !strings.HasSuffix(o, "\n0\n") {
		t.Errorf("want step 3 kept by the refusal, the save, and step 0 after --force:\n%s", o)
	}
}
