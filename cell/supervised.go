package cell

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/halo-shell/halo-shell/session"
)

// KindCrash is a cell that ended its interpreter process (a stack overflow, memory past the
// limit); the process was replaced by a new one.
const KindCrash ErrorKind = "crash"

// SupervisedOptions configure a Supervised interpreter.
type SupervisedOptions struct {
	// Session, ClientName, Stdout, Stderr, OnDisplay and Background are those of Options
	// (Client and Dial are not used: the child dials).
	Options
	// ClientID is the session client id of the child (and of Session's client); empty means a
	// random one. It stays the same across restarts, so control survives them.
	ClientID string
	// Start says how the child starts a session that does not run (see session.DialOrStart).
	Start session.StartOptions
	// Command runs the worker (default: this executable with the argument cell-worker).
	Command []string
}

// Supervised is an Interpreter in a child process (see worker.go): a cell that ends that
// process is reported as an error of kind KindCrash, and the next cell runs in a new child,
// attached to the same session as the same client, whose earlier imports and declarations of
// functions and types are replayed; variables are lost, and the error says so. Its methods
// may be called from any goroutine; evaluations run one at a time.
type Supervised struct {
	o SupervisedOptions

	evalMu sync.Mutex // held by Eval

	mu       sync.Mutex
	w        *child
	nextID   int64
	target   string // the session the child is attached to ("" until it attaches)
	attached bool
	client   *session.Client // this process's client of target, with the child's id
	defs     []string        // imports and declarations of the cells that succeeded
	closed   bool
}

// child is one worker process.
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	encMu  sync.Mutex
	enc    *json.Encoder
	stderr *tailBuffer
	// waiting receives the messages of the request with that id.
	wmu     sync.Mutex
	waiting map[int64]chan wireMsg
	fatal   string
	dead    chan struct{} // closed when the protocol ends (the process exited)
}

// NewSupervised returns a supervised interpreter; the child starts on first use.
func NewSupervised(o SupervisedOptions) (*Supervised, error) {
	if o.Session == "" {
		o.Session = session.DefaultName
	}
	if o.ClientName == "" {
		o.ClientName = "cell"
	}
	if o.ClientID == "" {
		o.ClientID = session.NewClientID()
	}
	if o.Background == nil {
		o.Background = io.Discard
	}
	if len(o.Command) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("cell: cannot find this program to run the interpreter: %w", err)
		}
		o.Command = []string{exe, "cell-worker"}
	}
	return &Supervised{o: o, target: o.Session}, nil
}

// tailBuffer keeps the first and the last bytes written to it (a fatal error's reason comes
// first, before the stacks of every goroutine).
type tailBuffer struct {
	mu         sync.Mutex
	head, tail []byte
}

const tailKeep = 8 << 10

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n := min(len(p), tailKeep-len(t.head)); n > 0 {
		t.head = append(t.head, p[:n]...)
	}
	t.tail = append(t.tail, p...)
	if len(t.tail) > tailKeep {
		t.tail = append([]byte(nil), t.tail[len(t.tail)-tailKeep:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.head) + "\n" + string(t.tail)
}

// start runs a new child and waits for it to be ready.
func (s *Supervised) start() (*child, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("cell: %w", err)
	}
	cmd := exec.Command(s.o.Command[0], s.o.Command[1:]...)
	cmd.ExtraFiles = []*os.File{pw}
	// Its own process group, so that the terminal's Ctrl-C (an interrupt the REPL turns into
	// a cancelled cell) does not kill it, and killed with this process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	c := &child{cmd: cmd, stderr: &tailBuffer{}, waiting: map[int64]chan wireMsg{}, dead: make(chan struct{})}
	cmd.Stdout = s.o.Background
	cmd.Stderr = c.stderr
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		pr.Close()
		pw.Close()
		return nil, fmt.Errorf("cell: %w", err)
	}
	c.enc = json.NewEncoder(c.stdin)
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return nil, fmt.Errorf("cell: starting the interpreter process %s: %w", s.o.Command[0], err)
	}
	pw.Close()
	ready := make(chan struct{})
	go c.read(pr, ready, s.o.Background)
	init := wireMsg{Op: "init", Session: s.target, ClientID: s.o.ClientID, ClientName: s.o.ClientName,
		Config: s.o.Start.ConfigPath, Method: s.o.Start.Method, Overrides: s.o.Start.Overrides}
	if err := c.send(init); err != nil {
		return nil, c.crash("starting the interpreter")
	}
	select {
	case <-ready:
		return c, nil
	case <-c.dead:
		return nil, c.crash("starting the interpreter")
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		return nil, errors.New("cell: the interpreter process did not start within 30s")
	}
}

