package cell

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/traefik/yaegi/interp"
	"github.com/traefik/yaegi/stdlib"

	"github.com/halo-shell/halo-shell/cell/halo"
	"github.com/halo-shell/halo-shell/cell/internal/hostenv"
	"github.com/halo-shell/halo-shell/cell/internal/symbols"
	"github.com/halo-shell/halo-shell/session"
)

// Bundle is a MIME bundle (MIME type -> bytes); it always holds "text/plain". Images are raw
// bytes (a Jupyter front-end base64-encodes image/png).
type Bundle = halo.Bundle

// Result is what one Eval produced.
type Result struct {
	Stdout   string   // everything the cell wrote to standard output
	Stderr   string   // and to standard error
	Displays []Bundle // halo.Display calls and the results of commands before the last item
	Value    Bundle   // the value of a trailing expression or last command; nil when none
}

// ErrorKind says what failed in a cell.
type ErrorKind string

// Error kinds.
const (
	KindCompile     ErrorKind = "compile"     // the cell does not parse or type-check
	KindPanic       ErrorKind = "panic"       // interpreted code panicked
	KindAPI         ErrorKind = "api"         // a halo API call or a command failed
	KindInterrupted ErrorKind = "interrupted" // the context was cancelled
)

// Error is a failed cell. Message and Trace use cell positions: cell[N]:LINE:COL, where N
// counts evaluations from 1.
type Error struct {
	Kind    ErrorKind
	Message string
	Trace   []string // interpreted call frames, innermost first (panics only)
}

func (e *Error) Error() string {
	if len(e.Trace) == 0 {
		return e.Message
	}
	return e.Message + "\n" + strings.Join(e.Trace, "\n")
}

// Evaluator is what the front ends use of an interpreter: an *Interpreter in their own
// process, or a *Supervised one in a child process that a crashing cell cannot take down.
type Evaluator interface {
	Eval(ctx context.Context, src string) (Result, error)
	Complete(src string, cursor int) (start int, candidates []string)
	Inspect(src string, cursor int) (doc string, ok bool)
	Session() (*session.Client, error)
	Attached() (bool, string)
	Close() error
}

var (
	_ Evaluator = (*Interpreter)(nil)
	_ Evaluator = (*Supervised)(nil)
)

// Dialer attaches to a session by name or address.
type Dialer func(ctx context.Context, target string) (*session.Client, error)

// Options configure an Interpreter.
type Options struct {
	// Session is the session to attach to on first use (default session.DefaultName).
	Session string
	// Client, when set, is attached at once (Session names it).
	Client *session.Client
	// Dial attaches to a session (used on first use when Client is nil, and by :attach).
	// Nil means DialOrStart with the client name ClientName.
	Dial Dialer
	// ClientName labels this client in the session's status (default "cell").
	ClientName string
	// Stdout and Stderr, when set, receive output as the cell produces it (it is captured in
	// the Result too). OnDisplay receives display bundles as they are produced.
	Stdout, Stderr io.Writer
	OnDisplay      func(Bundle)
	// Background receives output written after an evaluation ended (by goroutines the cell
	// started); nil discards it.
	Background io.Writer
}

// DialOrStart is the default Dialer: it attaches to the named session, starting it in the
// background when none answers.
func DialOrStart(clientName string) Dialer {
	return func(ctx context.Context, target string) (*session.Client, error) {
		if target == "" {
			target = session.DefaultName
		}
		if strings.Contains(target, "/") || strings.HasPrefix(target, "tcp://") {
			c, err := session.Dial(target, session.Options{ClientName: clientName})
			if err != nil {
				return nil, err
			}
			if err := c.Ping(ctx); err != nil {
				c.Close()
				return nil, err
			}
			return c, nil
		}
		return session.DialOrStart(ctx, target, session.Options{ClientName: clientName}, session.StartOptions{})
	}
}

