package jinja

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strings"
)

// Limits that keep a hostile or broken template from running away. Jinja itself has none of
// these except the sandbox's range limit; real chat templates stay far below them.
const (
	maxOutput     = 64 << 20 // bytes of rendered text
	maxCallDepth  = 500
	maxRange      = 100_000 // the sandbox's MAX_RANGE
	maxCollection = 1 << 24 // items or bytes built by one operation (string repeat, list concat)
)

// maxSteps bounds the statements, expressions and loop iterations of one render (a variable
// so that tests can lower it).
var maxSteps = 5_000_000

// scope is one frame of variables; lookups walk up to the globals.
type scope struct {
	vars   map[string]Value
	parent *scope
}

func newScope(parent *scope) *scope { return &scope{parent: parent} }

func (s *scope) set(name string, v Value) {
	if s.vars == nil {
		s.vars = make(map[string]Value, 4)
	}
	s.vars[name] = v
}

func (s *scope) lookup(name string) (Value, bool) {
	for ; s != nil; s = s.parent {
		if v, ok := s.vars[name]; ok {
			return v, true
		}
	}
	return nil, false
}

// Span is a byte range [Start, End) of rendered output.
type Span struct{ Start, End int }

// renderer executes one render.
type renderer struct {
	out        *strings.Builder
	captures   int // >0 while output is being captured (macros, set blocks, filter blocks)
	steps      int
	callDepth  int
	genSpans   []Span
	inGenerate bool
	folding    bool // evaluating an expression jinja2 folds at compile time
}

// control-flow signals for loops
var (
	errBreak    = errors.New("break")
	errContinue = errors.New("continue")
)

func (r *renderer) step() error {
	r.steps++
	if r.steps > maxSteps {
		return errorf("RuntimeError", "template ran for more than %d steps", maxSteps)
	}
	return nil
}

func (r *renderer) write(s string) error {
	if r.out.Len()+len(s) > maxOutput {
		return errorf("RuntimeError", "rendered output exceeds %d bytes", maxOutput)
	}
	r.out.WriteString(s)
	return nil
}

// capture renders body into a fresh buffer and returns the text.
func (r *renderer) capture(body []node, sc *scope) (string, error) {
	saved := r.out
	r.out = &strings.Builder{}
	r.captures++
	err := r.execBody(body, sc)
	text := r.out.String()
	r.out = saved
	r.captures--
	return text, err
}

func (r *renderer) execBody(body []node, sc *scope) error {
	for _, n := range body {
		if err := r.exec(n, sc); err != nil {
			return err
		}
	}
	return nil
}

func withLine(err error, line int) error {
	var e *Error
	if errors.As(err, &e) && e.Line == 0 && line > 0 {
		e.Line = line
	}
	return err
}

func (r *renderer) exec(n node, sc *scope) error {
	if err := r.step(); err != nil {
		return err
	}
	switch n := n.(type) {
	case *textNode:
		return r.write(n.text)
	case *outputNode:
		r.folding = n.folded
		v, err := r.eval(n.expr, sc)
		r.folding = false
		if err != nil {
			return withLine(err, n.line)
		}
		return r.write(toStr(v))
	case *ifNode:
		for i, c := range n.conds {
			v, err := r.eval(c, sc)
			if err != nil {
				return err
			}
			if truthy(v) {
				return r.execBody(n.bodies[i], sc)
			}
		}
		return r.execBody(n.orelse, sc)
	case *forNode:
		return withLine(r.execFor(n, sc), n.line)
	case *setNode:
		v, err := r.eval(n.value, sc)
		if err != nil {
			return withLine(err, n.line)
		}
		return withLine(r.assign(n.target, v, sc), n.line)
	case *setBlockNode:
		text, err := r.capture(n.body, newScope(sc)) // the body's assignments stay inside
		if err != nil {
			return err
		}
		var v Value = text
		for _, f := range n.filters {
			if v, err = r.applyFilter(f, v, sc); err != nil {
				return withLine(err, n.line)
			}
		}
		return withLine(r.assign(n.target, v, sc), n.line)
	case *macroNode:
		sc.set(n.name, &Macro{node: n, params: n.params, defs: n.defaults, body: n.body, scope: sc, name: n.name})
		return nil
	case *callBlockNode:
		caller := &Macro{params: n.params, defs: n.defaults, body: n.body, scope: sc, name: "caller"}
		v, err := r.evalCall(n.call, sc, caller)
		if err != nil {
			return withLine(err, n.line)
		}
		return r.write(toStr(v))
	case *filterBlockNode:
		text, err := r.capture(n.body, newScope(sc))
		if err != nil {
			return err
		}
		var v Value = text
		for _, f := range n.filters {
			if v, err = r.applyFilter(f, v, sc); err != nil {
				return err
			}
		}
		return r.write(toStr(v))
	case *withNode:
		inner := newScope(sc)
		for i, t := range n.targets {
			v, err := r.eval(n.values[i], sc)
			if err != nil {
				return err
			}
			if err := r.assign(t, v, inner); err != nil {
				return err
			}
		}
		return r.execBody(n.body, inner)
	case *breakNode:
		return errBreak
	case *continueNode:
		return errContinue
	case *generationNode:
		if r.captures > 0 || r.inGenerate {
			return r.execBody(n.body, sc)
		}
		start := r.out.Len()
		r.inGenerate = true
		err := r.execBody(n.body, sc)
		r.inGenerate = false
		if err == nil {
			r.genSpans = append(r.genSpans, Span{Start: start, End: r.out.Len()})
		}
		return err
	}
	return fmt.Errorf("jinja: unknown node %T", n)
}

