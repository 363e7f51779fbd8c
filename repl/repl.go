package repl

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/term"

	"github.com/halo-shell/halo-shell/cell"
	"github.com/halo-shell/halo-shell/session"
)

// Prompts.
const (
	Prompt         = "halo> "
	ContinuePrompt = "....> "
)

// Options configure Run.
type Options struct {
	// Session to attach to (a name, a socket path or tcp://HOST:PORT); empty means the
	// default session, started when none runs.
	Session string
	// Dial overrides how sessions are attached, and then cells run in this process; nil means
	// they run in a supervised child process (cell.Supervised) that attaches with
	// cell.DialOrStart's rules.
	Dial cell.Dialer
	// WorkerCommand runs that child (default: this executable with the argument cell-worker).
	WorkerCommand []string
	// In, Out and Err default to the process's standard streams. In is read as a terminal
	// when it is an *os.File on a terminal, else as a script.
	In       io.Reader
	Out, Err io.Writer
	// HistoryFile is where the history is kept; empty means DefaultHistoryFile, "-" none.
	HistoryFile string
	// TakeOver takes control of the session at start, from whichever client holds it.
	TakeOver bool
	// ImageDir receives the PNG of every image a cell shows (plots), since a terminal cannot
	// show them; empty means a directory under os.TempDir().
	ImageDir string
}

// Run runs the REPL until the input ends (Ctrl-D) or ctx is done. It detaches from the session
// on return and never stops it. In script mode it returns an error when a cell failed.
func Run(ctx context.Context, o Options) error {
	if o.In == nil {
		o.In = os.Stdin
	}
	if o.Out == nil {
		o.Out = os.Stdout
	}
	if o.Err == nil {
		o.Err = os.Stderr
	}
	r := &repl{o: o, out: &lockedWriter{w: o.Out}, errw: &lockedWriter{w: o.Err}}
	co := cell.Options{Session: o.Session, Dial: o.Dial, ClientName: "repl",
		Stdout: r.out, Stderr: r.errw, Background: r.out,
		OnDisplay: func(b cell.Bundle) { r.printBundle(b) }}
	var (
		it  cell.Evaluator
		err error
	)
	if o.Dial != nil {
		it, err = cell.New(co)
	} else {
		// Cells run in a child process, so that one that overflows its stack or its memory
		// ends the child (reported, and replaced) instead of the REPL.
		it, err = cell.NewSupervised(cell.SupervisedOptions{Options: co, Command: o.WorkerCommand})
	}
	if err != nil {
		return err
	}
	r.it = it
	defer r.detach()
	if o.TakeOver {
		if err := r.takeOver(ctx); err != nil {
			return err
		}
	}
	if f, ok := o.In.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		return r.terminal(ctx, f)
	}
	return r.script(ctx)
}

type repl struct {
	o         Options
	images    int // images saved so far
	it        cell.Evaluator
	out, errw *lockedWriter
	failed    int
}

// lockedWriter serialises writes from the cell and from background goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *lockedWriter) set(w io.Writer) {
	l.mu.Lock()
	l.w = w
	l.mu.Unlock()
}

// detach gives up control of the session (so that another client can take it without
// taking over) and closes the connection; the session keeps running.
func (r *repl) detach() {
	var c *session.Client
	if ok, _ := r.it.Attached(); ok {
		c, _ = r.it.Session()
	}
	// The interpreter first, so that nothing renews control after it is released.
	r.it.Close()
	if c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c.Release(ctx)
		cancel()
	}
}

func (r *repl) printBundle(b cell.Bundle) {
	s := string(b["text/plain"])
	if png := b["image/png"]; len(png) > 0 {
		// A terminal shows no images: write them to files and say where.
		if path, err := r.saveImage(png); err == nil {
			s += " -> " + path
		} else {
			s += " (not saved: " + err.Error() + ")"
		}
	}
	if s == "" {
		return
	}
	if !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	io.WriteString(r.out, s)
}

// eval evaluates one cell and prints its value or error.
func (r *repl) eval(ctx context.Context, src string) {
	res, err := r.it.Eval(ctx, src)
	if res.Stdout != "" && !strings.HasSuffix(res.Stdout, "\n") {
		io.WriteString(r.out, "\n")
	}
	if res.Value != nil {
		r.printBundle(res.Value)
	}
	if err != nil {
		r.failed++
		fmt.Fprintf(r.errw, "error: %v\n", err)
	}
}

