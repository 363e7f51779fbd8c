package jinja

import (
	"fmt"
	"strconv"
	"strings"
)

// parser builds the AST from tokens, following the grammar and precedence of Jinja2's parser.
type parser struct {
	toks  []token
	pos   int
	depth int
}

const maxNesting = 200

func parse(src string) ([]node, error) {
	toks, err := lex(src)
	if err != nil {
		return nil, err
	}
	p := &parser{toks: toks}
	var body []node
	err = catchSyntax(func() {
		var end string
		body, end = p.subparse(nil)
		if end != "" {
			p.fail(fmt.Sprintf("unexpected '%s'", end))
		}
	})
	if err == nil {
		err = checkNames(body)
	}
	if err == nil {
		foldNodes(body)
	}
	return body, err
}

type syntaxPanic struct{ err *SyntaxError }

func catchSyntax(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			sp, ok := r.(syntaxPanic)
			if !ok {
				panic(r)
			}
			err = sp.err
		}
	}()
	f()
	return nil
}

func (p *parser) cur() token  { return p.toks[p.pos] }
func (p *parser) peek() token { return p.toks[min(p.pos+1, len(p.toks)-1)] }
func (p *parser) next() token {
	t := p.toks[p.pos]
	if p.pos < len(p.toks)-1 {
		p.pos++
	}
	return t
}

func (p *parser) fail(msg string) {
	panic(syntaxPanic{&SyntaxError{Line: p.cur().line, Msg: msg}})
}

func (p *parser) isOp(op string) bool  { t := p.cur(); return t.kind == tOp && t.val == op }
func (p *parser) isName(n string) bool { t := p.cur(); return t.kind == tName && t.val == n }
func (p *parser) skipOp(op string) bool {
	ok := p.isOp(op)
	if ok {
		p.next()
	}
	return ok
}
func (p *parser) skipName(n string) bool {
	ok := p.isName(n)
	if ok {
		p.next()
	}
	return ok
}

func (p *parser) expectOp(op string) {
	if !p.skipOp(op) {
		p.fail(fmt.Sprintf("expected '%s', got %s", op, p.cur()))
	}
}

func (p *parser) expectKind(k tokKind, what string) token {
	if p.cur().kind != k {
		p.fail(fmt.Sprintf("expected %s, got %s", what, p.cur()))
	}
	return p.next()
}

func (p *parser) expectName() string { return p.expectKind(tName, "a name").val }

func (p *parser) enter() {
	p.depth++
	if p.depth > maxNesting {
		p.fail("template nests too deeply")
	}
}
func (p *parser) leave() { p.depth-- }

// subparse parses nodes until a block tag whose keyword is in ends (returned, with the parser
// positioned just after the keyword) or the end of the template ("").
func (p *parser) subparse(ends []string) ([]node, string) {
	p.enter()
	defer p.leave()
	var body []node
	for {
		t := p.cur()
		switch t.kind {
		case tEOF:
			if len(ends) > 0 {
				p.fail(fmt.Sprintf("unexpected end of template: expected one of %v", ends))
			}
			return body, ""
		case tData:
			p.next()
			body = append(body, &textNode{text: t.val})
		case tVarBegin:
			p.next()
			e := p.parseTuple(false, true)
			p.expectKind(tVarEnd, "'}}'")
			body = append(body, &outputNode{expr: e, line: t.line})
		case tBlockBegin:
			p.next()
			kw := p.cur()
			if kw.kind != tName {
				p.fail(fmt.Sprintf("expected a statement name, got %s", kw))
			}
			for _, e := range ends {
				if kw.val == e {
					p.next()
					return body, e
				}
			}
			body = append(body, p.statement())
		default:
			p.fail(fmt.Sprintf("unexpected %s", t))
		}
	}
}

func (p *parser) endBlock() { p.expectKind(tBlockEnd, "'%}'") }

