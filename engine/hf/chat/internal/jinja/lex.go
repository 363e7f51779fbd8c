package jinja

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// tokKind is the kind of a lexical token.
type tokKind int

const (
	tData       tokKind = iota // literal template text
	tVarBegin                  // {{
	tVarEnd                    // }}
	tBlockBegin                // {%
	tBlockEnd                  // %}
	tName
	tString
	tInt
	tFloat
	tOp // operators and punctuation, text in val
	tEOF
)

// token is one lexical token with the 1-based line it starts on.
type token struct {
	kind tokKind
	val  string
	line int
}

func (t token) String() string {
	switch t.kind {
	case tData:
		return "template text"
	case tVarBegin:
		return "'{{'"
	case tVarEnd:
		return "'}}'"
	case tBlockBegin:
		return "'{%'"
	case tBlockEnd:
		return "'%}'"
	case tEOF:
		return "end of template"
	case tString:
		return fmt.Sprintf("string %q", t.val)
	}
	return fmt.Sprintf("'%s'", t.val)
}

// SyntaxError is a template that cannot be parsed. Line is 1-based.
type SyntaxError struct {
	Line int
	Msg  string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("template syntax error: line %d: %s", e.Line, e.Msg)
}

// isPySpace reports whether r is whitespace for Python's str.isspace and \s in re.
func isPySpace(r rune) bool {
	return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f)
}

func pyRstrip(s string) string { return strings.TrimRightFunc(s, isPySpace) }

// normalizeNewlines applies Jinja's source preprocessing: every \r\n, \r and \n becomes \n, and
// one trailing newline is dropped (keep_trailing_newline=False).
func normalizeNewlines(src string) string {
	if strings.ContainsRune(src, '\r') {
		src = strings.ReplaceAll(src, "\r\n", "\n")
		src = strings.ReplaceAll(src, "\r", "\n")
	}
	return strings.TrimSuffix(src, "\n")
}

// lexer turns template source into tokens with the whitespace rules of Jinja2 configured as
// transformers configures it: trim_blocks=True, lstrip_blocks=True.
type lexer struct {
	src          string
	pos          int
	line         int
	toks         []token
	lineStarting bool // the previous match ended with a newline (Jinja's line_starting)
}

const maxTokens = 1 << 20

func lex(src string) ([]token, error) {
	lx := &lexer{src: normalizeNewlines(src), line: 1, lineStarting: true}
	if err := lx.run(); err != nil {
		return nil, err
	}
	lx.toks = append(lx.toks, token{kind: tEOF, line: lx.line})
	return lx.toks, nil
}

func (lx *lexer) emit(k tokKind, val string, line int) error {
	if len(lx.toks) >= maxTokens {
		return &SyntaxError{Line: line, Msg: "template too large (over a million tokens)"}
	}
	lx.toks = append(lx.toks, token{kind: k, val: val, line: line})
	return nil
}

// findOpener returns the index of the next "{{", "{%" or "{#" at or after i, or -1.
func (lx *lexer) findOpener(i int) int {
	for {
		j := strings.IndexByte(lx.src[i:], '{')
		if j < 0 {
			return -1
		}
		j += i
		if j+1 < len(lx.src) {
			switch lx.src[j+1] {
			case '{', '%', '#':
				return j
			}
		}
		i = j + 1
	}
}

