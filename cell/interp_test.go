package cell

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func newInterp(t *testing.T) *Interpreter {
	t.Helper()
	it, err := New(Options{Session: "cell-test-none", Dial: nil})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { it.Close() })
	return it
}

func eval(t *testing.T, it *Interpreter, src string) Result {
	t.Helper()
	r, err := it.Eval(context.Background(), src)
	if err != nil {
		t.Fatalf("Eval(%q): %v", src, err)
	}
	return r
}

func plain(b Bundle) string {
	if b == nil {
		return "<none>"
	}
	return string(b["text/plain"])
}

func TestEvalKeepsStateAcrossCells(t *testing.T) {
	it := newInterp(t)
	eval(t, it, "x := 40")
	eval(t, it, "func add(a int) int { return a + x }")
	eval(t, it, "type pair struct{ A, B int }")
	r := eval(t, it, "p := pair{add(1), add(2)}\np.A + p.B")
	if got := plain(r.Value); got != "83" {
		t.Fatalf("value = %q, want 83", got)
	}
	if got := plain(eval(t, it, "x").Value); got != "40" {
		t.Fatalf("x = %q, want 40", got)
	}
}

func TestEvalTrailingExpression(t *testing.T) {
	it := newInterp(t)
	for _, tc := range []struct {
		name, src, want, stdout string
	}{
		{"int", "1 + 2", "3", ""},
		{"string is quoted", `"a" + "b"`, `"ab"`, ""},
		{"statement has no value", "y := 5", "<none>", ""},
		{"print call shows output, not its count", `fmt.Println("hi")`, "<none>", "hi\n"},
		{"last of several statements", "z := 2\nz * 21", "42", ""},
		{"void call", "func noop() {}\nnoop()", "<none>", ""},
		{"void compiled call", "import \"time\"\ntime.Sleep(1)", "<none>", ""},
		{"void API call", "halo.Display(\"shown\")", "<none>", ""},
		{"slice", "[]int{1, 2}", "[1 2]", ""},
		{"value after command-free code with comment", "// just a comment\n7", "7", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := eval(t, it, tc.src)
			if got := plain(r.Value); got != tc.want {
				t.Errorf("value = %q, want %q", got, tc.want)
			}
			if r.Stdout != tc.stdout {
				t.Errorf("stdout = %q, want %q", r.Stdout, tc.stdout)
			}
		})
	}
}

func TestEvalImportsMixedWithStatements(t *testing.T) {
	it := newInterp(t)
	r := eval(t, it, "s := \"go\"\nimport \"strings\"\nimport (\n\t\"math\"\n)\nstrings.ToUpper(s) + fmt.Sprint(math.Sqrt(16))")
	if got := plain(r.Value); got != `"GO4"` {
		t.Fatalf("value = %q, want \"GO4\"", got)
	}
	// Imports persist.
	if got := plain(eval(t, it, `strings.Repeat("a", 3)`).Value); got != `"aaa"` {
		t.Fatalf("value = %q", got)
	}
}

// TestEvalReimportIsANoOp checks that running a cell with imports again (a re-run notebook
// cell), or importing a package the interpreter already has (fmt), works, while binding a name
// to another package is still refused.
func TestEvalReimportIsANoOp(t *testing.T) {
	it := newInterp(t)
	cell := "import \"strings\"\nimport (\n\t\"fmt\"\n\tm \"math\"\n)\nstrings.Repeat(fmt.Sprint(m.Sqrt(4)), 2)"
	for run := 1; run <= 2; run++ {
		if got := plain(eval(t, it, cell).Value); got != `"22"` {
			t.Fatalf("run %d: value = %q, want \"22\"", run, got)
		}
	}
	if _, err := it.Eval(context.Background(), "import m \"strings\""); err == nil {
		t.Fatal("binding m to another package was accepted")
	}
}

// TestEvalNamesWhatIsUndefined checks the messages for a package used without its import and
// for an undeclared name, which the interpreter itself reports as internal failures.
func TestEvalNamesWhatIsUndefined(t *testing.T) {
	it := newInterp(t)
	for _, tc := range []struct{ src, want string }{
		{`if _, err := os.Stat("/none"); err != nil { fmt.Println(err) }`, `undefined: os (add import "os")`},
		{`b, _ := json.Marshal(1)`, `undefined: json (add import "encoding/json")`},
		{`x := rand.Intn(3)`, `undefined: rand (add import "math/rand")`},
		{`z := notDeclaredAnywhere + 1`, `undefined: notDeclaredAnywhere`},
	} {
		_, err := it.Eval(context.Background(), tc.src)
		var ce *Error
		if !errors.As(err, &ce) || ce.Kind != KindCompile || !strings.Contains(ce.Message, tc.want) {
			t.Errorf("%s: error %v, want a compile error containing %q", tc.src, err, tc.want)
		}
	}
	// A variable that shadows a package name is not an import problem.
	if got := plain(eval(t, it, "os := 3\nos + 1").Value); got != "4" {
		t.Fatalf("value = %q, want 4", got)
	}
}