func (p *parser) statement() node {
	kw := p.next()
	switch kw.val {
	case "if":
		return p.parseIf()
	case "for":
		return p.parseFor(kw.line)
	case "set":
		return p.parseSet(kw.line)
	case "macro":
		return p.parseMacro()
	case "call":
		return p.parseCallBlock(kw.line)
	case "filter":
		fs := p.parseFilterChain()
		p.endBlock()
		body, _ := p.subparse([]string{"endfilter"})
		p.endBlock()
		return &filterBlockNode{filters: fs, body: body}
	case "with":
		return p.parseWith()
	case "break":
		p.endBlock()
		return &breakNode{}
	case "continue":
		p.endBlock()
		return &continueNode{}
	case "generation":
		p.endBlock()
		body, _ := p.subparse([]string{"endgeneration"})
		p.endBlock()
		return &generationNode{body: body}
	case "raw":
		p.fail("raw block tags must be written as {% raw %}")
	case "include", "import", "from", "extends", "block":
		p.fail(fmt.Sprintf("'%s' is not supported in chat templates (a chat template is a single file)", kw.val))
	}
	p.pos--
	switch kw.val {
	case "endif", "endfor", "endset", "endmacro", "endcall", "endfilter", "endwith", "endgeneration", "endraw", "else", "elif":
		p.fail(fmt.Sprintf("unexpected '%s': no open block to end", kw.val))
	}
	p.fail(fmt.Sprintf("unknown statement '%s'", kw.val))
	return nil
}

func (p *parser) parseIf() node {
	n := &ifNode{}
	for {
		cond := p.parseTuple(false, true)
		p.endBlock()
		body, end := p.subparse([]string{"elif", "else", "endif"})
		n.conds = append(n.conds, cond)
		n.bodies = append(n.bodies, body)
		switch end {
		case "elif":
			continue
		case "else":
			p.endBlock()
			n.orelse, _ = p.subparse([]string{"endif"})
		}
		p.endBlock()
		return n
	}
}

func (p *parser) parseFor(line int) node {
	n := &forNode{line: line}
	n.target = p.parseAssignTarget(false)
	if !p.skipName("in") {
		p.fail(fmt.Sprintf("expected 'in' in for loop, got %s", p.cur()))
	}
	n.iter = p.parseTuple(false, false, "recursive")
	if p.skipName("if") {
		n.cond = p.parseExpression(true)
	}
	if p.skipName("recursive") {
		n.recursive = true
	}
	p.endBlock()
	var end string
	n.body, end = p.subparse([]string{"else", "endfor"})
	if end == "else" {
		p.endBlock()
		n.orelse, _ = p.subparse([]string{"endfor"})
	}
	p.endBlock()
	return n
}

func (p *parser) parseSet(line int) node {
	target := p.parseAssignTarget(true)
	if p.skipOp("=") {
		v := p.parseTuple(false, true)
		p.endBlock()
		return &setNode{target: target, value: v, line: line}
	}
	n := &setBlockNode{target: target, line: line}
	if p.isOp("|") {
		n.filters = p.parseFilterChain()
	}
	p.endBlock()
	n.body, _ = p.subparse([]string{"endset"})
	p.endBlock()
	return n
}

// parseFilterChain parses "name(args) | name2 ..." as used by filter blocks and set blocks.
func (p *parser) parseFilterChain() []*filterExpr {
	var fs []*filterExpr
	p.skipOp("|")
	for {
		fs = append(fs, p.parseFilterCall(nil))
		if !p.skipOp("|") {
			return fs
		}
	}
}

func (p *parser) parseAssignTarget(withNamespace bool) expr {
	one := func() expr {
		name := p.expectName()
		if withNamespace && p.isOp(".") {
			p.next()
			return &nsAttrExpr{name: name, attr: p.expectName()}
		}
		return &nameExpr{name: name, line: p.cur().line}
	}
	if p.skipOp("(") {
		var items []expr
		for !p.isOp(")") {
			items = append(items, one())
			if !p.skipOp(",") {
				break
			}
		}
		p.expectOp(")")
		return &tupleExpr{items: items}
	}
	first := one()
	if !p.isOp(",") {
		return first
	}
	items := []expr{first}
	for p.skipOp(",") {
		if p.cur().kind != tName || p.isName("in") {
			break
		}
		items = append(items, one())
	}
	return &tupleExpr{items: items}
}

