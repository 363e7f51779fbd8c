package cell

import (
	"go/parser"
	"go/scanner"
	"go/token"
	"strings"
)

type chunkKind int

const (
	importChunk chunkKind = iota
	declChunk             // func, method, type, const, var at the top level
	stmtChunk             // any other statement
)

// chunk is one top-level declaration or statement of a cell.
type chunk struct {
	src       string
	kind      chunkKind
	line, col int  // 1-based position of the chunk's first character in the cell
	expr      bool // a statement that is an expression (its value is shown)
	funcName  string
}

// wrapPrefix is how many characters the interpreter puts before the chunk on its first line
// ("package main;" for declarations, "package main; func main() {" for statements).
func (c chunk) wrapPrefix() int {
	if c.kind == stmtChunk {
		return len("package main; func main() {") + len(c.evalSrc()) - len(c.src)
	}
	return len("package main;")
}

// evalSrc is the source handed to the interpreter. A statement that starts with a function
// literal gets an empty statement in front: given "func(){...}()" first, the interpreter
// tries it as a declaration and runs the call twice.
func (c chunk) evalSrc() string {
	if c.kind == stmtChunk && strings.HasPrefix(c.src, "func") {
		return ";" + c.src
	}
	return c.src
}

// splitCell splits a cell into its top-level chunks, in order. A scanning error is returned
// with the position in the cell.
func splitCell(src string) ([]chunk, error) {
	fset := token.NewFileSet()
	f := fset.AddFile("cell", -1, len(src))
	var errs scanner.ErrorList
	var s scanner.Scanner
	s.Init(f, []byte(src), func(pos token.Position, msg string) { errs.Add(pos, msg) }, 0)

	type tok struct {
		t   token.Token
		off int
		lit string
	}
	var (
		chunks []chunk
		cur    []tok
		depth  int
		header bool // inside the header of a for, if or switch at the top level
	)
	flush := func(end int) {
		if len(cur) == 0 {
			return
		}
		start := cur[0].off
		text := strings.TrimRight(src[start:end], " \t\r\n;")
		p := f.Position(f.Pos(start))
		c := chunk{src: text, line: p.Line, col: p.Column}
		toks := make([]token.Token, len(cur))
		for i, t := range cur {
			toks[i] = t.t
		}
		c.kind = classify(toks)
		if c.kind == declChunk && cur[0].t == token.FUNC && len(cur) > 1 && cur[1].t == token.IDENT {
			c.funcName = cur[1].lit
		}
		if c.kind == stmtChunk {
			if _, err := parser.ParseExpr(text); err == nil {
				c.expr = true
			}
		}
		chunks = append(chunks, c)
		cur = cur[:0]
	}
	for {
		pos, t, lit := s.Scan()
		off := f.Offset(pos)
		if t == token.EOF {
			flush(len(src))
			break
		}
		switch t {
		case token.FOR, token.IF, token.SWITCH:
			if depth == 0 {
				header = true // "for i := 0; i < n; i++ {": these semicolons do not end it
			}
		case token.LBRACE:
			if depth == 0 {
				header = false
			}
			depth++
		case token.LPAREN, token.LBRACK:
			depth++
		case token.RPAREN, token.RBRACE, token.RBRACK:
			depth--
		case token.SEMICOLON:
			if depth <= 0 && !header {
				flush(off)
				continue
			}
		}
		cur = append(cur, tok{t, off, lit})
	}
	if errs.Len() > 0 {
		errs.Sort()
		return nil, errs.Err()
	}
	return chunks, nil
}

// classify tells a declaration from a statement by its first tokens.
func classify(toks []token.Token) chunkKind {
	switch toks[0] {
	case token.IMPORT:
		return importChunk
	case token.TYPE, token.CONST, token.VAR:
		return declChunk
	case token.FUNC:
		if len(toks) > 1 && toks[1] == token.IDENT {
			return declChunk
		}
		if len(toks) > 1 && toks[1] == token.LPAREN {
			// func (r T) Name(...) is a method; func(...) {...}(...) is a literal.
			d := 0
			for i := 1; i < len(toks); i++ {
				switch toks[i] {
				case token.LPAREN:
					d++
				case token.RPAREN:
					d--
					if d == 0 {
						if i+1 < len(toks) && toks[i+1] == token.IDENT {
							return declChunk
						}
						return stmtChunk
					}
				}
			}
		}
	}
	return stmtChunk
}

// IsComplete reports whether src is a complete cell: brackets balanced, strings and comments
// closed, and not ending in an operator or comma that asks for more. A front-end reads more
// lines while it is false.
func IsComplete(src string) bool {
	if strings.TrimSpace(src) == "" {
		return true
	}
	fset := token.NewFileSet()
	f := fset.AddFile("cell", -1, len(src))
	unterminated := false
	var s scanner.Scanner
	s.Init(f, []byte(src), func(_ token.Position, msg string) {
		if strings.Contains(msg, "not terminated") {
			unterminated = true
		}
	}, scanner.ScanComments)
	depth := 0
	last := token.ILLEGAL
	for {
		_, t, lit := s.Scan()
		if t == token.EOF {
			break
		}
		switch t {
		case token.LPAREN, token.LBRACE, token.LBRACK:
			depth++
		case token.RPAREN, token.RBRACE, token.RBRACK:
			depth--
		case token.COMMENT:
			continue
		}
		if t == token.SEMICOLON && lit == "\n" {
			continue
		}
		last = t
	}
	if unterminated || depth > 0 {
		return false
	}
	switch {
	case last.IsOperator() && last != token.RPAREN && last != token.RBRACE && last != token.RBRACK &&
		last != token.INC && last != token.DEC && last != token.SEMICOLON && last != token.ELLIPSIS:
		// a binary operator, comma, dot, colon, assignment or opening: the line goes on
		return false
	}
	return true
}

// Definitions returns the imports and the function, method, type and constant declarations
// of a cell (its command lines and other statements left out), for a new interpreter to
// replay: they have no effects of their own, unlike variables' initialisers and statements.
func Definitions(src string) string {
	var code strings.Builder
	for _, line := range strings.Split(src, "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, ":") || strings.HasPrefix(t, "%") {
			code.WriteString("\n")
			continue
		}
		code.WriteString(line + "\n")
	}
	chunks, err := splitCell(code.String())
	if err != nil {
		return ""
	}
	var out []string
	for _, c := range chunks {
		switch {
		case c.kind == importChunk:
			out = append(out, c.src)
		case c.kind == declChunk && !strings.HasPrefix(strings.TrimSpace(c.src), "var"):
			out = append(out, c.src)
		}
	}
	return strings.Join(out, "\n")
}