// Interpreter evaluates Go cells with state kept between evaluations, against the halo API.
// Eval may be called from any goroutine; evaluations run one at a time. Only one Interpreter
// per process drives the halo API at a time: the one evaluating.
type Interpreter struct {
	mu      sync.Mutex // held by Eval
	nmu     sync.Mutex // guards names and imports (read by Complete during an Eval)
	yi      *interp.Interpreter
	env     *hostenv.Env
	opt     Options
	stdout  *switchWriter
	stderr  *switchWriter
	cells   int
	funcs   map[string]funcLoc // where each top-level function was declared
	names   map[string]bool    // identifiers declared at the top level (for completion)
	imports map[string]string  // package name -> import path
	// busy is closed when an interrupted run that did not stop in time has ended; nil when
	// no such run is left.
	busy chan struct{}
	// goCount numbers the go statements rewritten by protectGoroutines.
	goCount int
}

type funcLoc struct {
	cell int
	c    chunk
}

// New returns an Interpreter with the halo package and fmt imported.
func New(o Options) (*Interpreter, error) {
	if o.Session == "" {
		o.Session = session.DefaultName
	}
	if o.ClientName == "" {
		o.ClientName = "cell"
	}
	if o.Dial == nil {
		o.Dial = DialOrStart(o.ClientName)
	}
	if o.Background == nil {
		o.Background = io.Discard
	}
	it := &Interpreter{opt: o, funcs: map[string]funcLoc{}, names: map[string]bool{}, imports: map[string]string{}}
	it.stdout = &switchWriter{w: o.Background}
	it.stderr = &switchWriter{w: o.Background}
	it.yi = interp.New(interp.Options{Stdout: it.stdout, Stderr: it.stderr, Stdin: strings.NewReader("")})
	if err := it.yi.Use(stdlib.Symbols); err != nil {
		return nil, fmt.Errorf("cell: loading the standard library symbols: %w", err)
	}
	// os.Stdout and os.Stderr of interpreted code are the cell's streams too.
	var so, se io.Writer = it.stdout, it.stderr
	if err := it.yi.Use(interp.Exports{"os/os": {"Stdout": reflect.ValueOf(&so).Elem(), "Stderr": reflect.ValueOf(&se).Elem()}}); err != nil {
		return nil, fmt.Errorf("cell: redirecting os.Stdout and os.Stderr: %w", err)
	}
	if err := it.yi.Use(symbols.Symbols); err != nil {
		return nil, fmt.Errorf("cell: loading the halo symbols: %w", err)
	}
	for _, p := range []string{"fmt", haloPath} {
		if _, err := it.yi.Eval("import " + strconv.Quote(p)); err != nil {
			return nil, fmt.Errorf("cell: importing %s: %w", p, err)
		}
		it.imports[p[strings.LastIndex(p, "/")+1:]] = p
	}
	// Make channel operations of interpreted code interruptible (set by a first evaluation
	// with a context).
	if _, err := it.yi.EvalWithContext(context.Background(), ""); err != nil {
		return nil, fmt.Errorf("cell: starting the interpreter: %w", err)
	}
	it.env = hostenv.New(hostenv.Dialer(o.Dial), o.Session)
	if o.Client != nil {
		it.env.SetClient(o.Client, o.Session)
	}
	return it, nil
}

const haloPath = "github.com/halo-shell/halo-shell/cell/halo"

// Close detaches from the session (which keeps running).
func (it *Interpreter) Close() error {
	it.env.Close()
	return nil
}

// Session returns the attached session's client, attaching on first use.
func (it *Interpreter) Session() (*session.Client, error) { return it.env.Client() }

// Attached reports whether a session client is connected, and the session's name or address.
func (it *Interpreter) Attached() (bool, string) { return it.env.Attached(), it.env.Target() }

// Attach attaches to another session.
func (it *Interpreter) Attach(ctx context.Context, target string) error {
	_, err := it.env.Attach(ctx, target)
	return err
}

// item is a command line or a run of code in a cell.
type item struct {
	cmd    string // the command line, when this is a command
	chunks []chunk
}