func (p *parser) parseSignature() ([]string, []expr) {
	var params []string
	var defaults []expr
	p.expectOp("(")
	for !p.isOp(")") {
		name := p.expectName()
		params = append(params, name)
		if p.skipOp("=") {
			defaults = append(defaults, p.parseExpression(true))
		} else if len(defaults) > 0 {
			p.fail(fmt.Sprintf("parameter %q without a default follows one with a default", name))
		}
		if !p.skipOp(",") {
			break
		}
	}
	p.expectOp(")")
	return params, defaults
}

func (p *parser) parseMacro() node {
	n := &macroNode{name: p.expectName()}
	n.params, n.defaults = p.parseSignature()
	p.endBlock()
	n.body, _ = p.subparse([]string{"endmacro"})
	p.endBlock()
	return n
}

func (p *parser) parseCallBlock(line int) node {
	n := &callBlockNode{line: line}
	if p.isOp("(") {
		n.params, n.defaults = p.parseSignature()
	}
	e := p.parseExpression(true)
	c, ok := e.(*callExpr)
	if !ok {
		p.fail("expected a macro call after 'call'")
	}
	n.call = c
	p.endBlock()
	n.body, _ = p.subparse([]string{"endcall"})
	p.endBlock()
	return n
}

func (p *parser) parseWith() node {
	n := &withNode{}
	for p.cur().kind != tBlockEnd {
		if len(n.targets) > 0 {
			p.expectOp(",")
		}
		n.targets = append(n.targets, p.parseAssignTarget(false))
		p.expectOp("=")
		n.values = append(n.values, p.parseExpression(true))
	}
	p.endBlock()
	n.body, _ = p.subparse([]string{"endwith"})
	p.endBlock()
	return n
}

// parseTuple parses one expression, or a tuple when commas separate several. Names in
// extraEnd stop the tuple (the "recursive" of a for loop).
func (p *parser) parseTuple(explicitParens, withCond bool, extraEnd ...string) expr {
	var items []expr
	isTuple := false
	for {
		if len(items) > 0 {
			if !p.skipOp(",") {
				break
			}
			isTuple = true
		}
		if p.tupleEnds(extraEnd) {
			break
		}
		if withCond {
			items = append(items, p.parseExpression(true))
		} else {
			items = append(items, p.parseOr())
		}
		if !p.isOp(",") {
			break
		}
	}
	if !isTuple && len(items) == 1 && !p.isOp(",") {
		return items[0]
	}
	if len(items) == 0 && !explicitParens {
		p.fail(fmt.Sprintf("expected an expression, got %s", p.cur()))
	}
	return &tupleExpr{items: items}
}

func (p *parser) tupleEnds(extra []string) bool {
	t := p.cur()
	switch t.kind {
	case tVarEnd, tBlockEnd, tEOF:
		return true
	case tOp:
		return t.val == ")" || t.val == "]" || t.val == "}"
	case tName:
		if t.val == "in" || t.val == "if" {
			return false
		}
		for _, e := range extra {
			if t.val == e {
				return true
			}
		}
	}
	return false
}

func (p *parser) parseExpression(withCond bool) expr {
	p.enter()
	defer p.leave()
	if !withCond {
		return p.parseOr()
	}
	e := p.parseOr()
	for p.isName("if") {
		p.next()
		cond := p.parseOr()
		var orelse expr
		if p.skipName("else") {
			orelse = p.parseExpression(true)
		}
		e = &condExpr{cond: cond, then: e, orelse: orelse}
	}
	return e
}

func (p *parser) parseOr() expr {
	l := p.parseAnd()
	for p.isName("or") {
		line := p.next().line
		l = &binExpr{op: "or", l: l, r: p.parseAnd(), line: line}
	}
	return l
}