func TestEvalDeclarationsAndMethods(t *testing.T) {
	it := newInterp(t)
	r := eval(t, it, `type counter struct{ n int }
func (c *counter) inc() { c.n++ }
const start = 3
var c = &counter{n: start}
c.inc()
func() { c.inc() }()
c.n`)
	if got := plain(r.Value); got != "5" {
		t.Fatalf("value = %q, want 5", got)
	}
}

func TestEvalPanicIsReportedWithInterpretedStack(t *testing.T) {
	it := newInterp(t)
	eval(t, it, "func at(a []int, i int) int {\n\treturn a[i]\n}")
	_, err := it.Eval(context.Background(), "fmt.Println(\"before\")\nat(nil, 3)")
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("err = %v (%T), want *Error", err, err)
	}
	if e.Kind != KindPanic || !strings.HasPrefix(e.Message, "panic:") {
		t.Fatalf("kind %s message %q, want a panic", e.Kind, e.Message)
	}
	trace := strings.Join(e.Trace, "\n")
	if !strings.Contains(trace, "at at (cell[1]:2:") || !strings.Contains(trace, "cell[2]:2:") {
		t.Fatalf("trace does not name the frames in their cells:\n%s", trace)
	}
	// The interpreter goes on, state intact.
	if got := plain(eval(t, it, "at([]int{7, 8}, 1)").Value); got != "8" {
		t.Fatalf("after the panic: %q", got)
	}
	// A panic the cell recovers itself is no error.
	r := eval(t, it, "func safe() (s string) {\n\tdefer func() { s = fmt.Sprint(recover()) }()\n\tpanic(\"x\")\n}\nsafe()")
	if got := plain(r.Value); got != `"x"` {
		t.Fatalf("recovered: %q", got)
	}
}

func TestEvalCompileErrorNamesCellPosition(t *testing.T) {
	it := newInterp(t)
	for _, tc := range []struct{ src, want string }{
		{"a := 1\nfmt.Println(a, undefinedName)", "cell[1]:2:16: undefined: undefinedName"},
		{"x := (1 +", "cell[2]:"},
		{"x := \"unterminated", "string literal not terminated"},
	} {
		_, err := it.Eval(context.Background(), tc.src)
		var e *Error
		if !errors.As(err, &e) || e.Kind != KindCompile {
			t.Fatalf("Eval(%q) err = %v, want a compile error", tc.src, err)
		}
		if !strings.Contains(e.Message, tc.want) {
			t.Errorf("Eval(%q) = %q, want it to contain %q", tc.src, e.Message, tc.want)
		}
	}
}

func TestEvalInterrupt(t *testing.T) {
	it := newInterp(t)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(200 * time.Millisecond)
		cancel()
	}()
	start := time.Now()
	_, err := it.Eval(ctx, "n := 0\nfor {\n\tn++\n}")
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindInterrupted {
		t.Fatalf("err = %v, want an interruption", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("interrupt took %s", d)
	}
	// The interpreter is usable afterwards and kept the variable.
	time.Sleep(50 * time.Millisecond)
	r := eval(t, it, "n > 0")
	if got := plain(r.Value); got != "true" {
		t.Fatalf("after interrupt: n > 0 = %q", got)
	}
}

func TestEvalCapturesStderrAndDisplays(t *testing.T) {
	it := newInterp(t)
	var live []Bundle
	it.opt.OnDisplay = func(b Bundle) { live = append(live, b) }
	r := eval(t, it, "import \"os\"\nfmt.Fprintln(os.Stderr, \"warn\")\nhalo.Display(halo.Table{Header: []string{\"k\", \"v\"}, Rows: [][]string{{\"a\", \"1\"}}})\nhalo.Display(3)")
	if r.Stderr != "warn\n" {
		t.Errorf("stderr = %q", r.Stderr)
	}
	if len(r.Displays) != 2 || len(live) != 2 {
		t.Fatalf("displays = %d, live %d, want 2", len(r.Displays), len(live))
	}
	if !strings.Contains(string(r.Displays[0]["text/html"]), "<td>a</td>") || plain(r.Displays[1]) != "3" {
		t.Fatalf("displays = %q / %q", r.Displays[0], r.Displays[1])
	}
}

func parseFloat(s string) (float64, error) { return strconv.ParseFloat(s, 64) }

