package cell

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/session/server"
)

// startSession serves a real session (CPU engine) in this process on a socket in a temporary
// directory and returns its socket path.
func startSession(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("HALO_SESSION_DIR", dir)
	s, err := server.New(server.Options{Name: "celltest", Socket: filepath.Join(dir, "celltest.sock"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(context.Background()) }()
	t.Cleanup(func() {
		s.Shutdown()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("the session did not stop within 30s")
		}
	})
	return s.Socket()
}

// attached returns an interpreter attached to a fresh session with the tiny model loaded.
func attached(t *testing.T) (*Interpreter, string) {
	t.Helper()
	sock := startSession(t)
	it, err := New(Options{Session: sock, ClientName: "cell-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { it.Close() })
	r := evalT(t, it, ":load testdata/tiny.yaml")
	if !strings.Contains(plain(r.Value), "idle, step 0") {
		t.Fatalf(":load = %q", plain(r.Value))
	}
	return it, sock
}

func evalT(t *testing.T, it *Interpreter, src string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := it.Eval(ctx, src)
	if err != nil {
		t.Fatalf("Eval(%q): %v", src, err)
	}
	return r
}

func TestSessionCommandsAndAPI(t *testing.T) {
	it, sock := attached(t)

	r := evalT(t, it, ":step 2")
	lines := strings.Split(plain(r.Value), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "step 1  loss ") || !strings.HasPrefix(lines[1], "step 2  loss ") {
		t.Fatalf(":step 2 = %q", plain(r.Value))
	}

	// The API sees the same session; values persist between cells.
	r = evalT(t, it, "ms := halo.Step(1)\nst := halo.Status()\nst.Step")
	if plain(r.Value) != "3" {
		t.Fatalf("st.Step = %q, want 3", plain(r.Value))
	}
	r = evalT(t, it, "len(halo.Metrics())")
	if plain(r.Value) != "3" {
		t.Fatalf("len(halo.Metrics()) = %q, want 3", plain(r.Value))
	}
	r = evalT(t, it, "ms[0].Step == 3 && ms[0].Loss > 0 && halo.Losses()[2] == ms[0].Loss")
	if plain(r.Value) != "true" {
		t.Fatalf("metrics disagree: %q", plain(r.Value))
	}

	// Hyperparameters: command and API.
	r = evalT(t, it, ":set lr=1e-4 max_grad_norm=0.5")
	if !strings.Contains(plain(r.Value), "lr=0.0001") || !strings.Contains(plain(r.Value), "max_grad_norm=0.5") {
		t.Fatalf(":set = %q", plain(r.Value))
	}
	r = evalT(t, it, `halo.Set("weight_decay", 0.125).WeightDecay`)
	if plain(r.Value) != "0.125" {
		t.Fatalf("halo.Set = %q", plain(r.Value))
	}
	_, err := it.Eval(context.Background(), `halo.Set("max_grad_norm", -1)`)
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindAPI || !strings.Contains(e.Message, "halo.Set") {
		t.Fatalf("invalid value: err = %v", err)
	}

	// Profile: a table whose parts add up to the step time.
	r = evalT(t, it, ":profile 2")
	if !strings.Contains(string(r.Value["text/html"]), "<table>") || !strings.Contains(plain(r.Value), "compute/matmul") {
		t.Fatalf(":profile 2 = %q", r.Value)
	}
	r = evalT(t, it, "p := halo.Profile(1)\ns := p.Steps[0]\nsum := s.Host\nfor _, v := range s.Compute { sum += v }\nfor _, v := range s.Comm { sum += v }\nsum / s.StepTime")
	ratio := plain(r.Value)
	if f, err := parseFloat(ratio); err != nil || math.Abs(f-1) > 0.05 {
		t.Fatalf("breakdown / step time = %s, want within 5%% of 1", ratio)
	}

	// Tensors come back as host copies with their shape.
	r = evalT(t, it, "st := halo.Stats()\nname := st[0].Name\nx := halo.Inspect(name)\nn := 1\nfor _, d := range x.Shape { n *= d }\nn == len(x.Data) && n > 0")
	if plain(r.Value) != "true" {
		t.Fatalf("Inspect shape/data: %q", plain(r.Value))
	}
	_, err = it.Eval(context.Background(), `halo.Inspect("no.such.tensor")`)
	if err == nil || !strings.Contains(err.Error(), "halo.Inspect") {
		t.Fatalf("unknown tensor: err = %v", err)
	}

	// Plots render to PNG and SVG.
	r = evalT(t, it, "halo.PlotLoss()")
	if png := r.Value["image/png"]; len(png) < 8 || string(png[1:4]) != "PNG" {
		t.Fatalf("PlotLoss PNG missing: %q", plain(r.Value))
	}
	if !strings.Contains(string(r.Value["image/svg+xml"]), "<svg") {
		t.Fatal("PlotLoss SVG missing")
	}

	// Eval, generate and save.
	r = evalT(t, it, ":eval")
	if !strings.HasPrefix(plain(r.Value), "eval loss ") {
		t.Fatalf(":eval = %q", plain(r.Value))
	}
	r = evalT(t, it, `len(halo.GenerateN("What is 1+1?", 3)) >= 0`)
	if plain(r.Value) != "true" {
		t.Fatalf("generate: %q", plain(r.Value))
	}
	dir := filepath.Join(t.TempDir(), "ckpt")
	r = evalT(t, it, ":save "+dir)
	if !strings.Contains(plain(r.Value), "saved to") {
		t.Fatalf(":save = %q", plain(r.Value))
	}
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}

	// Run in the background, pause, resume, pause: the history follows the run.
	r = evalT(t, it, ":run")
	if !strings.Contains(plain(r.Value), "running") {
		t.Fatalf(":run = %q", plain(r.Value))
	}
	time.Sleep(300 * time.Millisecond)
	r = evalT(t, it, ":pause")
	if !strings.Contains(plain(r.Value), "paused") {
		t.Fatalf(":pause = %q", plain(r.Value))
	}
	evalT(t, it, ":resume")
	time.Sleep(100 * time.Millisecond)
	evalT(t, it, ":pause")
	r = evalT(t, it, "st := halo.Status()\nst.Step")
	step := plain(r.Value)
	deadline := time.Now().Add(10 * time.Second)
	for {
		r = evalT(t, it, "fmt.Sprint(halo.Metrics()[len(halo.Metrics())-1].Step)")
		if plain(r.Value) == `"`+step+`"` || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if plain(r.Value) != `"`+step+`"` {
		t.Fatalf("history ends at step %s, session at %s", plain(r.Value), step)
	}

	// Attach to the same session by socket path: the history starts over.
	r = evalT(t, it, ":attach "+sock)
	if !strings.Contains(plain(r.Value), "session celltest") {
		t.Fatalf(":attach = %q", plain(r.Value))
	}
}

func TestSessionInterruptLeavesSessionRunning(t *testing.T) {
	it, _ := attached(t)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(300 * time.Millisecond)
		cancel()
	}()
	_, err := it.Eval(ctx, "halo.Step(100000)")
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindInterrupted {
		t.Fatalf("err = %v, want an interruption", err)
	}
	// The session answers and keeps its state; the interpreter goes on.
	r := evalT(t, it, "halo.Status().State != \"empty\"")
	if plain(r.Value) != "true" {
		t.Fatalf("after interrupt: %q", plain(r.Value))
	}
}

func TestSessionUnreachableIsAClearError(t *testing.T) {
	t.Setenv("HALO_SESSION_DIR", t.TempDir())
	it, err := New(Options{Session: filepath.Join(t.TempDir(), "none.sock")})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	_, err = it.Eval(context.Background(), ":status")
	if err == nil || !strings.Contains(err.Error(), "attaching to session") {
		t.Fatalf("err = %v", err)
	}
	// Plain Go still works without a session.
	r := evalT(t, it, "1 + 1")
	if plain(r.Value) != "2" {
		t.Fatal(plain(r.Value))
	}
}

// The session client itself is reachable from cells, for what the halo API does not wrap.
func TestSessionClientFromCell(t *testing.T) {
	it, _ := attached(t)
	evalT(t, it, ":step 1")
	r := evalT(t, it, "resp, err := halo.Session().Status(halo.Context())\nerr == nil && resp.Step == 1 && resp.Name == \"celltest\"")
	if plain(r.Value) != "true" {
		t.Fatalf("status through the client: %q", plain(r.Value))
	}
	// Displaying an interpreted value gives its text form.
	r = evalT(t, it, "type row struct{ Step int64; Loss float64 }\nhalo.Display(row{Step: 1, Loss: 0.5})")
	if len(r.Displays) != 1 || plain(r.Displays[0]) != "{Step:1 Loss:0.5}" {
		t.Fatalf("displays = %q", r.Displays)
	}
}
