package nbrun

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/halo-shell/halo-shell/kernel/internal/wire"
)

// ConnectionFileArg is the word of a kernel command that is replaced by the path of the
// connection file, as in a kernelspec's argv.
const ConnectionFileArg = "{connection_file}"

// kernelProc is a kernel started as a child process and the client's sockets to it.
type kernelProc struct {
	cmd    *exec.Cmd
	dir    string // holds the connection file
	exited chan struct{}
	errMu  sync.Mutex
	err    error // the process's exit, once exited is closed
	stderr *tail

	signer  *wire.Signer
	session string

	ctx    context.Context // ends when the client's sockets are closed
	cancel context.CancelFunc

	shell, control, iopub    zmq4.Socket
	shellR, controlR, iopubR chan *wire.Message

	languageInfo json.RawMessage
}

// kernelStartAttempts is how many sets of ports are tried: ports are picked free and handed
// to the kernel, which another process may take first (as with every Jupyter client).
const kernelStartAttempts = 3

// startKernel starts the kernel command o.Kernel and connects to it: it waits until the
// kernel answers kernel_info on shell and its iopub delivers, so that no output of the first
// cell is missed.
func startKernel(ctx context.Context, o *Options) (*kernelProc, error) {
	var last error
	for attempt := 0; attempt < kernelStartAttempts; attempt++ {
		k, err := tryStartKernel(ctx, o)
		if err == nil {
			return k, nil
		}
		last = err
		var pe *portError
		if !errors.As(err, &pe) {
			return nil, err
		}
	}
	return nil, last
}

// portError is a kernel that exited at start because a port was taken.
type portError struct{ err error }

func (e *portError) Error() string { return e.err.Error() }

func tryStartKernel(ctx context.Context, o *Options) (*kernelProc, error) {
	dir, err := os.MkdirTemp("", "nbrun")
	if err != nil {
		return nil, fmt.Errorf("nbrun: connection file: %w", err)
	}
	ports, err := freePorts(5)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	var key [16]byte
	_, _ = rand.Read(key[:])
	ci := wire.ConnectionInfo{Transport: "tcp", IP: "127.0.0.1", ShellPort: ports[0], ControlPort: ports[1],
		StdinPort: ports[2], IOPubPort: ports[3], HBPort: ports[4], Key: hex.EncodeToString(key[:]),
		SignatureScheme: "hmac-sha256", KernelName: o.KernelName}
	connFile := filepath.Join(dir, "kernel.json")
	b, _ := json.MarshalIndent(ci, "", "  ")
	if err := os.WriteFile(connFile, b, 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("nbrun: connection file: %w", err)
	}
	argv := make([]string, len(o.Kernel))
	for i, a := range o.Kernel {
		argv[i] = strings.ReplaceAll(a, ConnectionFileArg, connFile)
	}
	k := &kernelProc{dir: dir, exited: make(chan struct{}), stderr: &tail{max: 8 << 10},
		signer: wire.NewSigner(ci.Key), session: wire.NewID(),
		shellR: make(chan *wire.Message, 16), controlR: make(chan *wire.Message, 16), iopubR: make(chan *wire.Message, 1024)}
	k.cmd = exec.Command(argv[0], argv[1:]...)
	k.cmd.Env, k.cmd.Dir = o.Env, o.Dir
	k.cmd.Stdout = io.Discard
	k.cmd.Stderr = k.stderr
	if o.KernelLog != nil {
		k.cmd.Stderr = io.MultiWriter(k.stderr, o.KernelLog)
	}
	if err := k.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("nbrun: starting the kernel %s: %w", argv[0], err)
	}
	go func() {
		err := k.cmd.Wait()
		k.errMu.Lock()
		k.err = err
		k.errMu.Unlock()
		close(k.exited)
	}()
	if err := k.connect(ctx, ci, o.StartTimeout); err != nil {
		k.kill()
		if strings.Contains(k.stderr.String(), "address already in use") {
			return nil, &portError{err}
		}
		return nil, err
	}
	return k, nil
}

// freePorts asks the system for n free TCP ports on the loopback interface.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("nbrun: finding a free port for the kernel: %w", err)
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