func (p *parser) parseAnd() expr {
	l := p.parseNot()
	for p.isName("and") {
		line := p.next().line
		l = &binExpr{op: "and", l: l, r: p.parseNot(), line: line}
	}
	return l
}

func (p *parser) parseNot() expr {
	if p.isName("not") {
		line := p.next().line
		p.enter()
		defer p.leave()
		return &unaryExpr{op: "not", x: p.parseNot(), line: line}
	}
	return p.parseCompare()
}

func (p *parser) parseCompare() expr {
	line := p.cur().line
	first := p.parseMath1()
	c := &compareExpr{first: first, line: line}
	for {
		t := p.cur()
		switch {
		case t.kind == tOp && (t.val == "==" || t.val == "!=" || t.val == "<" || t.val == "<=" || t.val == ">" || t.val == ">="):
			p.next()
			c.ops = append(c.ops, t.val)
		case t.kind == tName && t.val == "in":
			p.next()
			c.ops = append(c.ops, "in")
		case t.kind == tName && t.val == "not" && p.peek().kind == tName && p.peek().val == "in":
			p.next()
			p.next()
			c.ops = append(c.ops, "notin")
		default:
			if len(c.ops) == 0 {
				return first
			}
			return c
		}
		c.rest = append(c.rest, p.parseMath1())
	}
}

func (p *parser) parseMath1() expr {
	l := p.parseConcat()
	for p.isOp("+") || p.isOp("-") {
		t := p.next()
		l = &binExpr{op: t.val, l: l, r: p.parseConcat(), line: t.line}
	}
	return l
}

func (p *parser) parseConcat() expr {
	l := p.parseMath2()
	for p.isOp("~") {
		t := p.next()
		l = &binExpr{op: "~", l: l, r: p.parseMath2(), line: t.line}
	}
	return l
}

func (p *parser) parseMath2() expr {
	l := p.parsePow()
	for p.isOp("*") || p.isOp("/") || p.isOp("//") || p.isOp("%") {
		t := p.next()
		l = &binExpr{op: t.val, l: l, r: p.parsePow(), line: t.line}
	}
	return l
}

func (p *parser) parsePow() expr {
	l := p.parseUnary(true)
	for p.isOp("**") {
		t := p.next()
		l = &binExpr{op: "**", l: l, r: p.parseUnary(true), line: t.line}
	}
	return l
}

func (p *parser) parseUnary(withFilter bool) expr {
	p.enter()
	defer p.leave()
	var e expr
	t := p.cur()
	switch {
	case t.kind == tOp && t.val == "-":
		p.next()
		e = &unaryExpr{op: "-", x: p.parseUnary(false), line: t.line}
	case t.kind == tOp && t.val == "+":
		p.next()
		e = &unaryExpr{op: "+", x: p.parseUnary(false), line: t.line}
	default:
		e = p.parsePrimary()
	}
	e = p.parsePostfix(e)
	if withFilter {
		e = p.parseFilterExpr(e)
	}
	return e
}

func (p *parser) parsePrimary() expr {
	t := p.cur()
	switch t.kind {
	case tName:
		p.next()
		switch t.val {
		case "true", "True":
			return &constExpr{v: true}
		case "false", "False":
			return &constExpr{v: false}
		case "none", "None":
			return &constExpr{v: nil}
		}
		return &nameExpr{name: t.val, line: t.line}
	case tString:
		p.next()
		s := t.val
		for p.cur().kind == tString {
			s += p.next().val
		}
		return &constExpr{v: s}
	case tInt:
		p.next()
		v, err := strconv.ParseInt(t.val, 10, 64)
		if err != nil {
			f, ferr := strconv.ParseFloat(t.val, 64)
			if ferr != nil {
				p.fail(fmt.Sprintf("bad integer literal %s", t.val))
			}
			return &constExpr{v: f}
		}
		return &constExpr{v: v}
	case tFloat:
		p.next()
		v, err := strconv.ParseFloat(t.val, 64)
		if err != nil {
			p.fail(fmt.Sprintf("bad float literal %s", t.val))
		}
		return &constExpr{v: v}
	case tOp:
		switch t.val {
		case "(":
			p.next()
			e := p.parseTuple(true, true)
			p.expectOp(")")
			return e
		case "[":
			p.next()
			var items []expr
			for !p.isOp("]") {
				items = append(items, p.parseExpression(true))
				if !p.skipOp(",") {
					break
				}
			}
			p.expectOp("]")
			return &listExpr{items: items}
		case "{":
			p.next()
			d := &dictExpr{}
			for !p.isOp("}") {
				d.keys = append(d.keys, p.parseExpression(true))
				p.expectOp(":")
				d.values = append(d.values, p.parseExpression(true))
				if !p.skipOp(",") {
					break
				}
			}
			p.expectOp("}")
			return d
		}
	}
	p.fail(fmt.Sprintf("unexpected %s", t))
	return nil
}

