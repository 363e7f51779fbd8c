package cell

import (
	"bytes"
	"go/token"
	"io"
	"regexp"
	"strconv"
	"sync"
)

func tokenFset() *token.FileSet { return token.NewFileSet() }

// switchWriter forwards to a writer that changes between evaluations (the interpreter's
// standard streams are fixed when it is created).
type switchWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *switchWriter) set(w io.Writer) {
	s.mu.Lock()
	s.w = w
	s.mu.Unlock()
}

func (s *switchWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.w == nil {
		return len(p), nil
	}
	return s.w.Write(p)
}

// teeWriter writes to buf and, when live is not nil, to live.
func teeWriter(buf *bytes.Buffer, live io.Writer) io.Writer {
	if live == nil {
		return buf
	}
	return io.MultiWriter(buf, live)
}

// panicFrame is one frame the interpreter reports while a panic unwinds.
type panicFrame struct {
	line, col int
	fn        string
}

// framePat matches the interpreter's "L:C: panic" and "L:C: panic: main.f(...)" lines.
var framePat = regexp.MustCompile(`^(\d+):(\d+): panic(?:: (.*)\(\.\.\.\))?$`)

// panicFilter takes the interpreter's panic frame lines out of standard error.
type panicFilter struct {
	mu     sync.Mutex
	out    io.Writer
	line   []byte
	frames []panicFrame
}

func (f *panicFilter) wrap(w io.Writer) io.Writer {
	f.out = w
	return f
}

func (f *panicFilter) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.line = append(f.line, p...)
	for {
		i := bytes.IndexByte(f.line, '\n')
		if i < 0 {
			break
		}
		f.emit(f.line[:i+1])
		f.line = f.line[i+1:]
	}
	return len(p), nil
}

func (f *panicFilter) emit(l []byte) {
	if m := framePat.FindSubmatch(bytes.TrimRight(l, "\r\n")); m != nil {
		line, _ := strconv.Atoi(string(m[1]))
		col, _ := strconv.Atoi(string(m[2]))
		f.frames = append(f.frames, panicFrame{line: line, col: col, fn: string(m[3])})
		return
	}
	if f.out != nil {
		f.out.Write(l)
	}
}

// flush writes a pending partial line.
func (f *panicFilter) flush() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.line) > 0 {
		f.emit(f.line)
		f.line = nil
	}
}

// take returns and forgets the frames seen.
func (f *panicFilter) take() []panicFrame {
	f.flush()
	f.mu.Lock()
	defer f.mu.Unlock()
	fr := f.frames
	f.frames = nil
	return fr
}

// reset forgets frames of panics that the cell recovered itself.
func (f *panicFilter) reset() {
	f.mu.Lock()
	f.frames = nil
	f.mu.Unlock()
}