// isQuit reports whether a line asks the REPL to end (:quit, :exit, :q); like Ctrl-D it
// detaches and leaves the session running.
func isQuit(line string) bool {
	switch strings.TrimSpace(line) {
	case ":quit", ":exit", ":q":
		return true
	}
	return false
}

func isCommand(line string) bool {
	t := strings.TrimSpace(line)
	return strings.HasPrefix(t, ":") || strings.HasPrefix(t, "%")
}

// script reads cells from a non-terminal input and evaluates each as soon as it is complete.
func (r *repl) script(ctx context.Context) error {
	sc := bufio.NewScanner(r.o.In)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var buf strings.Builder
	for sc.Scan() {
		if ctx.Err() != nil {
			break
		}
		line := sc.Text()
		if buf.Len() == 0 {
			if strings.TrimSpace(line) == "" {
				continue
			}
			if isQuit(line) {
				break
			}
			if isCommand(line) {
				r.eval(ctx, line)
				continue
			}
		}
		buf.WriteString(line + "\n")
		if cell.IsComplete(buf.String()) {
			r.eval(ctx, buf.String())
			buf.Reset()
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("repl: reading the script: %w", err)
	}
	if strings.TrimSpace(buf.String()) != "" {
		r.eval(ctx, buf.String()) // reports what is missing
	}
	if r.failed > 0 {
		return fmt.Errorf("repl: %d cell(s) failed", r.failed)
	}
	return nil
}

// terminal runs the interactive loop on a terminal.
func (r *repl) terminal(ctx context.Context, f *os.File) error {
	fd := int(f.Fd())
	hist := &History{}
	path := r.o.HistoryFile
	if path == "" {
		p, err := DefaultHistoryFile()
		if err != nil {
			fmt.Fprintln(r.errw, err)
		}
		path = p
	}
	if path != "-" && path != "" {
		h, err := LoadHistory(path)
		if err != nil {
			fmt.Fprintln(r.errw, err)
		}
		hist = h
	}
	in := &interruptReader{r: f}
	t := term.NewTerminal(struct {
		io.Reader
		io.Writer
	}{in, r.o.Out}, Prompt)
	t.History = hist
	t.AutoCompleteCallback = r.completer(t)

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt)
	defer signal.Stop(sigs)

	r.banner(ctx)
	var buf strings.Builder
	for {
		if w, h, err := term.GetSize(fd); err == nil && w > 0 && h > 0 {
			t.SetSize(w, h)
		} else {
			t.SetSize(80, 24) // a terminal that reports no size
		}
		state, err := term.MakeRaw(fd)
		if err != nil {
			return fmt.Errorf("repl: terminal: %w", err)
		}
		// While the line editor runs, writes must go through it (raw mode wants \r\n).
		r.out.set(t)
		r.errw.set(t)
		line, rerr := t.ReadLine()
		r.out.set(r.o.Out)
		r.errw.set(r.o.Err)
		term.Restore(fd, state)
		if in.interrupted() {
			buf.Reset()
			t.SetPrompt(Prompt)
			continue
		}
		if errors.Is(rerr, io.EOF) {
			fmt.Fprintln(r.o.Out)
			return nil
		}
		if rerr != nil && !errors.Is(rerr, term.ErrPasteIndicator) {
			return fmt.Errorf("repl: reading the terminal: %w", rerr)
		}
		if ctx.Err() != nil {
			return nil
		}
		if buf.Len() == 0 {
			if strings.TrimSpace(line) == "" {
				continue
			}
			if isQuit(line) {
				return nil
			}
			if isCommand(line) {
				r.evalInterruptible(ctx, line, sigs)
				continue
			}
		}
		buf.WriteString(line + "\n")
		if !cell.IsComplete(buf.String()) {
			t.SetPrompt(ContinuePrompt)
			continue
		}
		src := buf.String()
		buf.Reset()
		t.SetPrompt(Prompt)
		r.evalInterruptible(ctx, src, sigs)
	}
}

