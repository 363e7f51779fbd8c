package cell

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/halo-shell/halo-shell/internal/switches"
	"github.com/halo-shell/halo-shell/session"
)

// The worker is the interpreter in a child process (`halo-shell cell-worker`), so that a cell
// that overflows its stack or allocates past the memory limit ends the child, not the REPL or
// the kernel: Supervised starts it, speaks the protocol below with it, and starts another when
// it dies.
//
// The protocol is one JSON object (wireMsg) a line: requests on the child's standard input,
// replies and output on its file descriptor 3. The first request is "init" (the session to
// attach to and the client id to use); then "eval", "interrupt", "complete" and "inspect",
// each with an id that its replies carry. The child writes "ready" after init, "out" and
// "display" while a cell runs, and "result" when it ends; "fatal" says why it is about to exit
// (the memory watchdog). Its standard error carries only the Go runtime's own fatal errors,
// which Supervised quotes when the child dies.

var (
	swCellMemory = switches.Register(switches.Switch{Name: "HALO_CELL_MEMORY_LIMIT", Kind: switches.Tuning, Default: "8GiB",
		Doc: "Memory a cell's interpreter process (the REPL's and the kernel's child) may use: the Go memory limit is set to it, and the process ends the cell's interpreter when it uses more (units B, KiB, MiB, GiB)."})
	swCellStack = switches.Register(switches.Switch{Name: "HALO_CELL_MAX_STACK", Kind: switches.Tuning, Default: "256MiB",
		Doc: "Largest goroutine stack in a cell's interpreter process; unbounded recursion ends that process (which is then restarted) at this depth."})
)

// wireMsg is one protocol message, either way.
type wireMsg struct {
	Op string `json:"op"`
	ID int64  `json:"id,omitempty"`

	// init
	Session    string   `json:"session,omitempty"`
	ClientID   string   `json:"client_id,omitempty"`
	ClientName string   `json:"client_name,omitempty"`
	Config     string   `json:"config,omitempty"`
	Method     string   `json:"method,omitempty"`
	Overrides  []string `json:"overrides,omitempty"`

	// eval, complete, inspect
	Src string `json:"src,omitempty"`
	Pos int    `json:"pos,omitempty"`

	// out, display
	Stream string `json:"stream,omitempty"` // stdout, stderr, background
	Data   string `json:"data,omitempty"`
	Bundle Bundle `json:"bundle,omitempty"`

	// result
	Result   *Result `json:"result,omitempty"`
	Error    *Error  `json:"error,omitempty"`
	Attached bool    `json:"attached,omitempty"`
	Target   string  `json:"target,omitempty"`

	// complete, inspect
	Start int      `json:"start,omitempty"`
	Cands []string `json:"cands,omitempty"`
	Doc   string   `json:"doc,omitempty"`
	OK    bool     `json:"ok,omitempty"`

	// fatal
	Msg string `json:"msg,omitempty"`
}

// parseBytes reads "8GiB", "512MiB", "1048576".
func parseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = strings.TrimSpace(v), u.m
			break
		}
	}
	var n int64
	if _, err := fmt.Sscanf(s, "%d", &n); err != nil || n <= 0 {
		return 0, fmt.Errorf("cell: %q is not a size (e.g. 8GiB, 512MiB)", s)
	}
	return n * mult, nil
}

// WorkerMain runs the interpreter worker on this process's standard input and file
// descriptor 3 and returns its exit code (`halo-shell cell-worker`; tests' TestMain).
func WorkerMain() int {
	// Processes the cells start (a session that DialOrStart starts) must not inherit the
	// protocol's descriptor: the supervisor would never see it close.
	syscall.CloseOnExec(3)
	out := os.NewFile(3, "cell-protocol")
	if out == nil {
		fmt.Fprintln(os.Stderr, "cell-worker: file descriptor 3 (the protocol) is not open; this command is started by the REPL and the kernel")
		return 2
	}
	if err := serveWorker(os.Stdin, out); err != nil {
		fmt.Fprintln(os.Stderr, "cell-worker:", err)
		return 1
	}
	return 0
}

type workerConn struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (w *workerConn) send(m wireMsg) {
	w.mu.Lock()
	defer w.mu.Unlock()
	_ = w.enc.Encode(m)
}

// streamWriter sends what a cell writes as "out" messages of the running evaluation.
type streamWriter struct {
	w      *workerConn
	stream string
	id     *int64
	mu     *sync.Mutex
}