func (p *parser) parsePostfix(e expr) expr {
	for {
		t := p.cur()
		if t.kind != tOp {
			return e
		}
		switch t.val {
		case ".":
			p.next()
			a := p.next()
			switch a.kind {
			case tName:
				e = &attrExpr{obj: e, attr: a.val, line: a.line}
			case tInt:
				v, _ := strconv.ParseInt(a.val, 10, 64)
				e = &itemExpr{obj: e, key: &constExpr{v: v}, line: a.line}
			default:
				p.pos--
				p.fail(fmt.Sprintf("expected an attribute name after '.', got %s", a))
			}
		case "[":
			p.next()
			var keys []expr
			for !p.isOp("]") {
				keys = append(keys, p.parseSubscript())
				if !p.skipOp(",") {
					break
				}
			}
			p.expectOp("]")
			if len(keys) == 0 {
				p.fail("empty subscript")
			}
			var key expr = keys[0]
			if len(keys) > 1 {
				key = &tupleExpr{items: keys}
			}
			e = &itemExpr{obj: e, key: key, line: t.line}
		case "(":
			e = p.parseCall(e)
		default:
			return e
		}
	}
}

func (p *parser) parseSubscript() expr {
	var parts [3]expr
	if !p.isOp(":") {
		parts[0] = p.parseExpression(true)
		if !p.isOp(":") {
			return parts[0]
		}
	}
	p.expectOp(":")
	if !p.isOp("]") && !p.isOp(",") && !p.isOp(":") {
		parts[1] = p.parseExpression(true)
	}
	if p.skipOp(":") {
		if !p.isOp("]") && !p.isOp(",") {
			parts[2] = p.parseExpression(true)
		}
	}
	return &sliceExpr{start: parts[0], stop: parts[1], step: parts[2]}
}

func (p *parser) parseCallArgs() ([]expr, []kwarg, expr, expr) {
	p.expectOp("(")
	var args []expr
	var kwargs []kwarg
	var star, dstar expr
	for !p.isOp(")") {
		switch {
		case p.isOp("**"):
			p.next()
			dstar = p.parseExpression(true)
		case p.isOp("*"):
			p.next()
			star = p.parseExpression(true)
		case p.cur().kind == tName && p.peek().kind == tOp && p.peek().val == "=":
			name := p.next().val
			p.next()
			kwargs = append(kwargs, kwarg{name: name, value: p.parseExpression(true)})
		default:
			if len(kwargs) > 0 || dstar != nil {
				p.fail("positional argument follows keyword argument")
			}
			args = append(args, p.parseExpression(true))
		}
		if !p.skipOp(",") {
			break
		}
	}
	p.expectOp(")")
	return args, kwargs, star, dstar
}

func (p *parser) parseCall(fn expr) expr {
	line := p.cur().line
	args, kwargs, star, dstar := p.parseCallArgs()
	return &callExpr{fn: fn, args: args, kwargs: kwargs, star: star, dstar: dstar, line: line}
}