// assign binds v to a target in scope sc.
func (r *renderer) assign(target expr, v Value, sc *scope) error {
	switch t := target.(type) {
	case *nameExpr:
		sc.set(t.name, v)
		return nil
	case *nsAttrExpr:
		obj, _ := sc.lookup(t.name)
		ns, ok := obj.(*Namespace)
		if !ok {
			return errorf("TemplateRuntimeError", "cannot assign attribute on non-namespace object")
		}
		ns.attrs.Set(t.attr, v)
		return nil
	case *tupleExpr:
		items, err := r.iterate(v)
		if err != nil {
			return err
		}
		if len(items) != len(t.items) {
			if len(items) > len(t.items) {
				return errorf("ValueError", "too many values to unpack (expected %d)", len(t.items))
			}
			return errorf("ValueError", "not enough values to unpack (expected %d, got %d)", len(t.items), len(items))
		}
		for i, it := range t.items {
			if err := r.assign(it, items[i], sc); err != nil {
				return err
			}
		}
		return nil
	}
	return errorf("TemplateSyntaxError", "cannot assign to this target")
}

// iterate returns the items a for loop over v visits.
func (r *renderer) iterate(v Value) ([]Value, error) {
	switch x := v.(type) {
	case *List:
		return x.Items, nil
	case *Dict:
		return append([]Value(nil), x.keys...), nil
	case string:
		out := make([]Value, 0, len(x))
		for _, c := range x {
			out = append(out, string(c))
		}
		return out, nil
	case *Undefined:
		return nil, nil
	case *Namespace:
		return nil, errorf("TypeError", "'Namespace' object is not iterable")
	case *cycler, *joiner:
		return nil, errorf("TypeError", "'%s' object is not iterable", typeName(v))
	}
	return nil, errorf("TypeError", "'%s' object is not iterable", typeName(v))
}

// loopObj is the `loop` variable of a for loop.
type loopObj struct {
	items []Value
	i     int
	depth int
	last  Value // for loop.changed
	seen  bool
}

func (r *renderer) execFor(n *forNode, sc *scope) error {
	if n.recursive {
		return errorf("TemplateSyntaxError", "recursive for loops are not supported")
	}
	it, err := r.eval(n.iter, sc)
	if err != nil {
		return err
	}
	items, err := r.iterate(it)
	if err != nil {
		return err
	}
	if n.cond != nil {
		var kept []Value
		for _, item := range items {
			if err := r.step(); err != nil {
				return err
			}
			inner := newScope(sc)
			if err := r.assign(n.target, item, inner); err != nil {
				return err
			}
			c, err := r.eval(n.cond, inner)
			if err != nil {
				return err
			}
			if truthy(c) {
				kept = append(kept, item)
			}
		}
		items = kept
	}
	items = append([]Value(nil), items...) // the body may not change what is iterated
	// depth only grows in recursive loops, which are not supported.
	loop := &loopObj{items: items, depth: 1}
	// jinja2 runs the else block unless some iteration reached the end of its body (a break
	// or continue in every iteration leaves it to run), in a scope of its own.
	completed := false
	for i, item := range items {
		if err := r.step(); err != nil {
			return err
		}
		loop.i = i
		inner := newScope(sc)
		inner.set("loop", loop)
		if err := r.assign(n.target, item, inner); err != nil {
			return err
		}
		err := r.execBody(n.body, inner)
		if err == errBreak {
			break
		}
		if err != nil && err != errContinue {
			return err
		}
		if err == nil {
			completed = true
		}
	}
	if !completed && len(n.orelse) > 0 {
		return r.execBody(n.orelse, newScope(sc))
	}
	return nil
}

