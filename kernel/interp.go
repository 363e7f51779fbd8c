package kernel

import (
	"context"
	"fmt"
	"strings"
)

// Bundle is a MIME bundle: one value's representations keyed by MIME type. Text types
// ("text/plain", "text/html", "image/svg+xml", JSON types) are sent as strings, binary ones
// ("image/png") base64 encoded. A bundle shown to Jupyter always carries text/plain; the kernel
// adds one when it is missing.
type Bundle map[string][]byte

// Interpreter runs cells. The kernel calls it from one goroutine at a time (the shell
// goroutine), so implementations need no locking of their own for that.
type Interpreter interface {
	// Execute runs one cell. ctx is cancelled when the user interrupts the cell. Output
	// written to out while it runs reaches the notebook at once. A non-nil Bundle becomes the
	// cell's execute_result. An error becomes the cell's error output and error reply; return
	// an *Error to choose its name and traceback.
	Execute(ctx context.Context, code string, out *Output) (Bundle, error)
}

// Completer is an optional Interpreter capability: completion at a cursor (a byte offset into
// code). It returns the candidates and the byte range of code they replace.
type Completer interface {
	Complete(code string, cursor int) (matches []string, start, end int)
}

// Inspector is an optional Interpreter capability: documentation of the name at a cursor
// (detail 0 or 1). found is false when there is nothing to say.
type Inspector interface {
	Inspect(code string, cursor, detail int) (doc Bundle, found bool)
}

// CompletenessChecker is an optional Interpreter capability: whether code is complete
// ("complete", "incomplete", "invalid" or "unknown"), and the indent for the next line when it
// is incomplete. Without it the kernel uses IsCompleteGo.
type CompletenessChecker interface {
	IsComplete(code string) (status, indent string)
}

// ShutdownHook is an optional Interpreter capability, called when a shutdown_request arrives
// (restart tells whether Jupyter will start a new kernel in its place), before Close.
type ShutdownHook interface {
	Shutdown(restart bool)
}

// Error is a cell failure with a chosen name, value and traceback (the lines Jupyter shows).
type Error struct {
	Name      string
	Value     string
	Traceback []string
}

func (e *Error) Error() string { return e.Name + ": " + e.Value }

// errorContent turns any error into the ename, evalue and traceback of an error reply.
func errorContent(err error) (ename, evalue string, traceback []string) {
	if e, ok := err.(*Error); ok {
		tb := e.Traceback
		if len(tb) == 0 {
			tb = []string{e.Error()}
		}
		return e.Name, e.Value, tb
	}
	if err == context.Canceled {
		return "Interrupted", "the cell was interrupted", []string{"Interrupted: the cell was interrupted; the session goes on"}
	}
	ename = fmt.Sprintf("%T", err)
	ename = strings.TrimPrefix(ename, "*")
	if ename == "errors.errorString" || ename == "fmt.wrapError" || ename == "fmt.wrapErrors" {
		ename = "Error"
	}
	evalue = err.Error()
	tb := []string{ename + ": " + firstLine(evalue)}
	if strings.Contains(evalue, "\n") {
		tb = append(tb, strings.Split(evalue, "\n")[1:]...)
	}
	return ename, evalue, tb
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
