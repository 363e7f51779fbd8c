package repl

import (
	"context"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/session"
)

// TestKilledREPLLosesControl steps the session from a REPL on a pty, so that it controls the
// session, SIGKILLs it, and checks control passes on within the lease; then a second REPL
// takes control from a live controller with :takeover, and a third with --take-over.
func TestKilledREPLLosesControl(t *testing.T) {
	const lease = 3 * time.Second
	t.Setenv("HALO_CONTROL_LEASE", lease.String())
	sock := startSession(t)
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	c := dialT(t, sock)
	if _, err := c.Load(ctx, "testdata/tiny.yaml", "sft"); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}
	history := filepath.Join(t.TempDir(), "history")
	p := startPTY(t, sock, history)
	p.expect(Prompt)
	p.send(":step 1\r")
	p.expect("step 1  loss ")
	p.expect(Prompt)
	time.Sleep(2 * lease) // idle past the lease: the REPL's stream and renewals keep control
	if _, err := c.Step(ctx, 1); !session.IsNotController(err) {
		t.Fatalf("Step while the REPL controls: %v, want a refusal", err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	killed := time.Now()
	for {
		_, err := c.Step(ctx, 1)
		if err == nil {
			break
		}
		if !session.IsNotController(err) {
			t.Fatal(err)
		}
		if time.Since(killed) > lease+5*time.Second {
			t.Fatalf("the killed REPL still controls the session %s after SIGKILL: %v", time.Since(killed).Round(time.Second), err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// c controls now; a REPL is refused with the ways to take over, and :takeover works.
	p2 := startPTY(t, sock, history)
	p2.expect(Prompt)
	p2.send(":step 1\r")
	p2.expect("is controlled by client " + c.ID() + " (test)")
	p2.expect(":takeover")
	p2.expect(Prompt)
	p2.send(":takeover\r")
	p2.expect("session repltest")
	p2.expect(Prompt)
	p2.send(":step 1\r")
	p2.expect("step 3  loss ")
	p2.expect(Prompt)
	if _, err := c.Step(ctx, 1); !session.IsNotController(err) {
		t.Fatalf("Step after the REPL took over: %v, want a refusal", err)
	}

	// --take-over at start takes control from the second REPL.
	p3 := startPTYEnv(t, sock, history, "HALO_REPL_TAKEOVER=1")
	p3.expect("took control of the session from client")
	p3.expect(Prompt)
	p3.send(":step 1\r")
	p3.expect("step 4  loss ")
	p3.expect(Prompt)
	p2.send(":step 1\r")
	p2.expect("is controlled by client")
	p2.expect(Prompt)
}

// TestCrashingCellsLeaveTheREPLRunning runs unbounded recursion and an impossible allocation
// in a REPL on a pty: each is reported as an error naming its cause and the REPL goes on,
// with the functions of earlier lines.
func TestCrashingCellsLeaveTheREPLRunning(t *testing.T) {
	t.Setenv("HALO_CELL_MAX_STACK", "64MiB")
	sock := startSession(t)
	p := startPTY(t, sock, filepath.Join(t.TempDir(), "history"))
	p.expect(Prompt)
	p.send("func twice(n int) int { return 2 * n }\r")
	p.expect(Prompt)
	p.send("func down(n int) int { return down(n+1) + 1 }; down(0)\r")
	p.expect("stack overflow")
	p.expect(Prompt)
	p.send("twice(21)\r")
	p.expect("42")
	p.expect(Prompt)
	p.send("b := make([]byte, 1<<40); b[0] = 1\r")
	p.expect("out of memory")
	p.expect(Prompt)
	p.send("twice(4) + 1\r")
	p.expect("9")
	p.expect(Prompt)
}
