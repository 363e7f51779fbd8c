package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// Info describes a live session found by List.
type Info struct {
	Name   string
	Socket string
	Status *StatusResponse
}

// List returns the live sessions in RuntimeDir, sorted by name, and removes the sockets (and
// pid files) of sessions that no longer answer.
func List(ctx context.Context) ([]Info, error) {
	d, err := RuntimeDir()
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(d)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	var out []Info
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".sock")
		if !ok || ValidateName(name) != nil {
			continue
		}
		sock := filepath.Join(d, e.Name())
		st, err := statusOf(ctx, sock)
		if err != nil {
			if IsUnavailable(err) {
				os.Remove(sock)
				if p, err := PathsFor(name); err == nil {
					os.Remove(p.Pid)
				}
			}
			continue
		}
		out = append(out, Info{Name: name, Socket: sock, Status: st})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func statusOf(ctx context.Context, sock string) (*StatusResponse, error) {
	c, err := Dial(sock, Options{ClientName: "session-list"})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return c.Status(ctx)
}

// ErrNotRunning is wrapped by the errors of NotRunning.
var ErrNotRunning = errors.New("session: no such session is running")

// NotRunning is the error for a session name that nothing answers on: it names the running
// sessions and says how to start this one.
func NotRunning(ctx context.Context, name string) error {
	running := runningNames(ctx)
	start := "halo-shell session start --name " + name + " --config CONFIG.yaml"
	if name == DefaultName {
		start = "halo-shell session start --config CONFIG.yaml"
	}
	return &notRunningError{msg: fmt.Sprintf("session: no session named %q is running (%s); start it with `%s`, or attach to a running one", name, running, start)}
}

// runningNames says which sessions run, for errors.
func runningNames(ctx context.Context) string {
	infos, err := List(ctx)
	if err != nil || len(infos) == 0 {
		return "no session is running"
	}
	names := make([]string, len(infos))
	for i, in := range infos {
		names[i] = in.Name
	}
	return "running: " + strings.Join(names, ", ")
}

type notRunningError struct{ msg string }

func (e *notRunningError) Error() string        { return e.msg }
func (e *notRunningError) Is(target error) bool { return target == ErrNotRunning }

// Stop sends SIGTERM to the named session (which stops at the next step boundary, saving when
// configured) and waits up to wait for it to exit.
func Stop(ctx context.Context, name string, wait time.Duration) (*StatusResponse, error) {
	p, err := PathsFor(name)
	if err != nil {
		return nil, err
	}
	st, err := statusOf(ctx, p.Socket)
	if IsUnavailable(err) {
		return nil, &notRunningError{msg: fmt.Sprintf("session: no session named %q is running (%s); nothing to stop", name, runningNames(ctx))}
	}
	if err != nil {
		return nil, fmt.Errorf("session: %q does not answer on %s: %w", name, p.Socket, err)
	}
	pid := int(st.Pid)
	if pid <= 0 {
		return nil, fmt.Errorf("session: %q reported no process id", name)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return nil, fmt.Errorf("session: signalling %q (pid %d): %w", name, pid, err)
	}
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return st, nil
		}
		if _, err := os.Stat(p.Socket); errors.Is(err, os.ErrNotExist) {
			// The socket is gone: the session is exiting.
			return st, nil
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return st, fmt.Errorf("session: %q (pid %d) did not stop within %s (it stops at a step boundary)", name, pid, wait)
}