func (c *child) send(m wireMsg) error {
	c.encMu.Lock()
	defer c.encMu.Unlock()
	return c.enc.Encode(m)
}

// read dispatches the child's messages until the protocol ends, then reaps the process.
func (c *child) read(r io.ReadCloser, ready chan struct{}, background io.Writer) {
	exited := make(chan struct{})
	go func() {
		_ = c.cmd.Wait()
		close(exited)
		// Ends the scan below, after what the child wrote last has been read, even if
		// another process holds the pipe open.
		time.AfterFunc(500*time.Millisecond, func() { r.Close() })
	}()
	defer func() {
		r.Close()
		<-exited
		close(c.dead)
	}()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 512<<20)
	for sc.Scan() {
		var m wireMsg
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			continue
		}
		switch m.Op {
		case "ready":
			close(ready)
		case "fatal":
			c.wmu.Lock()
			c.fatal = m.Msg
			c.wmu.Unlock()
		default:
			if m.Op == "out" && m.Stream == "background" {
				io.WriteString(background, m.Data)
				continue
			}
			c.wmu.Lock()
			ch := c.waiting[m.ID]
			c.wmu.Unlock()
			if ch != nil {
				ch <- m
			}
		}
	}
}

// crash is the error for a child that died: the watchdog's reason, else the runtime's fatal
// error from its standard error, else its exit status.
func (c *child) crash(doing string) *Error {
	<-c.dead
	c.wmu.Lock()
	reason := c.fatal
	c.wmu.Unlock()
	if reason == "" {
		reason = runtimeReason(c.stderr.String())
	}
	if reason == "" && c.cmd.ProcessState != nil {
		reason = c.cmd.ProcessState.String()
	}
	return &Error{Kind: KindCrash, Message: fmt.Sprintf("cell: %s ended the interpreter process: %s", doing, reason)}
}

// runtimeReason picks the Go runtime's fatal error out of a dead process's standard error.
func runtimeReason(stderr string) string {
	var first string
	for _, l := range strings.Split(stderr, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "runtime: goroutine stack exceeds"):
			return "stack overflow (" + strings.TrimPrefix(l, "runtime: ") + "; unbounded recursion?)"
		case strings.HasPrefix(l, "fatal error: "):
			if first == "" {
				first = strings.TrimPrefix(l, "fatal error: ")
			}
		}
	}
	return first
}

// request sends m with a new id and returns the channel of its replies.
func (s *Supervised) request(c *child, m wireMsg) (int64, chan wireMsg, error) {
	s.mu.Lock()
	s.nextID++
	m.ID = s.nextID
	s.mu.Unlock()
	ch := make(chan wireMsg, 64)
	c.wmu.Lock()
	c.waiting[m.ID] = ch
	c.wmu.Unlock()
	if err := c.send(m); err != nil {
		return m.ID, ch, err
	}
	return m.ID, ch, nil
}

func (c *child) done(id int64) {
	c.wmu.Lock()
	delete(c.waiting, id)
	c.wmu.Unlock()
}

// running returns the live child, starting one (and replaying definitions) when there is
// none; restarted says a child died since the last call.
func (s *Supervised) running() (*child, error) {
	s.mu.Lock()
	c := s.w
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, errors.New("cell: the interpreter is closed")
	}
	if c != nil {
		select {
		case <-c.dead:
		default:
			return c, nil
		}
	}
	c, err := s.start()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.w = c
	defs := append([]string(nil), s.defs...)
	s.mu.Unlock()
	var kept []string
	for _, d := range defs {
		// A definition that no longer compiles (one replaced by a later cell) is dropped.
		if _, err := s.evalIn(context.Background(), c, d, nil); err == nil {
			kept = append(kept, d)
		}
	}
	s.mu.Lock()
	s.defs = kept
	s.mu.Unlock()
	return c, nil
}

// Eval runs a cell in the child (see Interpreter.Eval). When the cell ends the child, the
// error is of kind KindCrash and says what was lost.
func (s *Supervised) Eval(ctx context.Context, src string) (Result, error) {
	s.evalMu.Lock()
	defer s.evalMu.Unlock()
	c, err := s.running()
	if err != nil {
		return Result{}, err
	}
	res, err := s.evalIn(ctx, c, src, &s.o.Options)
	var ce *Error
	if errors.As(err, &ce) && ce.Kind == KindCrash {
		s.mu.Lock()
		target := s.target
		s.mu.Unlock()
		ce.Message += fmt.Sprintf("; a new interpreter runs the next cell, attached to session %s as the same client, with the imports and the function and type declarations of earlier cells; their variables are lost", target)
		return res, ce
	}
	if err == nil {
		if d := Definitions(src); d != "" {
			s.mu.Lock()
			s.defs = append(s.defs, d)
			s.mu.Unlock()
		}
	}
	return res, err
}

