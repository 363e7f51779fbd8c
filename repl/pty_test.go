package repl

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
)

// ptyREPL is the REPL running as a child process on a pseudo-terminal.
type ptyREPL struct {
	t    *testing.T
	f    *os.File
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	mark int // expect searches output after this offset
	done chan error
}

func startPTY(t *testing.T, sock, history string) *ptyREPL {
	t.Helper()
	return startPTYEnv(t, sock, history)
}

// startPTYEnv is startPTY with extra environment variables for the REPL process.
func startPTYEnv(t *testing.T, sock, history string, env ...string) *ptyREPL {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "HALO_REPL_HELPER=1", "HALO_REPL_SESSION="+sock, "HALO_HISTORY="+history, "TERM=xterm"), env...)
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 120})
	if err != nil {
		t.Fatal(err)
	}
	p := &ptyREPL{t: t, f: f, cmd: cmd, done: make(chan error, 1)}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := f.Read(buf)
			p.mu.Lock()
			p.out.Write(buf[:n])
			p.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
		f.Close()
	})
	return p
}

func (p *ptyREPL) send(s string) {
	p.t.Helper()
	if _, err := p.f.WriteString(s); err != nil {
		p.t.Fatalf("writing %q: %v", s, err)
	}
}

// expect waits until want appears in the output after the mark and moves the mark past it.
func (p *ptyREPL) expect(want string) {
	p.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		p.mu.Lock()
		all := p.out.String()
		p.mu.Unlock()
		if i := strings.Index(all[p.mark:], want); i >= 0 {
			p.mark += i + len(want)
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("no %q in the output after offset %d:\n%s", want, p.mark, all)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestTerminalSession(t *testing.T) {
	sock := startSession(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
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
	p.expect("attached to session repltest (idle, step 0)")
	p.expect(Prompt)

	// A command.
	p.send(":step 2\r")
	p.expect("step 2  loss ")
	p.expect(Prompt)

	// Go, with state across lines, and a multi-line cell.
	p.send("st := halo.Status()\r")
	p.expect(Prompt)
	p.send("if st.Step == 2 {\r")
	p.expect(ContinuePrompt)
	p.send("fmt.Println(\"two\", st.Step*100)\r")
	p.expect(ContinuePrompt)
	p.send("}\r")
	p.expect("two 200")
	p.expect(Prompt)

	// Tab completes a command name and an API name.
	p.send(":sta\t\r")
	p.expect("session repltest")
	p.expect("step 2/1000")
	p.expect(Prompt)
	p.send("halo.Metr\t()[1].Step * 7\r")
	p.expect("14")
	p.expect(Prompt)

	// Ctrl-C at the prompt clears the line.
	p.send("this is not Go")
	p.send("\x03")
	p.expect(Prompt)
	p.send("1 + 1\r")
	p.expect("2")
	p.expect(Prompt)

	// Ctrl-C during an evaluation interrupts it, not the session; the REPL goes on.
	p.send("for {\r}\r")
	time.Sleep(500 * time.Millisecond)
	p.send("\x03")
	p.expect("interrupted (the session is not affected)")
	p.expect(Prompt)

	// A panic is reported and the REPL goes on.
	p.send("var m map[string]int\r")
	p.expect(Prompt)
	p.send("m[\"a\"] = 1\r")
	p.expect("error: panic:")
	p.expect(Prompt)
	p.send("st.Step + 1\r")
	p.expect("3")
	p.expect(Prompt)

	// Ctrl-D detaches; the session keeps serving with its state.
	p.send("\x04")
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("the REPL exited with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the REPL did not exit on Ctrl-D")
	}
	st, err := c.Status(ctx)
	if err != nil || st.Step != 2 {
		t.Fatalf("session after the REPL left: step %d, %v", st.GetStep(), err)
	}
	h, err := LoadHistory(history)
	if err != nil {
		t.Fatal(err)
	}
	hist := strings.Join(h.Entries(), "\n")
	for _, want := range []string{":step 2", "st := halo.Status()", ":status"} {
		if !strings.Contains(hist, want) {
			t.Errorf("history lacks %q:\n%s", want, hist)
		}
	}
	if strings.Contains(hist, "this is not Go") {
		t.Errorf("history holds the line cleared with Ctrl-C:\n%s", hist)
	}

	// A new REPL recalls the previous run's lines with the up arrow, and :quit detaches too.
	p2 := startPTY(t, sock, history)
	p2.expect(Prompt)
	p2.send("\x1b[A")
	p2.expect("st.Step + 1")
	p2.send("\x1b[A\x1b[A\x1b[A\x1b[A")
	p2.expect(`m["a"] = 1`)
	p2.send("\x03:quit\r")
	select {
	case err := <-p2.done:
		if err != nil {
			t.Fatalf("the second REPL exited with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the REPL did not exit on :quit")
	}
}
