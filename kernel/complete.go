package kernel

import (
	"go/scanner"
	"go/token"
	"strings"
)

// IsCompleteGo says whether Go source typed into a cell is complete: "incomplete" while a
// bracket, brace or raw string is open (with a tab of indent per open level), "invalid" when a
// closing bracket does not match, "complete" otherwise. Lines starting with % (magics) are
// complete.
func IsCompleteGo(code string) (status, indent string) {
	if strings.TrimSpace(code) == "" {
		return "complete", ""
	}
	if strings.HasPrefix(strings.TrimSpace(code), "%") && !strings.Contains(strings.TrimSpace(code), "\n") {
		return "complete", ""
	}
	var (
		s       scanner.Scanner
		stack   []token.Token
		invalid bool
		open    bool // unterminated string or comment
	)
	fset := token.NewFileSet()
	src := []byte(code)
	file := fset.AddFile("cell", -1, len(src))
	s.Init(file, src, func(_ token.Position, msg string) {
		if strings.Contains(msg, "not terminated") {
			open = true
		} else {
			invalid = true
		}
	}, scanner.ScanComments)
	for {
		_, tok, _ := s.Scan()
		if tok == token.EOF {
			break
		}
		switch tok {
		case token.LPAREN, token.LBRACE, token.LBRACK:
			stack = append(stack, tok)
		case token.RPAREN, token.RBRACE, token.RBRACK:
			want := map[token.Token]token.Token{token.RPAREN: token.LPAREN, token.RBRACE: token.LBRACE, token.RBRACK: token.LBRACK}[tok]
			if len(stack) == 0 || stack[len(stack)-1] != want {
				return "invalid", ""
			}
			stack = stack[:len(stack)-1]
		}
	}
	switch {
	case open:
		return "incomplete", ""
	case len(stack) > 0:
		return "incomplete", strings.Repeat("\t", len(stack))
	case invalid:
		return "invalid", ""
	}
	return "complete", ""
}
