package server

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/session"
	halov1 "github.com/halo-shell/halo-shell/session/proto/halo/v1"
)

// startHelper runs a helper process of kind against socket and waits for it to print want.
func startHelper(t *testing.T, kind, socket, want string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "HALO_SESSION_HELPER="+kind, "HALO_SOCKET="+socket)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	waitFor(t, "the helper to print "+want, func() bool { return strings.Contains(out.String(), want) })
	return cmd, out
}

// TestKilledControllerLosesControl holds control from a second process that makes no call but
// its lease renewals: while it lives, others are refused past the lease; once it is
// SIGKILLed, control passes on within the lease and observers are told why.
func TestKilledControllerLosesControl(t *testing.T) {
	const lease = 3 * time.Second
	t.Setenv("HALO_CONTROL_LEASE", lease.String())
	s, c := loaded(t)
	ctx := ctxT(t)
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}
	watcher := dial(t, s.Socket(), "watcher")
	events, err := watcher.Subscribe(ctx, 64)
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	cmd, out := startHelper(t, "control-and-hold", s.Socket(), "controlling")
	holder := strings.TrimSpace(strings.SplitN(out.String(), "controlling", 2)[1])

	// Renewals keep a live holder in control for longer than the lease.
	time.Sleep(2 * lease)
	_, err = c.Step(ctx, 1)
	if !session.IsNotController(err) {
		t.Fatalf("Step while the holder lives: %v, want a refusal", err)
	}
	mustContain(t, err, holder, "(holder)", ":takeover", "--take-over", "%takeover", "halo.TakeOver()", "`t` in the TUI")

	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	var took time.Duration
	for {
		if _, err := c.Step(ctx, 1); err == nil {
			took = time.Since(killed)
			break
		} else if !session.IsNotController(err) {
			t.Fatal(err)
		}
		if time.Since(killed) > lease+5*time.Second {
			t.Fatalf("the killed holder still controls the session %s after SIGKILL (lease %s)", time.Since(killed), lease)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("control passed on %s after SIGKILL (lease %s)", took.Round(10*time.Millisecond), lease)
	if st := status(t, c); st.Controller != c.ID() {
		t.Fatalf("controller %q, want %q", st.Controller, c.ID())
	} else {
		for _, cl := range st.Clients {
			if cl.Id == holder {
				t.Fatalf("the killed holder is still listed: %v", st.Clients)
			}
		}
	}
	for {
		ev, err := events.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if st := ev.GetState(); st != nil && strings.Contains(st.Reason, "control released: client "+holder) {
			if !strings.Contains(st.Reason, "is gone") {
				t.Fatalf("release reason %q", st.Reason)
			}
			break
		}
	}
}

// TestControllerWithAStreamKeepsControl checks that an open event stream keeps its client in
// control though it makes no call, and that a client's Close ends its lease.
func TestControllerWithAStreamKeepsControl(t *testing.T) {
	const lease = 3 * time.Second
	t.Setenv("HALO_CONTROL_LEASE", lease.String())
	s, a := loaded(t)
	ctx := ctxT(t)
	st, err := a.Subscribe(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	b := dial(t, s.Socket(), "second")
	// Stop a's renewals: only its stream says it is alive now.
	a.Close()
	time.Sleep(2 * lease)
	if err := b.Claim(ctx); !session.IsNotController(err) {
		t.Fatalf("Claim while the controller's stream is open: %v, want a refusal", err)
	}
	st.Close()
	waitFor(t, "control to pass on after the stream closed", func() bool { return b.Claim(ctx) == nil })
}

// TestOneShotClientsLeaveTheTable checks that clients that only called Status are listed while
// they call and leave the table once the lease has passed.
func TestOneShotClientsLeaveTheTable(t *testing.T) {
	const lease, n = 10 * time.Second, 300
	t.Setenv("HALO_CONTROL_LEASE", lease.String())
	s, c := loaded(t)
	ctx := ctxT(t)
	began := time.Now()
	for range n {
		o, err := session.Dial(s.Socket(), session.Options{ClientName: "one-shot"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := o.Status(ctx); err != nil {
			t.Fatal(err)
		}
		o.Close()
	}
	if got := len(status(t, c).Clients); got < n && time.Since(began) < lease {
		t.Fatalf("%d clients listed right after %d status calls, want them all", got, n)
	}
	waitFor(t, "one-shot clients to leave", func() bool {
		st := status(t, c)
		for _, cl := range st.Clients {
			if cl.Name == "one-shot" {
				return false
			}
		}
		return st.Controller == c.ID()
	})
}

// TestObserversOfAStoppingSessionEndCleanly: when a session process is stopped (SIGTERM)
// while it runs, each observer gets a stopping state event with its reason and then the end of
// its stream, not an error.
func TestObserversOfAStoppingSessionEndCleanly(t *testing.T) {
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "HALO_SESSION_HELPER=serve", "HALO_SESSION_DIR="+dir, "HALO_SESSION_NAME=obs")
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sock := filepath.Join(dir, "obs.sock")
	var c *session.Client
	waitFor(t, "the session to load", func() bool {
		if c == nil {
			c, _ = session.Dial(sock, session.Options{})
		}
		if c == nil {
			return false
		}
		st, err := c.Status(t.Context())
		return err == nil && st.State == session.StateIdle
	})
	defer c.Close()
	ctx := ctxT(t)
	if _, err := c.Run(ctx, 0); err != nil {
		t.Fatal(err)
	}
	var streams []*session.EventStream
	for range 3 {
		st, err := dial(t, sock, "observer").Subscribe(ctx, 8)
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for i, st := range streams {
		var last *halov1.StateEvent
		for {
			ev, err := st.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("observer %d: the stream ended with %v, want its end (EOF)", i, err)
			}
			if se := ev.GetState(); se != nil {
				last = se
			}
		}
		if last == nil || last.State != session.StateStopping || !strings.Contains(last.Reason, "stopping") {
			t.Errorf("observer %d: last state event %v, want stopping with a reason", i, last)
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the session exited with %v:\n%s", err, out.String())
	}
}