func (lx *lexer) run() error {
	src := lx.src
	for lx.pos < len(src) {
		open := lx.findOpener(lx.pos)
		if open < 0 {
			text := src[lx.pos:]
			if err := lx.emit(tData, text, lx.line); err != nil {
				return err
			}
			lx.line += strings.Count(text, "\n")
			lx.pos = len(src)
			break
		}
		text := src[lx.pos:open]
		textLine := lx.line
		kind := src[open+1]
		sign := byte(0)
		after := open + 2
		if after < len(src) && (src[after] == '-' || src[after] == '+') {
			sign = src[after]
			after++
		}
		// raw blocks: {% raw %} ... {% endraw %}
		if kind == '%' {
			if end, ok := matchWordTag(src, after, "raw"); ok {
				text = lx.stripBefore(text, sign, true)
				if text != "" {
					if err := lx.emit(tData, text, textLine); err != nil {
						return err
					}
				}
				lx.line += strings.Count(src[lx.pos:end], "\n")
				body, next, err := lx.raw(end)
				if err != nil {
					return err
				}
				if body != "" {
					if err := lx.emit(tData, body, lx.line); err != nil {
						return err
					}
				}
				lx.line += strings.Count(src[end:next], "\n")
				lx.pos = next
				continue
			}
		}
		text = lx.stripBefore(text, sign, kind != '{')
		if text != "" {
			if err := lx.emit(tData, text, textLine); err != nil {
				return err
			}
		}
		lx.line += strings.Count(src[lx.pos:open], "\n")
		lx.pos = after
		lx.lineStarting = false
		var err error
		switch kind {
		case '#':
			err = lx.comment(open)
		case '{':
			err = lx.tag(tVarBegin, tVarEnd, "}}", open)
		case '%':
			err = lx.tag(tBlockBegin, tBlockEnd, "%}", open)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// stripBefore applies "{%-" (strip all trailing whitespace of the text) and lstrip_blocks
// (strip the spaces that precede a block or comment tag on its own line).
func (lx *lexer) stripBefore(text string, sign byte, isBlock bool) string {
	if sign == '-' {
		return pyRstrip(text)
	}
	if sign == '+' || !isBlock {
		return text
	}
	lpos := strings.LastIndexByte(text, '\n') + 1
	if lpos > 0 || lx.lineStarting {
		rest := text[lpos:]
		if rest != "" && strings.TrimLeftFunc(rest, isPySpace) == "" {
			return text[:lpos]
		}
	}
	return text
}

// matchWordTag reports whether src[i:] is whitespace, word, optional sign and "%}"; it returns
// the index just past "%}".
func matchWordTag(src string, i int, word string) (int, bool) {
	j := i
	for j < len(src) && isPySpaceByte(src[j]) {
		j++
	}
	if !strings.HasPrefix(src[j:], word) {
		return 0, false
	}
	j += len(word)
	if j < len(src) && (isNameByte(src[j])) {
		return 0, false
	}
	for j < len(src) && isPySpaceByte(src[j]) {
		j++
	}
	if j < len(src) && (src[j] == '-' || src[j] == '+') {
		j++
	}
	if strings.HasPrefix(src[j:], "%}") {
		return j + 2, true
	}
	return 0, false
}

func isPySpaceByte(b byte) bool {
	return b == ' ' || b == '\t' || b == '\n' || b == '\r' || b == '\f' || b == '\v'
}

func isNameByte(b byte) bool {
	return b == '_' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b >= 0x80
}

// raw scans the body of a raw block starting at i; it returns the body text and the index just
// past the closing {% endraw %} tag, with its whitespace control applied.
func (lx *lexer) raw(i int) (string, int, error) {
	src := lx.src
	// whitespace control of the opening tag's end: "-%}" strips following whitespace;
	// trim_blocks does not apply after {% raw %}.
	if i >= 3 && src[i-3] == '-' {
		for i < len(src) && isPySpaceByte(src[i]) {
			i++
		}
	}
	for j := i; ; {
		k := strings.Index(src[j:], "{%")
		if k < 0 {
			return "", 0, &SyntaxError{Line: lx.line, Msg: "raw block is not closed: add {% endraw %}"}
		}
		k += j
		after := k + 2
		sign := byte(0)
		if after < len(src) && (src[after] == '-' || src[after] == '+') {
			sign = src[after]
			after++
		}
		if end, ok := matchWordTag(src, after, "endraw"); ok {
			body := src[i:k]
			if sign == '-' {
				body = pyRstrip(body)
			} else if sign != '+' {
				lpos := strings.LastIndexByte(body, '\n') + 1
				if lpos > 0 {
					if rest := body[lpos:]; rest != "" && strings.TrimLeftFunc(rest, isPySpace) == "" {
						body = body[:lpos]
					}
				}
			}
			lx.lineStarting = false
			if src[end-3] == '-' {
				for end < len(src) && isPySpaceByte(src[end]) {
					end++
				}
			} else if src[end-3] != '+' && end < len(src) && src[end] == '\n' {
				end++
				lx.lineStarting = true
			}
			return body, end, nil
		}
		j = k + 2
	}
}

// comment skips a {# ... #} comment; the lexer sits just after the opener.
func (lx *lexer) comment(open int) error {
	src := lx.src
	k := strings.Index(src[lx.pos:], "#}")
	if k < 0 {
		return &SyntaxError{Line: lx.line, Msg: "comment is not closed: add #}"}
	}
	k += lx.pos
	end := k + 2
	lx.line += strings.Count(src[lx.pos:end], "\n")
	switch {
	case k > lx.pos && src[k-1] == '-':
		end = lx.skipSpace(end)
	case k > lx.pos && src[k-1] == '+':
	default:
		if end < len(src) && src[end] == '\n' {
			end++
			lx.line++
		}
	}
	lx.lineStarting = end > 0 && src[end-1] == '\n'
	lx.pos = end
	return nil
}

// skipSpace skips Python whitespace from i, counting lines.
func (lx *lexer) skipSpace(i int) int {
	for i < len(lx.src) {
		r, n := utf8.DecodeRuneInString(lx.src[i:])
		if !isPySpace(r) {
			break
		}
		if r == '\n' {
			lx.line++
		}
		i += n
	}
	return i
}

// tag lexes the expression tokens of a {{ }} or {% %} tag up to its closer.
func (lx *lexer) tag(begin, end tokKind, closer string, open int) error {
	src := lx.src
	startLine := lx.line
	if err := lx.emit(begin, "", startLine); err != nil {
		return err
	}
	depth := 0
	for {
		// skip whitespace inside the tag
		for lx.pos < len(src) && isPySpaceByte(src[lx.pos]) {
			if src[lx.pos] == '\n' {
				lx.line++
			}
			lx.pos++
		}
		if lx.pos >= len(src) {
			what := "expression"
			if begin == tBlockBegin {
				what = "statement"
			}
			return &SyntaxError{Line: startLine, Msg: fmt.Sprintf("%s tag opened here is not closed with %q", what, closer)}
		}
		rest := src[lx.pos:]
		if depth == 0 {
			trimAfter, keepNewline, n := false, false, 0
			switch {
			case strings.HasPrefix(rest, "-"+closer):
				trimAfter, n = true, 3
			case strings.HasPrefix(rest, "+"+closer) && begin == tBlockBegin:
				keepNewline, n = true, 3
			case strings.HasPrefix(rest, closer):
				n = 2
			}
			if n > 0 {
				if err := lx.emit(end, "", lx.line); err != nil {
					return err
				}
				lx.pos += n
				switch {
				case trimAfter:
					lx.pos = lx.skipSpace(lx.pos)
				case begin == tBlockBegin && !keepNewline && lx.pos < len(src) && src[lx.pos] == '\n':
					lx.pos++
					lx.line++
				}
				lx.lineStarting = lx.pos > 0 && src[lx.pos-1] == '\n'
				return nil
			}
		}
		c := rest[0]
		switch {
		case c == '\'' || c == '"':
			s, n, err := lexString(rest)
			if err != nil {
				return &SyntaxError{Line: lx.line, Msg: err.Error()}
			}
			if err := lx.emit(tString, s, lx.line); err != nil {
				return err
			}
			lx.line += strings.Count(rest[:n], "\n")
			lx.pos += n
		case c >= '0' && c <= '9':
			kind, text, n := lexNumber(rest)
			if err := lx.emit(kind, text, lx.line); err != nil {
				return err
			}
			lx.pos += n
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80:
			n := 0
			for n < len(rest) {
				r, sz := utf8.DecodeRuneInString(rest[n:])
				if r == '_' || unicode.IsLetter(r) || (n > 0 && (unicode.IsDigit(r) || unicode.IsMark(r))) {
					n += sz
					continue
				}
				break
			}
			if n == 0 {
				r, _ := utf8.DecodeRuneInString(rest)
				return &SyntaxError{Line: lx.line, Msg: fmt.Sprintf("unexpected character %q", r)}
			}
			if err := lx.emit(tName, rest[:n], lx.line); err != nil {
				return err
			}
			lx.pos += n
		default:
			op := ""
			for _, cand := range []string{"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"} {
				if strings.HasPrefix(rest, cand) {
					op = cand
					break
				}
			}
			if op == "" {
				r, _ := utf8.DecodeRuneInString(rest)
				return &SyntaxError{Line: lx.line, Msg: fmt.Sprintf("unexpected character %q", r)}
			}
			switch op {
			case "(", "[", "{":
				depth++
			case ")", "]", "}":
				if depth > 0 {
					depth--
				}
			}
			if err := lx.emit(tOp, op, lx.line); err != nil {
				return err
			}
			lx.pos += len(op)
		}
	}
}

// lexNumber scans an integer or float literal (underscores allowed between digits).
func lexNumber(s string) (tokKind, string, int) {
	n := 0
	digits := func() {
		for n < len(s) && (s[n] >= '0' && s[n] <= '9' || (s[n] == '_' && n > 0 && n+1 < len(s) && s[n+1] >= '0' && s[n+1] <= '9')) {
			n++
		}
	}
	digits()
	kind := tInt
	if n+1 < len(s) && s[n] == '.' && s[n+1] >= '0' && s[n+1] <= '9' {
		n++
		digits()
		kind = tFloat
	}
	if n < len(s) && (s[n] == 'e' || s[n] == 'E') {
		m := n + 1
		if m < len(s) && (s[m] == '+' || s[m] == '-') {
			m++
		}
		if m < len(s) && s[m] >= '0' && s[m] <= '9' {
			n = m
			digits()
			kind = tFloat
		}
	}
	return kind, strings.ReplaceAll(s[:n], "_", ""), n
}

// lexString scans a quoted string literal and decodes Python escapes as Jinja does.
func lexString(s string) (string, int, error) {
	q := s[0]
	var b strings.Builder
	i := 1
	for i < len(s) {
		c := s[i]
		if c == q {
			return b.String(), i + 1, nil
		}
		if c != '\\' || i+1 >= len(s) {
			b.WriteByte(c)
			i++
			continue
		}
		e := s[i+1]
		i += 2
		switch e {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case '\\':
			b.WriteByte('\\')
		case '\'':
			b.WriteByte('\'')
		case '"':
			b.WriteByte('"')
		case 'a':
			b.WriteByte('\a')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'v':
			b.WriteByte('\v')
		case '0', '1', '2', '3', '4', '5', '6', '7':
			v, n := int(e-'0'), 0
			for n < 2 && i < len(s) && s[i] >= '0' && s[i] <= '7' {
				v = v*8 + int(s[i]-'0')
				i++
				n++
			}
			b.WriteRune(rune(v))
		case '\n':
			// line continuation
		case 'x', 'u', 'U':
			width := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if i+width > len(s) {
				return "", 0, fmt.Errorf("truncated \\%c escape in string literal", e)
			}
			var v rune
			for _, h := range s[i : i+width] {
				d := hexDigit(byte(h))
				if d < 0 {
					return "", 0, fmt.Errorf("bad \\%c escape in string literal", e)
				}
				v = v*16 + rune(d)
			}
			if v > unicode.MaxRune {
				return "", 0, fmt.Errorf("bad \\%c escape in string literal", e)
			}
			b.WriteRune(v)
			i += width
		default:
			b.WriteByte('\\')
			b.WriteByte(e)
		}
	}
	return "", 0, fmt.Errorf("string literal is not closed")
}

func hexDigit(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