func (p *parser) parseFilterCall(obj expr) *filterExpr {
	t := p.cur()
	name := p.expectName()
	for p.isOp(".") {
		p.next()
		name += "." + p.expectName()
	}
	f := &filterExpr{obj: obj, name: name, line: t.line}
	if p.isOp("(") {
		args, kwargs, _, _ := p.parseCallArgs()
		f.args, f.kwargs = args, kwargs
	}
	return f
}

func (p *parser) parseFilterExpr(e expr) expr {
	for {
		switch {
		case p.isOp("|"):
			p.next()
			e = p.parseFilterCall(e)
		case p.isName("is"):
			e = p.parseTest(e)
		case p.isOp("("):
			e = p.parseCall(e)
		default:
			return e
		}
	}
}

func (p *parser) parseTest(e expr) expr {
	line := p.next().line
	negate := p.skipName("not")
	name := p.expectName()
	for p.isOp(".") {
		p.next()
		name += "." + p.expectName()
	}
	t := &testExpr{obj: e, name: name, negate: negate, line: line}
	c := p.cur()
	switch {
	case c.kind == tOp && c.val == "(":
		args, _, _, _ := p.parseCallArgs()
		t.args = args
	case c.kind == tName && (c.val == "else" || c.val == "or" || c.val == "and"):
	case c.kind == tName || c.kind == tString || c.kind == tInt || c.kind == tFloat || (c.kind == tOp && (c.val == "[" || c.val == "{")):
		if c.kind == tName && c.val == "is" {
			p.fail("you cannot chain multiple tests with is")
		}
		arg := p.parsePrimary()
		t.args = []expr{p.parsePostfix(arg)}
	}
	return t
}

// contextFilters are the filters jinja2 does not fold at compile time (they take the context).
var contextFilters = map[string]bool{"map": true, "select": true, "reject": true, "selectattr": true, "rejectattr": true}

// isConst reports whether jinja2's compiler would fold e to a constant. It matters for one
// observable difference: a constant-folded subscript goes through the sandbox's lenient
// getitem (a failed slice is undefined), while a run-time slice is a plain Python subscript
// (a failed slice raises).
func isConst(e expr) bool {
	switch x := e.(type) {
	case nil:
		return true
	case *constExpr:
		return true
	case *listExpr:
		return allConst(x.items)
	case *tupleExpr:
		return allConst(x.items)
	case *dictExpr:
		return allConst(x.keys) && allConst(x.values)
	case *binExpr:
		if (x.op == "and" || x.op == "or") && isConst(x.l) {
			// folding short-circuits like Python's and/or
			r := &renderer{out: &strings.Builder{}, folding: true}
			l, err := r.eval(x.l, newScope(nil))
			if err != nil {
				return false
			}
			if truthy(l) == (x.op == "or") {
				return true
			}
		}
		return isConst(x.l) && isConst(x.r)
	case *unaryExpr:
		return isConst(x.x)
	case *compareExpr:
		return isConst(x.first) && allConst(x.rest)
	case *condExpr:
		// jinja2 folds the test and then only the branch it picks
		if !isConst(x.cond) {
			return false
		}
		r := &renderer{out: &strings.Builder{}, folding: true}
		c, err := r.eval(x.cond, newScope(nil))
		if err != nil {
			return false
		}
		if truthy(c) {
			return isConst(x.then)
		}
		return x.orelse != nil && isConst(x.orelse)
	case *attrExpr:
		return isConst(x.obj)
	case *itemExpr:
		return isConst(x.obj) && isConst(x.key)
	case *sliceExpr:
		return isConst(x.start) && isConst(x.stop) && isConst(x.step)
	case *filterExpr:
		if contextFilters[x.name] || len(x.kwargs) > 0 {
			return false
		}
		return isConst(x.obj) && allConst(x.args)
	case *testExpr:
		return isConst(x.obj) && allConst(x.args)
	}
	return false
}

func allConst(es []expr) bool {
	for _, e := range es {
		if !isConst(e) {
			return false
		}
	}
	return true
}