// Eval evaluates one cell: Go declarations and statements, and lines starting with ':' or '%'
// as commands (see Commands). It returns what the cell printed and displayed and the value of
// a trailing expression; on failure the error is an *Error and the Result holds the output
// produced before it. Cancelling ctx interrupts the cell (not the session).
func (it *Interpreter) Eval(ctx context.Context, src string) (Result, error) {
	it.mu.Lock()
	defer it.mu.Unlock()
	it.cells++
	n := it.cells

	var (
		res            Result
		outBuf, errBuf bytes.Buffer
		dmu            sync.Mutex
	)
	filter := &panicFilter{}
	it.stdout.set(teeWriter(&outBuf, it.opt.Stdout))
	it.stderr.set(filter.wrap(teeWriter(&errBuf, it.opt.Stderr)))
	display := func(b map[string][]byte) {
		dmu.Lock()
		res.Displays = append(res.Displays, b)
		dmu.Unlock()
		if it.opt.OnDisplay != nil {
			it.opt.OnDisplay(b)
		}
	}
	hostenv.Activate(it.env)
	it.env.SetEval(ctx, it.stdout, display)
	defer it.env.SetEval(context.Background(), it.opt.Background, nil)
	finish := func(err error) (Result, error) {
		// From here on, goroutines the cell started write to Background; set waits for a
		// write in progress, so the buffers are no longer written.
		it.stdout.set(it.opt.Background)
		it.stderr.set(it.opt.Background)
		filter.flush()
		dmu.Lock()
		defer dmu.Unlock()
		res.Stdout, res.Stderr = outBuf.String(), errBuf.String()
		return res, err
	}

	items, err := it.parse(src, n)
	if err != nil {
		return finish(err)
	}
	// Imports first, all of them: the interpreter does not take them between statements.
	for _, itm := range items {
		for _, c := range itm.chunks {
			if c.kind != importChunk {
				continue
			}
			// Importing a package again (a re-run cell) is a no-op, as in compiled Go
			// across files; the interpreter itself would report it as redeclared.
			it.nmu.Lock()
			fresh, any := it.newImports(c.src)
			it.nmu.Unlock()
			if !any {
				continue
			}
			c.src = fresh
			if _, err := it.exec(ctx, c.src); err != nil {
				return finish(it.evalError(ctx, err, c, n, filter))
			}
			it.nmu.Lock()
			it.noteImports(c.src)
			it.nmu.Unlock()
		}
	}
	for i, itm := range items {
		last := i == len(items)-1
		if itm.cmd != "" {
			b, err := it.runCommand(ctx, itm.cmd)
			if err != nil {
				return finish(err)
			}
			if b != nil {
				if last {
					res.Value = b
				} else {
					display(b)
				}
			}
			continue
		}
		for j, c := range itm.chunks {
			if c.kind == importChunk {
				continue
			}
			c.src = it.protectGoroutines(c)
			v, err := it.exec(ctx, c.evalSrc())
			if err != nil && c.kind == stmtChunk && ctx.Err() == nil && compileFailure(err, filter) {
				if werr, ok := it.defineViaInterface(ctx, c); ok {
					err = werr
				}
			}
			if err != nil {
				return finish(it.evalError(ctx, err, c, n, filter))
			}
			filter.reset()
			it.nmu.Lock()
			it.noteNames(c)
			it.nmu.Unlock()
			if c.funcName != "" {
				it.funcs[c.funcName] = funcLoc{cell: n, c: c}
			}
			if last && j == len(itm.chunks)-1 && c.expr && v.IsValid() && !printCall(c.src) && !it.voidCall(c.src, v) {
				res.Value = valueBundle(v) // nil for a call without results
			}
		}
	}
	return finish(nil)
}