// evalIn runs src in c, streaming its output to o (nil: discard).
func (s *Supervised) evalIn(ctx context.Context, c *child, src string, o *Options) (Result, error) {
	id, ch, err := s.request(c, wireMsg{Op: "eval", Src: src})
	defer c.done(id)
	if err != nil {
		return Result{}, c.crash("the cell")
	}
	var partial Result
	interrupted := false
	for {
		select {
		case <-ctx.Done():
			if !interrupted {
				interrupted = true
				_ = c.send(wireMsg{Op: "interrupt", ID: id})
			}
			ctx = context.Background() // keep waiting for the child's result
		case <-c.dead:
			// Drain what arrived before the end.
			for {
				select {
				case m := <-ch:
					s.apply(m, &partial, o)
					continue
				default:
				}
				break
			}
			return partial, c.crash("the cell")
		case m := <-ch:
			if m.Op == "result" {
				s.mu.Lock()
				if m.Attached {
					if m.Target != s.target && s.client != nil {
						s.client.Close()
						s.client = nil
					}
					s.target, s.attached = m.Target, true
				}
				s.mu.Unlock()
				res := Result{}
				if m.Result != nil {
					res = *m.Result
				}
				if m.Error != nil {
					return res, m.Error
				}
				return res, nil
			}
			s.apply(m, &partial, o)
		}
	}
}

// apply delivers one output message of a running cell.
func (s *Supervised) apply(m wireMsg, partial *Result, o *Options) {
	if o == nil {
		return
	}
	switch m.Op {
	case "out":
		switch m.Stream {
		case "stdout":
			partial.Stdout += m.Data
			if o.Stdout != nil {
				io.WriteString(o.Stdout, m.Data)
			}
		case "stderr":
			partial.Stderr += m.Data
			if o.Stderr != nil {
				io.WriteString(o.Stderr, m.Data)
			}
		}
	case "display":
		partial.Displays = append(partial.Displays, m.Bundle)
		if o.OnDisplay != nil {
			o.OnDisplay(m.Bundle)
		}
	}
}

// Complete completes at cursor (see Interpreter.Complete); nothing when the child is down.
func (s *Supervised) Complete(src string, cursor int) (int, []string) {
	c, err := s.running()
	if err != nil {
		return cursor, nil
	}
	id, ch, err := s.request(c, wireMsg{Op: "complete", Src: src, Pos: cursor})
	defer c.done(id)
	if err != nil {
		return cursor, nil
	}
	select {
	case m := <-ch:
		return m.Start, m.Cands
	case <-c.dead:
	case <-time.After(10 * time.Second):
	}
	return cursor, nil
}

// Inspect documents the name at cursor (see Interpreter.Inspect).
func (s *Supervised) Inspect(src string, cursor int) (string, bool) {
	c, err := s.running()
	if err != nil {
		return "", false
	}
	id, ch, err := s.request(c, wireMsg{Op: "inspect", Src: src, Pos: cursor})
	defer c.done(id)
	if err != nil {
		return "", false
	}
	select {
	case m := <-ch:
		return m.Doc, m.OK
	case <-c.dead:
	case <-time.After(10 * time.Second):
	}
	return "", false
}

// Attached reports whether the child has attached to a session, and its name or address.
func (s *Supervised) Attached() (bool, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.attached, s.target
}

// Session returns a client of the session the child is attached to, in this process and
// with the child's client id (so that it may release the child's control); it attaches the
// child first when it has not attached yet.
func (s *Supervised) Session() (*session.Client, error) {
	s.mu.Lock()
	attached := s.attached
	s.mu.Unlock()
	if !attached {
		if _, err := s.Eval(context.Background(), "_ = halo.Session()"); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client == nil {
		c, err := session.Dial(s.target, session.Options{ClientID: s.o.ClientID, ClientName: s.o.ClientName})
		if err != nil {
			return nil, err
		}
		s.client = c
	}
	return s.client, nil
}

// Close ends the child and closes the client; the session keeps running.
func (s *Supervised) Close() error {
	s.mu.Lock()
	c, cl := s.w, s.client
	s.closed, s.w, s.client = true, nil, nil
	s.mu.Unlock()
	if cl != nil {
		cl.Close()
	}
	if c != nil {
		c.stdin.Close()
		select {
		case <-c.dead:
		case <-time.After(5 * time.Second):
			c.cmd.Process.Kill()
			<-c.dead
		}
	}
	return nil
}