func (l *loopObj) attr(name string) Value {
	n := len(l.items)
	switch name {
	case "index":
		return int64(l.i + 1)
	case "index0":
		return int64(l.i)
	case "revindex":
		return int64(n - l.i)
	case "revindex0":
		return int64(n - l.i - 1)
	case "first":
		return l.i == 0
	case "last":
		return l.i == n-1
	case "length":
		return int64(n)
	case "depth":
		return int64(l.depth)
	case "depth0":
		return int64(l.depth - 1)
	case "previtem":
		if l.i == 0 {
			return &Undefined{hint: "there is no previous item"}
		}
		return l.items[l.i-1]
	case "nextitem":
		if l.i == n-1 {
			return &Undefined{hint: "there is no next item"}
		}
		return l.items[l.i+1]
	case "cycle":
		return &Func{Name: "cycle", Fn: func(_ *renderer, args []Value, _ *Dict) (Value, error) {
			if len(args) == 0 {
				return nil, errorf("TypeError", "no items for cycling given")
			}
			return args[l.i%len(args)], nil
		}}
	case "changed":
		return &Func{Name: "changed", Fn: func(_ *renderer, args []Value, _ *Dict) (Value, error) {
			v := &List{Items: args}
			if l.seen && valuesEqual(l.last, v) {
				return false, nil
			}
			l.seen, l.last = true, v
			return true, nil
		}}
	}
	return &Undefined{hint: fmt.Sprintf("'LoopContext' object has no attribute '%s'", name)}
}

// eval evaluates an expression.
func (r *renderer) eval(e expr, sc *scope) (Value, error) {
	if err := r.step(); err != nil {
		return nil, err
	}
	switch e := e.(type) {
	case *constExpr:
		return e.v, nil
	case *nameExpr:
		if v, ok := sc.lookup(e.name); ok {
			return v, nil
		}
		return &Undefined{hint: fmt.Sprintf("'%s' is undefined", e.name)}, nil
	case *attrExpr:
		obj, err := r.eval(e.obj, sc)
		if err != nil {
			return nil, err
		}
		return getAttr(obj, e.attr)
	case *itemExpr:
		obj, err := r.eval(e.obj, sc)
		if err != nil {
			return nil, err
		}
		if s, ok := e.key.(*sliceExpr); ok {
			return r.evalSlice(obj, s, sc)
		}
		key, err := r.eval(e.key, sc)
		if err != nil {
			return nil, err
		}
		return getItem(obj, key)
	case *callExpr:
		return r.evalCall(e, sc, nil)
	case *filterExpr:
		obj, err := r.eval(e.obj, sc)
		if err != nil {
			return nil, err
		}
		return r.applyFilter(e, obj, sc)
	case *testExpr:
		obj, err := r.eval(e.obj, sc)
		if err != nil {
			return nil, err
		}
		args, err := r.evalList(e.args, sc)
		if err != nil {
			return nil, err
		}
		ok, err := r.runTest(e.name, obj, args)
		if err != nil {
			return nil, err
		}
		return ok != e.negate, nil
	case *binExpr:
		return r.evalBin(e, sc)
	case *unaryExpr:
		x, err := r.eval(e.x, sc)
		if err != nil {
			return nil, err
		}
		switch e.op {
		case "not":
			return !truthy(x), nil
		case "-":
			switch v := x.(type) {
			case bool, int64:
				i, _ := asInt(v)
				return -i, nil
			case float64:
				return -v, nil
			case *Undefined:
				return nil, undefinedErr(v)
			}
			return nil, errorf("TypeError", "bad operand type for unary -: '%s'", typeName(x))
		case "+":
			switch v := x.(type) {
			case bool, int64:
				i, _ := asInt(v)
				return i, nil
			case float64:
				return v, nil
			case *Undefined:
				return nil, undefinedErr(v)
			}
			return nil, errorf("TypeError", "bad operand type for unary +: '%s'", typeName(x))
		}
	case *compareExpr:
		left, err := r.eval(e.first, sc)
		if err != nil {
			return nil, err
		}
		for i, op := range e.ops {
			right, err := r.eval(e.rest[i], sc)
			if err != nil {
				return nil, err
			}
			ok, err := compareOp(op, left, right)
			if err != nil {
				return nil, err
			}
			if !ok {
				return false, nil
			}
			left = right
		}
		return true, nil
	case *condExpr:
		c, err := r.eval(e.cond, sc)
		if err != nil {
			return nil, err
		}
		if truthy(c) {
			return r.eval(e.then, sc)
		}
		if e.orelse == nil {
			return &Undefined{hint: "the inline if-expression on line evaluated to false and no else section was defined."}, nil
		}
		return r.eval(e.orelse, sc)
	case *listExpr:
		items, err := r.evalList(e.items, sc)
		if err != nil {
			return nil, err
		}
		return &List{Items: items}, nil
	case *tupleExpr:
		items, err := r.evalList(e.items, sc)
		if err != nil {
			return nil, err
		}
		return &List{Items: items, Tuple: true}, nil
	case *dictExpr:
		d := NewDict()
		for i := range e.keys {
			k, err := r.eval(e.keys[i], sc)
			if err != nil {
				return nil, err
			}
			if !hashable(k) {
				return nil, errorf("TypeError", "unhashable type: '%s'", typeName(k))
			}
			v, err := r.eval(e.values[i], sc)
			if err != nil {
				return nil, err
			}
			d.Set(k, v)
		}
		return d, nil
	}
	return nil, fmt.Errorf("jinja: unknown expression %T", e)
}