// parse splits a cell into command lines and code; a line is a command when it starts with
// ':' or '%' outside any open bracket, string or comment of the code before it.
func (it *Interpreter) parse(src string, n int) ([]item, error) {
	var (
		items     []item
		code      strings.Builder
		codeStart int // line where the pending code starts (0-based)
	)
	flushCode := func() error {
		text := code.String()
		code.Reset()
		if strings.TrimSpace(text) == "" {
			return nil
		}
		chunks, err := splitCell(text)
		if err != nil {
			return &Error{Kind: KindCompile, Message: shiftScanError(err.Error(), n, codeStart)}
		}
		for i := range chunks {
			chunks[i].line += codeStart
		}
		items = append(items, item{chunks: chunks})
		return nil
	}
	lines := strings.Split(src, "\n")
	for i, line := range lines {
		t := strings.TrimSpace(line)
		if (strings.HasPrefix(t, ":") || strings.HasPrefix(t, "%")) && IsComplete(code.String()) {
			if err := flushCode(); err != nil {
				return nil, err
			}
			items = append(items, item{cmd: t})
			codeStart = i + 1
			continue
		}
		if code.Len() == 0 {
			codeStart = i
		}
		code.WriteString(line)
		code.WriteByte('\n')
	}
	if err := flushCode(); err != nil {
		return nil, err
	}
	return items, nil
}

var scanPos = regexp.MustCompile(`(?m)cell:(\d+):(\d+)`)

func shiftScanError(msg string, n, lineOff int) string {
	return scanPos.ReplaceAllStringFunc(msg, func(m string) string {
		p := scanPos.FindStringSubmatch(m)
		l, _ := strconv.Atoi(p[1])
		return fmt.Sprintf("cell[%d]:%d:%s", n, l+lineOff, p[2])
	})
}

// yaegiPos matches positions in the interpreter's messages: "1:28:" or "_.go:1:28:".
var yaegiPos = regexp.MustCompile(`(?m)(?:^|\b_\.go:)(\d+):(\d+):`)

// cellPos maps a position in the interpreter's wrapped source of chunk c to the cell.
func cellPos(n int, c chunk, line, col int) string {
	if line == 1 {
		col = col - c.wrapPrefix() + c.col - 1
	}
	return fmt.Sprintf("cell[%d]:%d:%d", n, c.line+line-1, max(col, 1))
}

func (it *Interpreter) evalError(ctx context.Context, err error, c chunk, n int, filter *panicFilter) error {
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ctx.Err())) {
		return &Error{Kind: KindInterrupted, Message: "interrupted (the session is not affected)"}
	}
	// The interpreter reports a package used without its import as an internal failure or a
	// puzzling type error; say what is missing instead.
	it.nmu.Lock()
	hint := it.missingImport(c)
	it.nmu.Unlock()
	if hint != "" {
		return &Error{Kind: KindCompile, Message: hint}
	}
	// An undeclared name reaches the user as "CFG post-order panic: L:C: incomplete type X".
	if m := incompleteType.FindStringSubmatch(err.Error()); m != nil {
		return &Error{Kind: KindCompile, Message: cellPos(n, c, atoi(m[1]), atoi(m[2])) + ": undefined: " + m[3]}
	}
	var p interp.Panic
	if errors.As(err, &p) {
		e := &Error{Kind: KindPanic, Message: "panic: " + fmt.Sprint(p.Value)}
		var he *halo.Error
		if pe, ok := p.Value.(error); ok && errors.As(pe, &he) {
			e.Kind, e.Message = KindAPI, he.Error()
		}
		for _, f := range filter.take() {
			e.Trace = append(e.Trace, it.frame(f, c, n))
		}
		return e
	}
	var he *halo.Error
	if errors.As(err, &he) {
		return &Error{Kind: KindAPI, Message: he.Error()}
	}
	msg := yaegiPos.ReplaceAllStringFunc(err.Error(), func(m string) string {
		p := yaegiPos.FindStringSubmatch(m)
		l, _ := strconv.Atoi(p[1])
		col, _ := strconv.Atoi(p[2])
		return cellPos(n, c, l, col) + ":"
	})
	return &Error{Kind: KindCompile, Message: msg}
}

// incompleteType matches the interpreter's report of an undeclared name.
var incompleteType = regexp.MustCompile(`(\d+):(\d+): incomplete type ([\pL_][\pL\pN_]*)`)

func atoi(s string) int { v, _ := strconv.Atoi(s); return v }

