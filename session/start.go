package session

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ParseListen turns "tcp://HOST:PORT" (StartOptions.Listen, `session start --listen`) into a
// host:port to bind, defaulting HOST to 127.0.0.1. The server binds what it returns; a client
// checks the flag with it before starting a session.
func ParseListen(listen string) (string, error) {
	u, err := url.Parse(listen)
	if err != nil || u.Scheme != "tcp" || u.Host == "" || u.Path != "" {
		return "", fmt.Errorf("session: --listen %q: want tcp://HOST:PORT (e.g. tcp://127.0.0.1:7070)", listen)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return "", fmt.Errorf("session: --listen %q: %v", listen, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return "", fmt.Errorf("session: --listen %q: port %q is not a number from 0 to 65535", listen, port)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// IsLoopback reports whether a host:port from ParseListen binds only this machine's loopback
// interface (127.0.0.0/8, ::1, localhost).
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// StartOptions say how to start a session process.
type StartOptions struct {
	// Name of the session (default DefaultName).
	Name string
	// ConfigPath, if set, is loaded at start (method Method, default sft).
	ConfigPath string
	Method     string
	// Overrides are --key=value changes to the config.
	Overrides []string
	// Listen is an extra "tcp://HOST:PORT" address to serve (bearer token required).
	Listen string
	// AllowRemote lets Listen bind an address other machines can reach; TLSCert and TLSKey
	// make it serve TLS.
	AllowRemote     bool
	TLSCert, TLSKey string
	// SaveOnStop is a directory where SIGTERM saves a checkpoint before exiting.
	SaveOnStop string
	// Command is the argv prefix that runs the halo-shell binary. Empty means this executable
	// when its name starts with "halo-shell", else "halo-shell" from PATH.
	Command []string
	// Env is added to the session's environment.
	Env []string
	// Wait bounds how long Start waits for the socket to answer (default 60 s).
	Wait time.Duration
}

// StartResult describes a started session.
type StartResult struct {
	Name   string
	Socket string
	Pid    int
	Log    string
}

func (o *StartOptions) args() []string {
	a := []string{"session", "start", "--foreground", "--name", o.Name}
	if o.ConfigPath != "" {
		a = append(a, "--config", o.ConfigPath)
	}
	if o.Method != "" {
		a = append(a, "--method", o.Method)
	}
	for _, ov := range o.Overrides {
		a = append(a, "--set", ov)
	}
	if o.Listen != "" {
		a = append(a, "--listen", o.Listen)
	}
	if o.AllowRemote {
		a = append(a, "--allow-remote")
	}
	if o.TLSCert != "" {
		a = append(a, "--tls-cert", o.TLSCert)
	}
	if o.TLSKey != "" {
		a = append(a, "--tls-key", o.TLSKey)
	}
	if o.SaveOnStop != "" {
		a = append(a, "--save-on-stop", o.SaveOnStop)
	}
	return a
}

func (o *StartOptions) command() ([]string, error) {
	if len(o.Command) > 0 {
		return o.Command, nil
	}
	if exe, err := os.Executable(); err == nil && strings.HasPrefix(filepath.Base(exe), "halo-shell") {
		return []string{exe}, nil
	}
	p, err := exec.LookPath("halo-shell")
	if err != nil {
		return nil, fmt.Errorf("session: cannot start a session: no halo-shell binary in PATH (install it, or start one with `halo-shell session start`)")
	}
	return []string{p}, nil
}

// Start starts a session in a new detached process (its own process group and session, so
// signals to the caller's terminal do not reach it), logging to its log file beside the socket,
// and waits until its socket answers and, when it loads a config, until the config is loaded.
// Starts of one name are serialised by a lock file, so that of two concurrent starts one
// starts the session and the other reports it already running. When the process exits
// before that (a config that does not load, a name taken), the error quotes the end of its log.
func Start(ctx context.Context, o StartOptions) (StartResult, error) {
	if o.Name == "" {
		o.Name = DefaultName
	}
	if o.Wait <= 0 {
		o.Wait = 60 * time.Second
	}
	p, err := PathsFor(o.Name)
	if err != nil {
		return StartResult{}, err
	}
	if o.ConfigPath != "" {
		// The session keeps this process's working directory, but make the config path plain.
		if abs, err := filepath.Abs(o.ConfigPath); err == nil {
			o.ConfigPath = abs
		}
		if fi, err := os.Stat(o.ConfigPath); err != nil {
			return StartResult{}, fmt.Errorf("session: config %s: %w", o.ConfigPath, errors.Unwrap(err))
		} else if fi.IsDir() {
			return StartResult{}, fmt.Errorf("session: config %s is a directory; give the YAML file", o.ConfigPath)
		}
	}
	if _, err := EnsureRuntimeDir(); err != nil {
		return StartResult{}, err
	}
	unlock, err := lockName(ctx, p.Lock)
	if err != nil {
		return StartResult{}, err
	}
	defer unlock()
	if _, err := pingStatus(ctx, p.Socket, 2*time.Second); err == nil {
		return StartResult{}, fmt.Errorf("session: a session named %q is already running (socket %s); attach to it or stop it first", o.Name, p.Socket)
	}
	argv, err := o.command()
	if err != nil {
		return StartResult{}, err
	}
	logf, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return StartResult{}, fmt.Errorf("session: log file: %w", err)
	}
	defer logf.Close()
	var logStart int64
	if fi, err := logf.Stat(); err == nil {
		logStart = fi.Size()
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return StartResult{}, err
	}
	defer devnull.Close()
	cmd := exec.Command(argv[0], append(append([]string{}, argv[1:]...), o.args()...)...)
	cmd.Env = append(os.Environ(), o.Env...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return StartResult{}, fmt.Errorf("session: starting %s: %w", argv[0], err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	res := StartResult{Name: o.Name, Socket: p.Socket, Pid: cmd.Process.Pid, Log: p.Log}
	deadline := time.Now().Add(o.Wait)
	answered := false
	for {
		select {
		case err := <-exited:
			return res, fmt.Errorf("session: the session process exited (%v) before it was ready: %s (log %s)", err, exitReason(p.Log, logStart), p.Log)
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		st, err := pingStatus(ctx, p.Socket, time.Second)
		switch {
		case err != nil:
			if !answered && time.Now().After(deadline) {
				return res, fmt.Errorf("session: the session (pid %d) did not answer on %s within %s; see its log %s", res.Pid, p.Socket, o.Wait, p.Log)
			}
		case int(st.Pid) != res.Pid:
			// Another process answers on the socket: ours will find the name taken and exit.
			continue
		case o.ConfigPath != "" && st.State == StateEmpty:
			answered = true // loading the config; its failure ends the process
		default:
			return res, nil
		}
	}
}

// pingStatus dials socket and returns its status within timeout.
func pingStatus(ctx context.Context, socket string, timeout time.Duration) (*StatusResponse, error) {
	c, err := Dial(socket, Options{ClientName: "session-start"})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return c.Status(pctx)
}

// lockName takes the exclusive lock on path, waiting for another Start to release it.
func lockName(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("session: lock file: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("session: locking %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// exitReason is why a session process that wrote its log from offset from exited: the error
// it printed last ("halo-shell: ..."), else the last lines of its log.
func exitReason(path string, from int64) string {
	b, err := os.ReadFile(path)
	if err != nil || from > int64(len(b)) {
		return "(its log cannot be read)"
	}
	var lines []string
	for _, l := range strings.Split(string(b[from:]), "\n") {
		if l = strings.TrimSpace(l); l == "" {
			continue
		}
		lines = append(lines, l)
	}
	for i := len(lines) - 1; i >= 0; i-- {
		if msg, ok := strings.CutPrefix(lines[i], "halo-shell: "); ok {
			return msg
		}
	}
	if len(lines) == 0 {
		return "it wrote nothing"
	}
	return strings.Join(lines[max(0, len(lines)-8):], "\n")
}

// DialOrStart attaches to the named session. When none answers it starts the default
// session, or a session of another name when so names a config to load (an explicit wish
// for that session); any other name that does not answer is an error that lists the running
// sessions (NotRunning), so that a misspelt name never leaves an empty session behind.
func DialOrStart(ctx context.Context, name string, o Options, so StartOptions) (*Client, error) {
	if name == "" {
		name = DefaultName
	}
	c, err := Dial(name, o)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	perr := c.Ping(pctx)
	cancel()
	if perr == nil {
		return c, nil
	}
	if !IsUnavailable(perr) && !errors.Is(perr, context.DeadlineExceeded) {
		c.Close()
		return nil, perr
	}
	if name != DefaultName && so.ConfigPath == "" {
		c.Close()
		return nil, NotRunning(ctx, name)
	}
	so.Name = name
	if _, err := Start(ctx, so); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}