func (s streamWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	id := *s.id
	s.mu.Unlock()
	s.w.send(wireMsg{Op: "out", ID: id, Stream: s.stream, Data: string(p)})
	return len(p), nil
}

func serveWorker(in io.Reader, out io.Writer) error {
	w := &workerConn{enc: json.NewEncoder(out)}
	limit, err := parseBytes(swCellMemory.Value())
	if err != nil {
		return err
	}
	stack, err := parseBytes(swCellStack.Value())
	if err != nil {
		return err
	}
	debug.SetMaxStack(int(stack))
	debug.SetMemoryLimit(limit)
	go watchMemory(w, limit)

	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	if !sc.Scan() {
		return errors.New("no init message")
	}
	var init wireMsg
	if err := json.Unmarshal(sc.Bytes(), &init); err != nil || init.Op != "init" {
		return fmt.Errorf("want an init message first, got %q", sc.Text())
	}
	var (
		idMu    sync.Mutex
		current int64
	)
	so := session.StartOptions{ConfigPath: init.Config, Method: init.Method, Overrides: init.Overrides}
	o := session.Options{ClientID: init.ClientID, ClientName: init.ClientName}
	dial := func(ctx context.Context, target string) (*session.Client, error) {
		if target == "" {
			target = session.DefaultName
		}
		if strings.Contains(target, "/") || strings.HasPrefix(target, "tcp://") {
			c, err := session.Dial(target, o)
			if err != nil {
				return nil, err
			}
			if err := c.Ping(ctx); err != nil {
				c.Close()
				return nil, err
			}
			return c, nil
		}
		return session.DialOrStart(ctx, target, o, so)
	}
	it, err := New(Options{Session: init.Session, ClientName: init.ClientName, Dial: dial,
		Stdout:     streamWriter{w, "stdout", &current, &idMu},
		Stderr:     streamWriter{w, "stderr", &current, &idMu},
		Background: streamWriter{w, "background", new(int64), new(sync.Mutex)},
		OnDisplay: func(b Bundle) {
			idMu.Lock()
			id := current
			idMu.Unlock()
			w.send(wireMsg{Op: "display", ID: id, Bundle: b})
		}})
	if err != nil {
		return err
	}
	defer it.Close()
	w.send(wireMsg{Op: "ready"})

	var (
		cmu     sync.Mutex
		cancels = map[int64]context.CancelFunc{}
	)
	for sc.Scan() {
		var m wireMsg
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			return fmt.Errorf("bad request %q: %v", sc.Text(), err)
		}
		switch m.Op {
		case "eval":
			ctx, cancel := context.WithCancel(context.Background())
			cmu.Lock()
			cancels[m.ID] = cancel
			cmu.Unlock()
			go func(m wireMsg) {
				idMu.Lock()
				current = m.ID
				idMu.Unlock()
				res, err := it.Eval(ctx, m.Src)
				cancel()
				cmu.Lock()
				delete(cancels, m.ID)
				cmu.Unlock()
				reply := wireMsg{Op: "result", ID: m.ID, Result: &res}
				if err != nil {
					var ce *Error
					if !errors.As(err, &ce) {
						ce = &Error{Kind: KindAPI, Message: err.Error()}
					}
					reply.Error = ce
				}
				reply.Attached, reply.Target = it.Attached()
				w.send(reply)
			}(m)
		case "interrupt":
			cmu.Lock()
			if c := cancels[m.ID]; c != nil {
				c()
			}
			cmu.Unlock()
		case "complete":
			start, cands := it.Complete(m.Src, m.Pos)
			w.send(wireMsg{Op: "complete", ID: m.ID, Start: start, Cands: cands})
		case "inspect":
			doc, ok := it.Inspect(m.Src, m.Pos)
			w.send(wireMsg{Op: "inspect", ID: m.ID, Doc: doc, OK: ok})
		default:
			return fmt.Errorf("unknown request %q", m.Op)
		}
	}
	return sc.Err()
}

// watchMemory ends the process when it uses more than limit, saying so first: the Go memory
// limit makes the collector work harder near it but cannot refuse an allocation.
func watchMemory(w *workerConn, limit int64) {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}}
	for range time.Tick(100 * time.Millisecond) {
		metrics.Read(s)
		if used := int64(s[0].Value.Uint64()); used > limit {
			w.send(wireMsg{Op: "fatal", Msg: fmt.Sprintf("the cell used %.1f GiB, more than the %.1f GiB limit of its interpreter (HALO_CELL_MEMORY_LIMIT)", float64(used)/(1<<30), float64(limit)/(1<<30))})
			os.Exit(3)
		}
	}
}