// connect dials the kernel's shell, control and iopub sockets and waits until it answers.
func (k *kernelProc) connect(ctx context.Context, ci wire.ConnectionInfo, limit time.Duration) error {
	k.ctx, k.cancel = context.WithCancel(context.Background())
	// Until the kernel answers, a watcher ends the sockets' context (and with it dials that
	// retry until the kernel listens) when the kernel exits, the start time runs out or ctx
	// ends, and says why.
	started := make(chan struct{})
	why := make(chan error, 1)
	go func() {
		timer := time.NewTimer(limit)
		defer timer.Stop()
		select {
		case <-k.exited:
			why <- k.exitError("while starting")
		case <-timer.C:
			why <- fmt.Errorf("nbrun: the kernel did not answer within %v of starting%s", limit, k.stderrTail())
		case <-ctx.Done():
			why <- fmt.Errorf("nbrun: starting the kernel: %w", ctx.Err())
		case <-started:
			return
		}
		k.cancel()
	}()
	fail := func(err error) error {
		k.cancel()
		select {
		case w := <-why:
			return w
		case <-time.After(time.Second):
			return fmt.Errorf("nbrun: connecting to the kernel: %w%s", err, k.stderrTail())
		}
	}
	opts := []zmq4.Option{zmq4.WithDialerMaxRetries(-1), zmq4.WithDialerRetry(50 * time.Millisecond)}
	k.shell = zmq4.NewDealer(k.ctx, append(opts, zmq4.WithID(zmq4.SocketIdentity("nbrun-shell-"+k.session)))...)
	k.control = zmq4.NewDealer(k.ctx, append(opts, zmq4.WithID(zmq4.SocketIdentity("nbrun-control-"+k.session)))...)
	k.iopub = zmq4.NewSub(k.ctx, opts...)
	for _, d := range []struct {
		s    zmq4.Socket
		port int
	}{{k.shell, ci.ShellPort}, {k.control, ci.ControlPort}, {k.iopub, ci.IOPubPort}} {
		if err := d.s.Dial(ci.Endpoint(d.port)); err != nil {
			return fail(err)
		}
	}
	if err := k.iopub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		return fail(err)
	}
	go k.pump(k.iopub, k.iopubR)
	go k.pump(k.shell, k.shellR)
	go k.pump(k.control, k.controlR)
	// A subscription takes effect some time after the dial: ask for kernel_info until an
	// iopub message (the status around a request) arrives, then until a reply has come.
	gotIOPub, gotReply := false, false
	for !gotIOPub || !gotReply {
		if _, err := k.send(k.shell, "kernel_info_request", map[string]any{}); err != nil {
			return fail(err)
		}
		retry := time.After(500 * time.Millisecond)
	wait:
		for !gotIOPub || !gotReply {
			select {
			case m := <-k.shellR:
				if m.Header.MsgType == "kernel_info_reply" {
					gotReply = true
					var r struct {
						LanguageInfo json.RawMessage `json:"language_info"`
					}
					if json.Unmarshal(m.Content, &r) == nil {
						k.languageInfo = r.LanguageInfo
					}
				}
			case <-k.iopubR:
				gotIOPub = true
			case <-retry:
				break wait
			case w := <-why:
				return w
			}
		}
	}
	close(started)
	select {
	case w := <-why:
		return w
	default:
	}
	// Replies and statuses of the other kernel_info requests.
	for {
		select {
		case <-k.iopubR:
		case <-k.shellR:
		case <-time.After(200 * time.Millisecond):
			return nil
		}
	}
}

func (k *kernelProc) pump(s zmq4.Socket, ch chan<- *wire.Message) {
	for {
		raw, err := s.Recv()
		if err != nil {
			return
		}
		m, err := wire.Parse(raw.Frames, k.signer)
		if err != nil {
			continue // not a message of this kernel: nothing a cell's output can be made of
		}
		select {
		case ch <- m:
		case <-k.ctx.Done():
			return
		}
	}
}

// send sends a request on s and returns its msg_id.
func (k *kernelProc) send(s zmq4.Socket, msgType string, content any) (string, error) {
	c, err := json.Marshal(content)
	if err != nil {
		return "", err
	}
	m := &wire.Message{Header: wire.NewHeader(msgType, k.session, "nbrun"), Content: c}
	frames, err := m.Frames(k.signer)
	if err != nil {
		return "", err
	}
	if err := s.Send(zmq4.NewMsgFrom(frames...)); err != nil {
		return "", fmt.Errorf("nbrun: sending %s to the kernel: %w", msgType, err)
	}
	return m.Header.MsgID, nil
}

// exitError describes the kernel's exit.
func (k *kernelProc) exitError(when string) error {
	k.errMu.Lock()
	err := k.err
	k.errMu.Unlock()
	how := "exited"
	if err != nil {
		how = "exited (" + err.Error() + ")"
	}
	return fmt.Errorf("nbrun: the kernel %s %s%s", how, when, k.stderrTail())
}

func (k *kernelProc) stderrTail() string {
	s := strings.TrimSpace(k.stderr.String())
	if s == "" {
		return ""
	}
	return "; its stderr ends:\n" + s
}

// shutdown asks the kernel to stop (shutdown_request on control) and waits for it; a kernel
// that does not stop within wait is killed.
func (k *kernelProc) shutdown(wait time.Duration) {
	select {
	case <-k.exited:
	default:
		if _, err := k.send(k.control, "shutdown_request", map[string]any{"restart": false}); err == nil {
			select {
			case <-k.exited:
			case <-time.After(wait):
			}
		}
	}
	k.kill()
}

// kill stops the kernel process, closes the sockets and removes the connection file.
func (k *kernelProc) kill() {
	select {
	case <-k.exited:
	default:
		_ = k.cmd.Process.Kill()
		<-k.exited
	}
	if k.cancel != nil {
		k.cancel()
	}
	for _, s := range []zmq4.Socket{k.shell, k.control, k.iopub} {
		if s != nil {
			_ = s.Close()
		}
	}
	os.RemoveAll(k.dir)
}

// tail keeps the last max bytes written to it.
type tail struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