func (r *renderer) evalList(es []expr, sc *scope) ([]Value, error) {
	out := make([]Value, 0, len(es))
	for _, x := range es {
		v, err := r.eval(x, sc)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func compareOp(op string, a, b Value) (bool, error) {
	switch op {
	case "==":
		return valuesEqual(a, b), nil
	case "!=":
		return !valuesEqual(a, b), nil
	case "in":
		return contains(b, a)
	case "notin":
		ok, err := contains(b, a)
		return !ok, err
	}
	c, err := compareValues(a, b)
	if err != nil {
		return false, err
	}
	if c == 2 { // NaN
		return false, nil
	}
	switch op {
	case "<":
		return c < 0, nil
	case "<=":
		return c <= 0, nil
	case ">":
		return c > 0, nil
	case ">=":
		return c >= 0, nil
	}
	return false, fmt.Errorf("jinja: unknown comparison %s", op)
}

// contains is Python's `item in container`.
func contains(container, item Value) (bool, error) {
	switch c := container.(type) {
	case string:
		s, ok := item.(string)
		if !ok {
			if u, isU := item.(*Undefined); isU {
				return false, undefinedErr(u)
			}
			return false, errorf("TypeError", "'in <string>' requires string as left operand, not %s", typeName(item))
		}
		return strings.Contains(c, s), nil
	case *List:
		for _, it := range c.Items {
			if valuesEqual(it, item) {
				return true, nil
			}
		}
		return false, nil
	case *Dict:
		if _, u := item.(*Undefined); u {
			return false, nil // Undefined is hashable and never a key
		}
		if !hashable(item) {
			return false, errorf("TypeError", "unhashable type: '%s'", typeName(item))
		}
		_, ok := c.Get(item)
		return ok, nil
	case *Undefined:
		return false, nil
	}
	return false, errorf("TypeError", "argument of type '%s' is not iterable", typeName(container))
}

func (r *renderer) evalBin(e *binExpr, sc *scope) (Value, error) {
	l, err := r.eval(e.l, sc)
	if err != nil {
		return nil, err
	}
	switch e.op {
	case "and":
		if !truthy(l) {
			return l, nil
		}
		return r.eval(e.r, sc)
	case "or":
		if truthy(l) {
			return l, nil
		}
		return r.eval(e.r, sc)
	}
	rv, err := r.eval(e.r, sc)
	if err != nil {
		return nil, err
	}
	v, err := binaryOp(e.op, l, rv)
	return v, withLine(err, e.line)
}

func binaryOp(op string, l, rv Value) (Value, error) {
	if op == "~" {
		s := toStr(l) + toStr(rv)
		if len(s) > maxOutput {
			return nil, errorf("RuntimeError", "string too large")
		}
		return s, nil
	}
	if u, ok := l.(*Undefined); ok {
		return nil, undefinedErr(u)
	}
	if u, ok := rv.(*Undefined); ok {
		if ls, isStr := l.(string); isStr && op == "%" {
			return percentFormat(ls, u) // Undefined passes for a mapping there
		}
		return nil, undefinedErr(u)
	}
	li, lInt := asInt(l)
	ri, rInt := asInt(rv)
	lf, lNum := asNumber(l)
	rf, rNum := asNumber(rv)
	bothInt := lInt && rInt
	bothNum := lNum && rNum
	switch op {
	case "+":
		switch {
		case bothInt:
			return li + ri, nil
		case bothNum:
			return lf + rf, nil
		}
		if ls, ok := l.(string); ok {
			if rs, ok := rv.(string); ok {
				if len(ls)+len(rs) > maxOutput {
					return nil, errorf("RuntimeError", "string too large")
				}
				return ls + rs, nil
			}
			return nil, errorf("TypeError", "can only concatenate str (not \"%s\") to str", typeName(rv))
		}
		if ll, ok := l.(*List); ok {
			if rl, ok := rv.(*List); ok && rl.Tuple == ll.Tuple {
				if len(ll.Items)+len(rl.Items) > maxCollection {
					return nil, errorf("RuntimeError", "list too large")
				}
				items := append(append([]Value(nil), ll.Items...), rl.Items...)
				return &List{Items: items, Tuple: ll.Tuple}, nil
			}
			return nil, errorf("TypeError", "can only concatenate %s (not \"%s\") to %s", typeName(l), typeName(rv), typeName(l))
		}
	case "-":
		switch {
		case bothInt:
			return li - ri, nil
		case bothNum:
			return lf - rf, nil
		}
	case "*":
		switch {
		case bothInt:
			return li * ri, nil
		case bothNum:
			return lf * rf, nil
		}
		if rInt {
			if v, ok, err := repeatSeq(l, ri); ok {
				return v, err
			}
		}
		if lInt {
			if v, ok, err := repeatSeq(rv, li); ok {
				return v, err
			}
		}
	case "/":
		if bothNum {
			if rf == 0 {
				return nil, errorf("ZeroDivisionError", "division by zero")
			}
			return lf / rf, nil
		}
	case "//":
		if bothInt {
			if ri == 0 {
				return nil, errorf("ZeroDivisionError", "integer division or modulo by zero")
			}
			q := li / ri
			if (li%ri != 0) && ((li < 0) != (ri < 0)) {
				q--
			}
			return q, nil
		}
		if bothNum {
			if rf == 0 {
				return nil, errorf("ZeroDivisionError", "float floor division by zero")
			}
			return math.Floor(lf / rf), nil
		}
	case "%":
		if bothInt {
			if ri == 0 {
				return nil, errorf("ZeroDivisionError", "integer division or modulo by zero")
			}
			m := li % ri
			if m != 0 && ((m < 0) != (ri < 0)) {
				m += ri
			}
			return m, nil
		}
		if bothNum {
			if rf == 0 {
				return nil, errorf("ZeroDivisionError", "float modulo")
			}
			m := math.Mod(lf, rf)
			if m != 0 && ((m < 0) != (rf < 0)) {
				m += rf
			}
			return m, nil
		}
		if ls, ok := l.(string); ok {
			return percentFormat(ls, rv)
		}
	case "**":
		if bothInt && ri >= 0 {
			return intPow(li, ri)
		}
		if bothNum {
			return math.Pow(lf, rf), nil
		}
	}
	return nil, errorf("TypeError", "unsupported operand type(s) for %s: '%s' and '%s'", op, typeName(l), typeName(rv))
}

// repeatSeq is str * int and list * int.
func repeatSeq(v Value, n int64) (Value, bool, error) {
	if n < 0 {
		n = 0
	}
	switch x := v.(type) {
	case string:
		if x == "" {
			return "", true, nil
		}
		if int64(len(x))*n > maxOutput || n > maxOutput {
			return nil, true, errorf("RuntimeError", "string too large")
		}
		return strings.Repeat(x, int(n)), true, nil
	case *List:
		if len(x.Items) == 0 {
			return &List{Tuple: x.Tuple}, true, nil
		}
		if int64(len(x.Items))*n > maxCollection || n > maxCollection {
			return nil, true, errorf("RuntimeError", "list too large")
		}
		out := make([]Value, 0, int64(len(x.Items))*n)
		for i := int64(0); i < n; i++ {
			out = append(out, x.Items...)
		}
		return &List{Items: out, Tuple: x.Tuple}, true, nil
	}
	return nil, false, nil
}

// percentFormat implements the %s, %d, %r and %% conversions of Python's str % args.
func percentFormat(format string, arg Value) (Value, error) {
	var args []Value
	if l, ok := arg.(*List); ok && l.Tuple {
		args = l.Items
	} else {
		args = []Value{arg}
	}
	var b strings.Builder
	ai := 0
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		if i+1 >= len(format) {
			return nil, errorf("ValueError", "incomplete format")
		}
		i++
		verb := format[i]
		if verb == '%' {
			b.WriteByte('%')
			continue
		}
		if ai >= len(args) {
			return nil, errorf("TypeError", "not enough arguments for format string")
		}
		a := args[ai]
		ai++
		switch verb {
		case 's':
			b.WriteString(toStr(a))
		case 'r':
			b.WriteString(repr(a))
		case 'd', 'i':
			f, ok := asNumber(a)
			if u, isU := a.(*Undefined); isU {
				return nil, undefinedErr(u)
			}
			if !ok {
				return nil, errorf("TypeError", "%%d format: a real number is required, not %s", typeName(a))
			}
			fmt.Fprintf(&b, "%d", int64(f))
		default:
			return nil, errorf("ValueError", "unsupported format character '%c'", verb)
		}
	}
	_, isDict := arg.(*Dict)
	_, isUndef := arg.(*Undefined)
	l, isList := arg.(*List)
	mapping := isDict || isUndef || (isList && !l.Tuple) // Python skips the check for mapping-like args
	if ai < len(args) && !mapping {
		return nil, errorf("TypeError", "not all arguments converted during string formatting")
	}
	return b.String(), nil
}

func (r *renderer) evalSlice(obj Value, s *sliceExpr, sc *scope) (Value, error) {
	var idx [3]*int64
	for i, x := range []expr{s.start, s.stop, s.step} {
		if x == nil {
			continue
		}
		v, err := r.eval(x, sc)
		if err != nil {
			return nil, err
		}
		if v == nil {
			continue
		}
		n, ok := asInt(v)
		if !ok {
			return nil, errorf("TypeError", "slice indices must be integers or None")
		}
		idx[i] = &n
	}
	step := int64(1)
	if idx[2] != nil {
		step = *idx[2]
		if step == 0 {
			return nil, errorf("ValueError", "slice step cannot be zero")
		}
	}
	pick := func(n int) []int {
		start, stop := sliceBounds(idx[0], idx[1], step, int64(n))
		var out []int
		if step > 0 {
			for i := start; i < stop; i += step {
				out = append(out, int(i))
			}
		} else {
			for i := start; i > stop; i += step {
				out = append(out, int(i))
			}
		}
		return out
	}
	switch x := obj.(type) {
	case string:
		rs := []rune(x)
		var b strings.Builder
		for _, i := range pick(len(rs)) {
			b.WriteRune(rs[i])
		}
		return b.String(), nil
	case *List:
		ix := pick(len(x.Items))
		out := make([]Value, 0, len(ix))
		for _, i := range ix {
			out = append(out, x.Items[i])
		}
		return &List{Items: out, Tuple: x.Tuple}, nil
	case *Undefined:
		return nil, undefinedErr(x)
	}
	if r.folding {
		return &Undefined{hint: fmt.Sprintf("'%s' object is not subscriptable", typeName(obj))}, nil
	}
	if _, ok := obj.(*Dict); ok {
		return nil, errorf("TypeError", "unhashable type: 'slice'")
	}
	// Jinja compiles slices to a plain Python subscript, which fails on other types.
	return nil, errorf("TypeError", "'%s' object is not subscriptable", typeName(obj))
}

// sliceBounds is Python's slice.indices.
func sliceBounds(startP, stopP *int64, step, n int64) (int64, int64) {
	var start, stop int64
	if step > 0 {
		start, stop = 0, n
	} else {
		start, stop = n-1, -1
	}
	clamp := func(v int64) int64 {
		if v < 0 {
			v += n
			if v < 0 {
				if step < 0 {
					return -1
				}
				return 0
			}
		} else if v >= n {
			if step < 0 {
				return n - 1
			}
			return n
		}
		return v
	}
	if startP != nil {
		start = clamp(*startP)
	}
	if stopP != nil {
		stop = clamp(*stopP)
	}
	return start, stop
}

// getItem is Jinja's environment.getitem: obj[key], falling back to attribute lookup for
// string keys.
func getItem(obj, key Value) (Value, error) {
	switch x := obj.(type) {
	case *Undefined:
		return nil, undefinedErr(x)
	case *Dict:
		if _, u := key.(*Undefined); !u && !hashable(key) {
			return nil, errorf("TypeError", "unhashable type: '%s'", typeName(key))
		}
		if v, ok := x.Get(key); ok {
			return v, nil
		}
	case *List:
		if i, ok := asInt(key); ok {
			n := int64(len(x.Items))
			if i < 0 {
				i += n
			}
			if i >= 0 && i < n {
				return x.Items[i], nil
			}
			return &Undefined{hint: fmt.Sprintf("%s object has no element %v", typeName(obj), key)}, nil
		}
	case string:
		if i, ok := asInt(key); ok {
			rs := []rune(x)
			n := int64(len(rs))
			if i < 0 {
				i += n
			}
			if i >= 0 && i < n {
				return string(rs[i]), nil
			}
			return &Undefined{hint: fmt.Sprintf("str object has no element %v", key)}, nil
		}
	}
	if s, ok := key.(string); ok {
		v, err := getAttrOnly(obj, s)
		if err != nil || v != nil {
			return v, err
		}
	}
	if _, ok := obj.(*Dict); ok {
		return &Undefined{hint: fmt.Sprintf("'dict object' has no attribute %s", repr(key))}, nil
	}
	return &Undefined{hint: fmt.Sprintf("'%s object' has no attribute %s", typeName(obj), repr(key))}, nil
}

// getAttr is Jinja's environment.getattr: the attribute, falling back to obj[attr].
func getAttr(obj Value, attr string) (Value, error) {
	if u, ok := obj.(*Undefined); ok {
		return nil, undefinedErr(u)
	}
	v, err := getAttrOnly(obj, attr)
	if err != nil || v != nil {
		return v, err
	}
	if d, ok := obj.(*Dict); ok {
		if v, ok := d.Get(attr); ok {
			return v, nil
		}
		return &Undefined{hint: fmt.Sprintf("'dict object' has no attribute '%s'", attr)}, nil
	}
	if ns, ok := obj.(*Namespace); ok {
		if v, ok := ns.attrs.Get(attr); ok {
			return v, nil
		}
	}
	return &Undefined{hint: fmt.Sprintf("'%s object' has no attribute '%s'", typeName(obj), attr)}, nil
}

// getAttrOnly returns the Python attribute of obj (methods, loop fields), nil when there is
// none. Attributes the immutable sandbox refuses come back as an unsafe Undefined.
func getAttrOnly(obj Value, attr string) (Value, error) {
	if strings.HasPrefix(attr, "_") {
		return &Undefined{hint: fmt.Sprintf("access to attribute '%s' of '%s' object is unsafe.", attr, typeName(obj)), unsafe: true}, nil
	}
	switch x := obj.(type) {
	case string:
		if _, ok := strMethods[attr]; ok {
			return &boundMethod{recv: x, name: attr}, nil
		}
	case *List:
		switch attr {
		case "index", "count":
			return &boundMethod{recv: x, name: attr}, nil
		case "append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear":
			if !x.Tuple {
				return &Undefined{hint: fmt.Sprintf("access to attribute '%s' of 'list' object is unsafe.", attr), unsafe: true}, nil
			}
		}
	case *Dict:
		switch attr {
		case "items", "keys", "values", "get", "copy":
			return &boundMethod{recv: x, name: attr}, nil
		case "update", "pop", "popitem", "setdefault", "clear":
			return &Undefined{hint: fmt.Sprintf("access to attribute '%s' of 'dict' object is unsafe.", attr), unsafe: true}, nil
		}
	case *loopObj:
		return x.attr(attr), nil
	case *cycler:
		return x.attr(attr), nil
	}
	return nil, nil
}

// boundMethod is a Python method of a str, list or dict value.
type boundMethod struct {
	recv Value
	name string
}

// evalCall evaluates a call expression; caller is set for {% call %} blocks.
func (r *renderer) evalCall(e *callExpr, sc *scope, caller Value) (Value, error) {
	fn, err := r.eval(e.fn, sc)
	if err != nil {
		return nil, err
	}
	args, err := r.evalList(e.args, sc)
	if err != nil {
		return nil, err
	}
	kwargs := NewDict()
	for _, kw := range e.kwargs {
		v, err := r.eval(kw.value, sc)
		if err != nil {
			return nil, err
		}
		kwargs.Set(kw.name, v)
	}
	if e.star != nil {
		v, err := r.eval(e.star, sc)
		if err != nil {
			return nil, err
		}
		items, err := r.iterate(v)
		if err != nil {
			return nil, err
		}
		args = append(args, items...)
	}
	if e.dstar != nil {
		v, err := r.eval(e.dstar, sc)
		if err != nil {
			return nil, err
		}
		d, ok := v.(*Dict)
		if !ok {
			return nil, errorf("TypeError", "argument after ** must be a mapping, not %s", typeName(v))
		}
		for i, k := range d.keys {
			ks, ok := k.(string)
			if !ok {
				return nil, errorf("TypeError", "keywords must be strings")
			}
			kwargs.Set(ks, d.vals[i])
		}
	}
	if caller != nil {
		kwargs.Set("caller", caller)
	}
	v, err := r.call(fn, args, kwargs)
	return v, withLine(err, e.line)
}

// call invokes a callable value.
func (r *renderer) call(fn Value, args []Value, kwargs *Dict) (Value, error) {
	r.callDepth++
	defer func() { r.callDepth-- }()
	if r.callDepth > maxCallDepth {
		return nil, errorf("RecursionError", "maximum call depth exceeded")
	}
	switch f := fn.(type) {
	case *Func:
		return f.Fn(r, args, kwargs)
	case *boundMethod:
		return callMethod(r, f, args, kwargs)
	case *Macro:
		return r.callMacro(f, args, kwargs)
	case *joiner:
		return f.call(), nil
	case *Undefined:
		return nil, undefinedErr(f)
	}
	return nil, errorf("TypeError", "'%s' object is not callable", typeName(fn))
}

func (r *renderer) callMacro(m *Macro, args []Value, kwargs *Dict) (Value, error) {
	sc := newScope(m.scope)
	np := len(m.params)
	firstDefault := np - len(m.defs)
	usesVarargs := macroUses(m.body, "varargs")
	usesKwargs := macroUses(m.body, "kwargs")
	if len(args) > np && !usesVarargs {
		return nil, errorf("TypeError", "macro '%s' takes not more than %d argument(s)", m.name, np)
	}
	for i, p := range m.params {
		switch {
		case i < len(args):
			if _, dup := kwargs.Get(p); dup {
				return nil, errorf("TypeError", "macro '%s' got multiple values for argument '%s'", m.name, p)
			}
			sc.set(p, args[i])
		default:
			if v, ok := kwargs.Get(p); ok {
				sc.set(p, v)
			} else if i >= firstDefault {
				dv, err := r.eval(m.defs[i-firstDefault], sc)
				if err != nil {
					return nil, err
				}
				sc.set(p, dv)
			} else {
				sc.set(p, &Undefined{hint: fmt.Sprintf("parameter '%s' was not provided", p)})
			}
		}
	}
	extraKw := NewDict()
	for i, k := range kwargs.keys {
		ks := k.(string)
		if ks == "caller" {
			if !macroUses(m.body, "caller") {
				return nil, errorf("TypeError", "macro '%s' was invoked with two values for the special caller argument. This is most likely a bug.", m.name)
			}
			sc.set("caller", kwargs.vals[i])
			continue
		}
		found := false
		for _, p := range m.params {
			if p == ks {
				found = true
			}
		}
		if !found {
			extraKw.Set(ks, kwargs.vals[i])
		}
	}
	if extraKw.Len() > 0 && !usesKwargs {
		return nil, errorf("TypeError", "macro '%s' takes no keyword argument '%s'", m.name, extraKw.keys[0])
	}
	if usesVarargs {
		var rest []Value
		if len(args) > np {
			rest = args[np:]
		}
		sc.set("varargs", &List{Items: rest, Tuple: true})
	}
	if usesKwargs {
		sc.set("kwargs", extraKw)
	}
	return r.capture(m.body, sc)
}

// macroUses reports whether a macro body refers to the special name (varargs, kwargs).
func macroUses(body []node, name string) bool {
	found := false
	var walkE func(e expr)
	var walkN func(n node)
	walkE = func(e expr) {
		if found || e == nil {
			return
		}
		switch x := e.(type) {
		case *nameExpr:
			if x.name == name {
				found = true
			}
		case *attrExpr:
			walkE(x.obj)
		case *itemExpr:
			walkE(x.obj)
			walkE(x.key)
		case *sliceExpr:
			walkE(x.start)
			walkE(x.stop)
			walkE(x.step)
		case *callExpr:
			walkE(x.fn)
			for _, a := range x.args {
				walkE(a)
			}
			for _, k := range x.kwargs {
				walkE(k.value)
			}
			walkE(x.star)
			walkE(x.dstar)
		case *filterExpr:
			walkE(x.obj)
			for _, a := range x.args {
				walkE(a)
			}
			for _, k := range x.kwargs {
				walkE(k.value)
			}
		case *testExpr:
			walkE(x.obj)
			for _, a := range x.args {
				walkE(a)
			}
		case *binExpr:
			walkE(x.l)
			walkE(x.r)
		case *unaryExpr:
			walkE(x.x)
		case *compareExpr:
			walkE(x.first)
			for _, a := range x.rest {
				walkE(a)
			}
		case *condExpr:
			walkE(x.cond)
			walkE(x.then)
			walkE(x.orelse)
		case *listExpr:
			for _, a := range x.items {
				walkE(a)
			}
		case *tupleExpr:
			for _, a := range x.items {
				walkE(a)
			}
		case *dictExpr:
			for i := range x.keys {
				walkE(x.keys[i])
				walkE(x.values[i])
			}
		}
	}
	walkN = func(n node) {
		if found {
			return
		}
		switch x := n.(type) {
		case *outputNode:
			walkE(x.expr)
		case *ifNode:
			for i := range x.conds {
				walkE(x.conds[i])
				for _, b := range x.bodies[i] {
					walkN(b)
				}
			}
			for _, b := range x.orelse {
				walkN(b)
			}
		case *forNode:
			walkE(x.iter)
			walkE(x.cond)
			for _, b := range x.body {
				walkN(b)
			}
			for _, b := range x.orelse {
				walkN(b)
			}
		case *setNode:
			walkE(x.value)
		case *setBlockNode:
			for _, b := range x.body {
				walkN(b)
			}
		case *filterBlockNode:
			for _, b := range x.body {
				walkN(b)
			}
		case *withNode:
			for _, v := range x.values {
				walkE(v)
			}
			for _, b := range x.body {
				walkN(b)
			}
		case *generationNode:
			for _, b := range x.body {
				walkN(b)
			}
		case *callBlockNode:
			walkE(x.call)
			for _, b := range x.body {
				walkN(b)
			}
		}
	}
	for _, n := range body {
		walkN(n)
	}
	return found
}

// intPow is Python's int ** non-negative int; results beyond int64 become a *big.Int.
func intPow(base, exp int64) (Value, error) {
	if exp > 1<<16 && base != 0 && base != 1 && base != -1 {
		return nil, errorf("RuntimeError", "integer power too large")
	}
	b := new(big.Int).Exp(big.NewInt(base), big.NewInt(exp), nil)
	if b.IsInt64() {
		return b.Int64(), nil
	}
	return b, nil
}