// evalInterruptible evaluates src, cancelling it on SIGINT (Ctrl-C in cooked mode).
func (r *repl) evalInterruptible(ctx context.Context, src string, sigs chan os.Signal) {
	for len(sigs) > 0 {
		<-sigs
	}
	ectx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		select {
		case <-sigs:
			cancel()
		case <-done:
		}
	}()
	r.eval(ectx, src)
	close(done)
	cancel()
}

// takeOver makes this REPL the session's controller and says from whom it took control.
func (r *repl) takeOver(ctx context.Context) error {
	c, err := r.it.Session()
	if err != nil {
		return fmt.Errorf("repl: --take-over: %w", err)
	}
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	prev, err := c.TakeOver(tctx)
	if err != nil {
		return fmt.Errorf("repl: --take-over: %w", err)
	}
	if prev != "" && prev != c.ID() {
		fmt.Fprintf(r.errw, "took control of the session from client %s\n", prev)
	}
	return nil
}

func (r *repl) banner(ctx context.Context) {
	c, err := r.it.Session()
	if err != nil {
		fmt.Fprintf(r.o.Err, "not attached: %v\nGo still runs; attach with :attach NAME.\n", err)
		return
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := c.Status(sctx)
	if err != nil {
		fmt.Fprintf(r.o.Err, "session does not answer: %v\n", err)
		return
	}
	state := strings.ToLower(strings.TrimPrefix(st.State.String(), "STATE_"))
	fmt.Fprintf(r.o.Out, "halo-shell: attached to session %s (%s, step %d). Type :help for commands, Tab to complete, Ctrl-D or :quit to detach.\n", st.Name, state, st.Step)
}

// completer completes on Tab: the longest common prefix of the candidates, or their list.
func (r *repl) completer(t *term.Terminal) func(line string, pos int, key rune) (string, int, bool) {
	return func(line string, pos int, key rune) (string, int, bool) {
		if key != '\t' {
			return "", 0, false
		}
		start, cands := r.it.Complete(line, pos)
		if len(cands) == 0 {
			return line, pos, true
		}
		word := line[start:pos]
		common := cands[0]
		for _, c := range cands[1:] {
			for !strings.HasPrefix(c, common) {
				common = common[:len(common)-1]
			}
		}
		if len(common) > len(word) {
			return line[:start] + common + line[pos:], start + len(common), true
		}
		if len(cands) > 1 {
			const show = 40
			list := cands
			more := ""
			if len(list) > show {
				list, more = list[:show], fmt.Sprintf("  ... (%d more)", len(cands)-show)
			}
			fmt.Fprintf(t, "%s%s\n", strings.Join(list, "  "), more)
		}
		return line, pos, true
	}
}

// interruptReader turns Ctrl-C (read as a byte in raw mode) into "end of line, erase the
// line, enter", so that the line editor returns an empty line, and remembers it happened.
type interruptReader struct {
	r       io.Reader
	pending []byte
	fired   atomic.Bool
}

func (ir *interruptReader) Read(p []byte) (int, error) {
	if len(ir.pending) == 0 {
		buf := make([]byte, len(p))
		n, err := ir.r.Read(buf)
		for _, b := range buf[:n] {
			if b == 3 {
				ir.fired.Store(true)
				ir.pending = append(ir.pending, 5, 21, '\r') // Ctrl-E, Ctrl-U, Enter
				continue
			}
			ir.pending = append(ir.pending, b)
		}
		if len(ir.pending) == 0 {
			return 0, err
		}
	}
	n := copy(p, ir.pending)
	ir.pending = ir.pending[n:]
	return n, nil
}

// interrupted reports (and clears) whether Ctrl-C was read.
func (ir *interruptReader) interrupted() bool { return ir.fired.Swap(false) }

// saveImage writes a PNG into ImageDir and returns its path.
func (r *repl) saveImage(png []byte) (string, error) {
	dir := r.o.ImageDir
	if dir == "" {
		dir = filepath.Join(os.TempDir(), fmt.Sprintf("halo-shell-images-%d", os.Getpid()))
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	r.images++
	path := filepath.Join(dir, fmt.Sprintf("image-%d.png", r.images))
	if err := os.WriteFile(path, png, 0o600); err != nil {
		return "", err
	}
	return path, nil
}
