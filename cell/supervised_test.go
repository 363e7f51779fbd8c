package cell

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/session"
)

// syncBuf is a bytes.Buffer safe for concurrent writers.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSupervisedSurvivesCellsThatEndTheProcess runs cells in a child process: unbounded
// recursion, an allocation the machine cannot give, and memory past the limit each end the
// child and come back as a crash error saying why; the next cell runs in a new child attached
// to the same session as the same client (still in control), with the earlier functions but
// not the variables. Output streams while a cell runs, and an interrupt stops a cell.
func TestSupervisedSurvivesCellsThatEndTheProcess(t *testing.T) {
	t.Setenv("HALO_CELL_MEMORY_LIMIT", "512MiB")
	t.Setenv("HALO_CELL_MAX_STACK", "64MiB")
	sock := startSession(t)
	var stdout syncBuf
	it, err := NewSupervised(SupervisedOptions{Options: Options{Session: sock, ClientName: "supervised", Stdout: &stdout}})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	eval := func(src string) (Result, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		return it.Eval(ctx, src)
	}
	must := func(src string) Result {
		t.Helper()
		r, err := eval(src)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		return r
	}
	must(":load testdata/tiny.yaml")
	must(":step 1")
	must("func twice(n int) int { return 2 * n }\nx := 21")
	c, err := it.Session()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	before, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if before.Controller == "" || before.Controller != c.ID() {
		t.Fatalf("the controller %q is not the supervised interpreter's client %q", before.Controller, c.ID())
	}
	for _, tc := range []struct{ name, src, reason string }{
		{"recursion", "func down(n int) int { return down(n+1) + 1 }\ndown(0)", "stack overflow"},
		{"huge allocation", "b := make([]byte, 1<<40)\nb[0] = 1", "out of memory"},
		{"memory past the limit", "var xs [][]byte\nfor { xs = append(xs, make([]byte, 32<<20)) }", "more than the 0.5 GiB limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := eval(tc.src)
			var ce *Error
			if !errors.As(err, &ce) || ce.Kind != KindCrash {
				t.Fatalf("%s: %v, want a crash error", tc.name, err)
			}
			for _, want := range []string{"ended the interpreter process", tc.reason, "session " + sock, "variables are lost"} {
				if !strings.Contains(ce.Message, want) {
					t.Errorf("crash error %q lacks %q", ce.Message, want)
				}
			}
			r := must("twice(4)")
			if got := plain(r.Value); got != "8" {
				t.Errorf("twice(4) after the crash = %q, want 8 (the function replayed)", got)
			}
			if _, err := eval("x"); err == nil || !strings.Contains(err.Error(), "undefined: x") {
				t.Errorf("x after the crash: %v, want undefined", err)
			}
			st := must(":step 1")
			if !strings.Contains(plain(st.Value), "loss") {
				t.Errorf(":step after the crash = %q", plain(st.Value))
			}
		})
	}
	after, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.Controller != before.Controller || after.Step != 4 {
		t.Errorf("after the crashes: controller %q at step %d, want %q at step 4", after.Controller, after.Step, before.Controller)
	}
	// Output streams as the cell runs; an interrupt ends a cell and the child goes on.
	ictx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := it.Eval(ictx, `import "time"
fmt.Println("started")
for { time.Sleep(time.Millisecond) }`)
		done <- err
	}()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(stdout.String(), "started") {
		if time.Now().After(deadline) {
			t.Fatal("the running cell's output did not arrive")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		var ce *Error
		if !errors.As(err, &ce) || ce.Kind != KindInterrupted {
			t.Fatalf("interrupted cell: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the interrupt did not end the cell")
	}
	if got := plain(must("twice(5)").Value); got != "10" {
		t.Errorf("after the interrupt twice(5) = %q", got)
	}
	if start, cands := it.Complete("twi", 3); start != 0 || !contains(cands, "twice") {
		t.Errorf("Complete(twi) = %d %v", start, cands)
	}
	_ = session.DefaultName
}

func contains(xs []string, x string) bool {
	for _, s := range xs {
		if s == x {
			return true
		}
	}
	return false
}