// missingImport names a standard-library package that chunk c uses (pkg.Name) without an
// import in effect and without a variable of that name, with the import to add; "" if none.
func (it *Interpreter) missingImport(c chunk) string {
	src := "package p;" + c.src
	if c.kind == stmtChunk {
		src = "package p; func _() {\n" + c.src + "\n}"
	}
	f, err := parser.ParseFile(token.NewFileSet(), "", src, 0)
	if err != nil {
		return ""
	}
	hint := ""
	ast.Inspect(f, func(nd ast.Node) bool {
		sel, ok := nd.(*ast.SelectorExpr)
		if !ok || hint != "" {
			return hint == ""
		}
		x, ok := sel.X.(*ast.Ident)
		if !ok || x.Obj != nil || it.names[x.Name] {
			return true
		}
		if _, imported := it.imports[x.Name]; imported {
			return true
		}
		if path := stdlibPath(x.Name); path != "" {
			hint = fmt.Sprintf("undefined: %s (add import %q)", x.Name, path)
		}
		return true
	})
	return hint
}

// stdlibPath is the import path of the standard-library package named name that cells can
// import, or "" (the shortest path wins: "rand" is math/rand).
func stdlibPath(name string) string {
	best := ""
	for key := range stdlib.Symbols { // "import/path/name"
		i := strings.LastIndex(key, "/")
		if i <= 0 {
			continue
		}
		path := key[:i]
		if path[strings.LastIndex(path, "/")+1:] != name {
			continue
		}
		if best == "" || len(path) < len(best) || (len(path) == len(best) && path < best) {
			best = path
		}
	}
	return best
}

// frame maps one "L:C: panic: main.f(...)" line of the interpreter to "at f (cell[N]:L:C)".
func (it *Interpreter) frame(f panicFrame, c chunk, n int) string {
	name := strings.TrimPrefix(f.fn, "main.")
	if f.fn == "" || f.fn == "main" {
		return "  at " + cellPos(n, c, f.line, f.col)
	}
	if loc, ok := it.funcs[name]; ok {
		return fmt.Sprintf("  at %s (%s)", name, cellPos(loc.cell, loc.c, f.line, f.col))
	}
	return fmt.Sprintf("  at %s (line %d:%d of its declaration)", name, f.line, f.col)
}

// printCall reports whether a trailing expression is a print or write call, whose
// (count, error) result is not worth showing.
func printCall(src string) bool {
	e, err := parser.ParseExpr(src)
	if err != nil {
		return false
	}
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	var name string
	switch f := call.Fun.(type) {
	case *ast.Ident:
		name = f.Name
	case *ast.SelectorExpr:
		name = f.Sel.Name
	}
	for _, p := range []string{"Print", "Fprint", "Write"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// voidCall reports whether v is what the interpreter returns for a call of a compiled
// function without results (a function value; calls returning functions are not shown
// either).
func (it *Interpreter) voidCall(src string, v reflect.Value) bool {
	e, err := parser.ParseExpr(src)
	if err != nil {
		return false
	}
	call, isCall := e.(*ast.CallExpr)
	if !isCall {
		return false
	}
	// pkg.Func of a compiled package: its signature says.
	if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
		if pkg, ok := sel.X.(*ast.Ident); ok {
			it.nmu.Lock()
			path, imported := it.imports[pkg.Name]
			it.nmu.Unlock()
			if imported {
				if f, ok := packageSymbol(path, sel.Sel.Name); ok && f.Kind() == reflect.Func {
					return f.Type().NumOut() == 0
				}
			}
		}
	}
	return v.Kind() == reflect.Func
}

// voidType is what the interpreter returns for a statement or a call without results.
var voidType = reflect.TypeOf((*interface{})(nil))

func valueBundle(v reflect.Value) (b Bundle) {
	defer func() {
		if r := recover(); r != nil {
			b = Bundle{"text/plain": []byte(fmt.Sprintf("<value of type %s: %v>", v.Type(), r))}
		}
	}()
	if v.Type() == voidType {
		return nil
	}
	if !v.CanInterface() {
		return Bundle{"text/plain": []byte(v.String())}
	}
	return halo.BundleOf(v.Interface())
}

// newImports returns the import declarations of src that are not already in effect (the same
// name for the same path), and whether there are any. A name bound to another path is kept, so
// the interpreter reports the clash.
func (it *Interpreter) newImports(src string) (string, bool) {
	f, err := parser.ParseFile(tokenFset(), "", "package p;"+src, parser.ImportsOnly)
	if err != nil {
		return src, true // let the interpreter report the syntax error
	}
	var b strings.Builder
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		name := p[strings.LastIndex(p, "/")+1:]
		spec := im.Path.Value
		if im.Name != nil {
			name = im.Name.Name
			spec = name + " " + spec
		}
		if name != "_" && name != "." && it.imports[name] == p {
			continue
		}
		b.WriteString("import " + spec + "\n")
	}
	return b.String(), b.Len() > 0
}