// The interpreter alone rejects a top-level define that indexes a slice of a compiled type
// held in a variable; the cell defines it through an interface and keeps the static type.
func TestEvalDefineIndexingCompiledSlice(t *testing.T) {
	it := newInterp(t)
	eval(t, it, "import \"strings\"\nparts := strings.Split(\"a,b\", \",\")")
	eval(t, it, "first, n := parts[1], 2")
	if got := plain(eval(t, it, "strings.Repeat(first, n)").Value); got != `"bb"` {
		t.Fatalf("value = %q", got)
	}
	eval(t, it, "steps := halo.ProfileReport{Steps: []halo.StepProfile{{Host: 0.5}}}.Steps\ns0 := steps[0]")
	eval(t, it, "host := steps[0].Host")
	if got := plain(eval(t, it, "s0.Host * 2 + host").Value); got != "1.5" {
		t.Fatalf("s0.Host * 2 = %q", got)
	}
	// An index out of range is still a panic, not a silent nil.
	_, err := it.Eval(context.Background(), "bad := parts[5]")
	if err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Fatalf("err = %v", err)
	}
}

func TestEvalStatementsWithHeaders(t *testing.T) {
	it := newInterp(t)
	r := eval(t, it, "sum := 0\nfor i := 0; i < 4; i++ {\n\tsum += i\n}\nif s := sum * 2; s > 10 {\n\tsum = s\n}\nswitch x := sum; {\ncase x > 0:\n\tsum++\n}\nsum")
	if got := plain(r.Value); got != "13" {
		t.Fatalf("sum = %q, want 13", got)
	}
}

func TestEvalInterruptBlockedCells(t *testing.T) {
	it := newInterp(t)
	interrupt := func(src string, after time.Duration) time.Duration {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			time.Sleep(after)
			cancel()
		}()
		start := time.Now()
		_, err := it.Eval(ctx, src)
		var e *Error
		if !errors.As(err, &e) || e.Kind != KindInterrupted {
			t.Fatalf("Eval(%q) err = %v, want an interruption", src, err)
		}
		return time.Since(start)
	}
	// A receive on a channel nobody sends on.
	interrupt("ch := make(chan int)\n<-ch", 100*time.Millisecond)
	// Channels work again afterwards.
	if got := plain(eval(t, it, "c2 := make(chan int, 1)\nc2 <- 7\n<-c2").Value); got != "7" {
		t.Fatalf("after interrupting a receive: %q", got)
	}
	// A compiled call that ignores the interruption: Eval returns after stopWait, and the
	// next cell waits until the call has returned instead of running beside it.
	eval(t, it, "import \"time\"\nslept := false")
	d := interrupt("time.Sleep(4 * time.Second)\nslept = true", 100*time.Millisecond)
	if d < stopWait || d > stopWait+2*time.Second {
		t.Fatalf("interrupting a blocked call took %s, want about %s", d, stopWait)
	}
	if got := plain(eval(t, it, "slept").Value); got != "false" {
		t.Fatalf("the statement after the interrupted call ran: slept = %s", got)
	}
}

// syncBuffer is a bytes.Buffer safe for the goroutines of a cell.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A panic in a goroutine a cell started would end the process; it is reported instead.
func TestEvalGoroutinePanicIsReported(t *testing.T) {
	var bg syncBuffer
	it, err := New(Options{Session: "none", Background: &bg})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	// What a goroutine prints goes to the cell running at the time, or to Background. Each
	// cell's goroutines must end before the next cell runs: the interpreter's goroutines share
	// its frames unsynchronised with a cell that starts meanwhile. So wait until a cell's
	// goroutine has reported its panic (its last act), then a little longer for it to return.
	var cells strings.Builder
	settle := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(cells.String()+bg.String(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("output %q lacks %q", cells.String()+bg.String(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond)
	}
	cells.WriteString(eval(t, it, "go func() { panic(\"first\") }()").Stdout)
	settle("cell: first")
	cells.WriteString(eval(t, it, "func spawn() {\n\tgo func(n int) {\n\t\tgo panic(n)\n\t}(7)\n}\nspawn()").Stdout)
	settle("cell: 7")
	// Arguments are evaluated at the go statement, as in Go. The go statement sits in a
	// function: a goroutine started by a cell's top-level statements reads the interpreter's
	// global frame, which the interpreter itself writes without a lock when it runs the cell's
	// next statements (a race inside the interpreter, which the race detector reports).
	r := eval(t, it, "ch := make(chan int, 1)\nfunc send(c chan int, v int) { c <- v }\nfunc demo(c chan int, x int) int {\n\tgo send(c, x)\n\tx = 6\n\treturn x\n}\nx := demo(ch, 5)\n<-ch")
	time.Sleep(200 * time.Millisecond) // send's goroutine ends right after its send
	cells.WriteString(r.Stdout)
	if got := plain(r.Value); got != "5" {
		t.Fatalf("go send(ch, x) sent %s, want 5", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for out := ""; ; {
		out = cells.String() + bg.String()
		if strings.Contains(out, "cell: first") && strings.Contains(out, "cell: 7") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("output %q lacks the goroutine panics", out)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := plain(eval(t, it, "x").Value); got != "6" {
		t.Fatalf("x = %s", got)
	}
}