// noteImports records the package names an import chunk brings in.
func (it *Interpreter) noteImports(src string) {
	f, err := parser.ParseFile(tokenFset(), "", "package p;"+src, parser.ImportsOnly)
	if err != nil {
		return
	}
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		name := p[strings.LastIndex(p, "/")+1:]
		if im.Name != nil {
			name = im.Name.Name
		}
		it.imports[name] = p
	}
}

// noteNames records the identifiers a chunk declares at the top level.
func (it *Interpreter) noteNames(c chunk) {
	src := "package p;" + c.src
	if c.kind == stmtChunk {
		src = "package p; func _() {" + c.src + "\n}"
	}
	f, err := parser.ParseFile(tokenFset(), "", src, 0)
	if err != nil {
		return
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil && d.Name.Name != "_" {
				it.names[d.Name.Name] = true
				continue
			}
			if d.Name.Name != "_" || d.Body == nil {
				continue
			}
			for _, s := range d.Body.List {
				switch s := s.(type) {
				case *ast.AssignStmt:
					for _, l := range s.Lhs {
						if id, ok := l.(*ast.Ident); ok && id.Name != "_" {
							it.names[id.Name] = true
						}
					}
				case *ast.DeclStmt:
					it.noteGenDecl(s.Decl)
				}
			}
		case *ast.GenDecl:
			it.noteGenDecl(d)
		}
	}
}

func (it *Interpreter) noteGenDecl(d ast.Decl) {
	g, ok := d.(*ast.GenDecl)
	if !ok {
		return
	}
	for _, s := range g.Specs {
		switch s := s.(type) {
		case *ast.ValueSpec:
			for _, id := range s.Names {
				if id.Name != "_" {
					it.names[id.Name] = true
				}
			}
		case *ast.TypeSpec:
			it.names[s.Name.Name] = true
		}
	}
}

// defineViaInterface evaluates "a, b := x, y" one name at a time through an interface
// variable and a type assertion. The interpreter cannot type an index into a slice, array or
// map of a compiled type ("first := parts[0]" after parts := strings.Split(...)) in a
// top-level define, and reports a "definition loop"; a variable of type interface{} is
// assigned the value (assignments are typed where defines are not), and the assertion to its dynamic type gives the name its proper type. It
// returns ok false when the chunk is not such a define (the original error stands).
func (it *Interpreter) defineViaInterface(ctx context.Context, c chunk) (error, bool) {
	f, err := parser.ParseFile(tokenFset(), "", "package p; func _() {"+c.src+"\n}", 0)
	if err != nil {
		return nil, false
	}
	body := f.Decls[0].(*ast.FuncDecl).Body.List
	if len(body) != 1 {
		return nil, false
	}
	as, ok := body[0].(*ast.AssignStmt)
	if !ok || as.Tok != token.DEFINE || len(as.Lhs) != len(as.Rhs) {
		return nil, false
	}
	off := len("package p; func _() {")
	for i, l := range as.Lhs {
		id, ok := l.(*ast.Ident)
		if !ok {
			return nil, false
		}
		rhs := c.src[int(as.Rhs[i].Pos())-1-off : int(as.Rhs[i].End())-1-off]
		tmp := fmt.Sprintf("__halo_define_%d", it.cells)
		if _, err := it.exec(ctx, fmt.Sprintf("var %s interface{}", tmp)); err != nil {
			return err, true
		}
		if _, err := it.exec(ctx, fmt.Sprintf("%s = %s", tmp, rhs)); err != nil {
			return err, true
		}
		v, err := it.exec(ctx, tmp)
		if err != nil {
			return err, true
		}
		if id.Name == "_" {
			continue
		}
		src := fmt.Sprintf("%s := %s", id.Name, tmp)
		if v.IsValid() && v.Kind() == reflect.Interface && !v.IsNil() {
			src = fmt.Sprintf("%s := %s.(%s)", id.Name, tmp, v.Elem().Type().String())
		}
		if _, err := it.exec(ctx, src); err != nil {
			return err, true
		}
	}
	return nil, true
}

// compileFailure reports whether err is the interpreter failing to type a statement: a
// "definition loop" error, or a panic raised before any interpreted code ran (no frames).
func compileFailure(err error, filter *panicFilter) bool {
	if strings.Contains(err.Error(), "definition loop") {
		return true
	}
	var p interp.Panic
	if errors.As(err, &p) {
		filter.mu.Lock()
		n := len(filter.frames)
		filter.mu.Unlock()
		return n == 0
	}
	return false
}

// stopWait is how long an interrupted run may take to stop before Eval returns anyway.
const stopWait = 3 * time.Second

// exec compiles and runs src on a goroutine it owns, so that an interrupted run is known to
// have ended before the next one starts (the interpreter's own EvalWithContext returns at
// once and leaves it running, racing with what comes next).
func (it *Interpreter) exec(ctx context.Context, src string) (reflect.Value, error) {
	if err := it.waitIdle(ctx); err != nil {
		return reflect.Value{}, err
	}
	prog, err := it.compile(src)
	if err != nil {
		return reflect.Value{}, err
	}
	var (
		v    reflect.Value
		rerr error
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		v, rerr = it.yi.Execute(prog)
	}()
	select {
	case <-done:
		return v, rerr
	case <-ctx.Done():
	}
	it.stop()
	select {
	case <-done:
		it.rearm()
	case <-time.After(stopWait):
		it.busy = done // inside a compiled call; the next run waits for it
	}
	return reflect.Value{}, ctx.Err()
}

func (it *Interpreter) compile(src string) (p *interp.Program, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = interp.Panic{Value: fmt.Errorf("the interpreter failed on this code: %v", r)}
		}
	}()
	return it.yi.Compile(src)
}

// waitIdle waits for an interrupted run that is still inside a compiled call.
func (it *Interpreter) waitIdle(ctx context.Context) error {
	if it.busy == nil {
		return nil
	}
	select {
	case <-it.busy:
		it.busy = nil
		it.rearm()
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stop makes running interpreted code return at its next step. The interpreter stops code
// only through EvalWithContext with a context that ends first; a source that does not parse
// runs nothing, and the call is repeated until the context, not the parse error, won.
//
// That call also replaces the interpreter's cancellation channel before closing the new one,
// while code blocked in a channel operation waits on the old one; so the old one is closed
// too. It is read from the interpreter's unexported field "done" (yaegi v0.16.1; the
// interrupt tests fail if that changes).
func (it *Interpreter) stop() {
	old := doneChan(it.yi)
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 1000 {
		if _, err := it.yi.EvalWithContext(cctx, "}"); errors.Is(err, context.Canceled) {
			break
		}
	}
	if old != nil {
		func() {
			defer func() { recover() }() // already closed
			close(old)
		}()
	}
}

// doneChan returns the interpreter's current cancellation channel (nil if not found).
func doneChan(yi *interp.Interpreter) chan struct{} {
	f := reflect.ValueOf(yi).Elem().FieldByName("done")
	if !f.IsValid() || f.Type() != reflect.TypeOf((chan struct{})(nil)) {
		return nil
	}
	return *(*chan struct{})(unsafe.Pointer(f.UnsafeAddr()))
}

// rearm gives the interpreter a fresh cancellation channel after a stop (channel operations
// of later runs would otherwise see it closed).
func (it *Interpreter) rearm() {
	it.yi.EvalWithContext(context.Background(), "")
}
