package jinja

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// argParser binds positional and keyword arguments to named parameters, as Python does.
type argParser struct {
	name   string
	args   []Value
	kwargs *Dict
	used   int
}

func newArgs(name string, args []Value, kwargs *Dict) *argParser {
	if kwargs == nil {
		kwargs = NewDict()
	}
	return &argParser{name: name, args: args, kwargs: kwargs}
}

// get returns parameter i (positional index) or its keyword, or def.
func (a *argParser) get(i int, key string, def Value) Value {
	if i < len(a.args) {
		if i+1 > a.used {
			a.used = i + 1
		}
		return a.args[i]
	}
	if v, ok := a.kwargs.Get(key); ok {
		return v
	}
	return def
}

func (a *argParser) check(max int, keys ...string) error {
	if len(a.args) > max {
		return errorf("TypeError", "%s() takes at most %d positional argument(s) (%d given)", a.name, max, len(a.args))
	}
	for _, k := range a.kwargs.keys {
		ok := false
		for _, want := range keys {
			if k == want {
				ok = true
			}
		}
		if !ok {
			return errorf("TypeError", "%s() got an unexpected keyword argument '%v'", a.name, k)
		}
	}
	return nil
}

func wantString(fn string, v Value) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case *Undefined:
		return "", undefinedErr(x)
	}
	return "", errorf("TypeError", "%s: expected a string, got %s", fn, typeName(v))
}

func wantInt(fn string, v Value) (int64, error) {
	if i, ok := asInt(v); ok {
		return i, nil
	}
	if u, ok := v.(*Undefined); ok {
		return 0, undefinedErr(u)
	}
	return 0, errorf("TypeError", "%s: expected an integer, got %s", fn, typeName(v))
}

// ---- globals ----

// globals are the built-in global functions (stateless, shared by all renders).
var globals = map[string]Value{
	"range":           &Func{Name: "range", Fn: fnRange},
	"dict":            &Func{Name: "dict", Fn: fnDict},
	"namespace":       &Func{Name: "namespace", Fn: fnNamespace},
	"raise_exception": &Func{Name: "raise_exception", Fn: fnRaise},
	"cycler":          &Func{Name: "cycler", Fn: fnCycler},
	"joiner":          &Func{Name: "joiner", Fn: fnJoiner},
}

func fnRange(_ *renderer, args []Value, kwargs *Dict) (Value, error) {
	if kwargs.Len() > 0 {
		return nil, errorf("TypeError", "range() takes no keyword arguments")
	}
	var ints []int64
	for _, a := range args {
		i, err := wantInt("range", a)
		if err != nil {
			return nil, err
		}
		ints = append(ints, i)
	}
	var start, stop, step int64 = 0, 0, 1
	switch len(ints) {
	case 1:
		stop = ints[0]
	case 2:
		start, stop = ints[0], ints[1]
	case 3:
		start, stop, step = ints[0], ints[1], ints[2]
	default:
		return nil, errorf("TypeError", "range expected 1 to 3 arguments, got %d", len(ints))
	}
	if step == 0 {
		return nil, errorf("ValueError", "range() arg 3 must not be zero")
	}
	var n int64
	if step > 0 && stop > start {
		n = (stop - start + step - 1) / step
	} else if step < 0 && stop < start {
		n = (start - stop - step - 1) / -step
	}
	if n > maxRange {
		return nil, errorf("OverflowError", "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", maxRange)
	}
	out := make([]Value, 0, n)
	for i := int64(0); i < n; i++ {
		out = append(out, start+i*step)
	}
	return &List{Items: out}, nil
}

func fnDict(_ *renderer, args []Value, kwargs *Dict) (Value, error) {
	d := NewDict()
	if len(args) > 1 {
		return nil, errorf("TypeError", "dict expected at most 1 argument, got %d", len(args))
	}
	if len(args) == 1 {
		if err := updateDict(d, args[0]); err != nil {
			return nil, err
		}
	}
	for i, k := range kwargs.keys {
		d.Set(k, kwargs.vals[i])
	}
	return d, nil
}

func updateDict(d *Dict, src Value) error {
	switch x := src.(type) {
	case *Dict:
		for i, k := range x.keys {
			d.Set(k, x.vals[i])
		}
		return nil
	case *List:
		for _, it := range x.Items {
			p, ok := it.(*List)
			if !ok || len(p.Items) != 2 {
				return errorf("ValueError", "dictionary update sequence element has the wrong length")
			}
			if !hashable(p.Items[0]) {
				return errorf("TypeError", "unhashable type: '%s'", typeName(p.Items[0]))
			}
			d.Set(p.Items[0], p.Items[1])
		}
		return nil
	}
	return errorf("TypeError", "'%s' object is not iterable", typeName(src))
}

func fnNamespace(_ *renderer, args []Value, kwargs *Dict) (Value, error) {
	d := NewDict()
	for _, a := range args {
		if err := updateDict(d, a); err != nil {
			return nil, err
		}
	}
	for i, k := range kwargs.keys {
		d.Set(k, kwargs.vals[i])
	}
	return &Namespace{attrs: d}, nil
}

func fnRaise(_ *renderer, args []Value, _ *Dict) (Value, error) {
	msg := ""
	if len(args) > 0 {
		msg = toStr(args[0])
	}
	return nil, &Error{Kind: "TemplateError", Msg: msg}
}

type cycler struct {
	items []Value
	pos   int
}

func fnCycler(_ *renderer, args []Value, _ *Dict) (Value, error) {
	if len(args) == 0 {
		return nil, errorf("RuntimeError", "at least one item has to be provided")
	}
	return &cycler{items: args}, nil
}

func (c *cycler) attr(name string) Value {
	switch name {
	case "current":
		return c.items[c.pos]
	case "next":
		return &Func{Name: "next", Fn: func(*renderer, []Value, *Dict) (Value, error) {
			v := c.items[c.pos]
			c.pos = (c.pos + 1) % len(c.items)
			return v, nil
		}}
	case "reset":
		return &Func{Name: "reset", Fn: func(*renderer, []Value, *Dict) (Value, error) {
			c.pos = 0
			return nil, nil
		}}
	}
	return &Undefined{hint: fmt.Sprintf("'Cycler' object has no attribute '%s'", name)}
}

type joiner struct {
	sep   string
	first bool
}

func fnJoiner(_ *renderer, args []Value, kwargs *Dict) (Value, error) {
	a := newArgs("joiner", args, kwargs)
	return &joiner{sep: toStr(a.get(0, "sep", ", ")), first: true}, nil
}

func (j *joiner) call() Value {
	if j.first {
		j.first = false
		return ""
	}
	return j.sep
}

// ---- tests ----

func (r *renderer) runTest(name string, v Value, args []Value) (bool, error) {
	arg := func() (Value, error) {
		if len(args) < 1 {
			return nil, errorf("TypeError", "test '%s' needs an argument", name)
		}
		return args[0], nil
	}
	switch name {
	case "defined":
		_, u := v.(*Undefined)
		return !u, nil
	case "undefined":
		_, u := v.(*Undefined)
		return u, nil
	case "none":
		return v == nil, nil
	case "boolean":
		_, ok := v.(bool)
		return ok, nil
	case "true":
		b, ok := v.(bool)
		return ok && b, nil
	case "false":
		b, ok := v.(bool)
		return ok && !b, nil
	case "integer":
		_, ok := v.(int64)
		return ok, nil
	case "float":
		_, ok := v.(float64)
		return ok, nil
	case "number":
		_, ok := asNumber(v)
		return ok, nil
	case "string":
		_, ok := v.(string)
		return ok, nil
	case "mapping":
		_, ok := v.(*Dict)
		return ok, nil
	case "iterable":
		switch v.(type) {
		case string, *List, *Dict, *Undefined:
			return true, nil
		}
		return false, nil
	case "sequence":
		switch v.(type) {
		case string, *List, *Dict, *Undefined:
			return true, nil
		}
		return false, nil
	case "callable":
		switch v.(type) {
		case *Func, *Macro, *boundMethod, *joiner:
			return true, nil
		}
		return false, nil
	case "escaped":
		return false, nil
	case "lower": // str(value).islower()
		s := toStr(v)
		return hasCased(s) && strings.IndexFunc(s, func(r rune) bool { return unicode.IsUpper(r) || unicode.IsTitle(r) }) < 0, nil
	case "upper": // str(value).isupper()
		s := toStr(v)
		return hasCased(s) && strings.IndexFunc(s, func(r rune) bool { return unicode.IsLower(r) || unicode.IsTitle(r) }) < 0, nil
	case "odd", "even":
		// Jinja: value % 2 == 1 (odd), value % 2 == 0 (even); floats work too.
		m, err := binaryOp("%", v, int64(2))
		if err != nil {
			return false, err
		}
		if name == "odd" {
			return valuesEqual(m, int64(1)), nil
		}
		return valuesEqual(m, int64(0)), nil
	case "divisibleby":
		a, err := arg()
		if err != nil {
			return false, err
		}
		m, err := binaryOp("%", v, a)
		if err != nil {
			return false, err
		}
		return valuesEqual(m, int64(0)), nil
	case "sameas":
		a, err := arg()
		if err != nil {
			return false, err
		}
		switch v.(type) {
		case nil, bool:
			return v == a, nil
		case *List, *Dict, *Namespace:
			return v == a, nil
		}
		return valuesEqual(v, a) && typeName(v) == typeName(a), nil
	case "eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">=", "in":
		a, err := arg()
		if err != nil {
			return false, err
		}
		op := map[string]string{"eq": "==", "equalto": "==", "==": "==", "ne": "!=", "!=": "!=", "lt": "<", "lessthan": "<", "<": "<",
			"le": "<=", "<=": "<=", "gt": ">", "greaterthan": ">", ">": ">", "ge": ">=", ">=": ">=", "in": "in"}[name]
		return compareOp(op, v, a)
	case "filter":
		s, _ := v.(string)
		_, ok := filters[s]
		return ok, nil
	case "test":
		s, _ := v.(string)
		return knownTest(s), nil
	}
	return false, errorf("TemplateRuntimeError", "no test named '%s'", name)
}

func hasCased(s string) bool {
	for _, r := range s {
		if unicode.IsUpper(r) || unicode.IsLower(r) {
			return true
		}
	}
	return false
}

// ---- filters ----

type filterFn func(r *renderer, v Value, args []Value, kwargs *Dict) (Value, error)

var filters map[string]filterFn

func init() {
	filters = map[string]filterFn{
		"abs":         fAbs,
		"attr":        fAttr,
		"capitalize":  fCapitalize,
		"count":       fLength,
		"d":           fDefault,
		"default":     fDefault,
		"dictsort":    fDictsort,
		"e":           fEscape,
		"escape":      fEscape,
		"first":       fFirst,
		"float":       fFloat,
		"forceescape": fEscape,
		"indent":      fIndent,
		"int":         fInt,
		"items":       fItems,
		"join":        fJoin,
		"last":        fLast,
		"length":      fLength,
		"list":        fList,
		"lower":       fLower,
		"map":         fMap,
		"max":         fMax,
		"min":         fMin,
		"reject":      fReject,
		"rejectattr":  fRejectattr,
		"replace":     fReplace,
		"reverse":     fReverse,
		"round":       fRound,
		"safe":        fSafe,
		"select":      fSelect,
		"selectattr":  fSelectattr,
		"sort":        fSort,
		"string":      fString,
		"sum":         fSum,
		"title":       fTitle,
		"tojson":      fTojson,
		"trim":        fTrim,
		"unique":      fUnique,
		"upper":       fUpper,
		"wordcount":   fWordcount,
		"center":      fCenter,
		"batch":       fBatch,
		"format":      fFormat,
	}
}

func (r *renderer) applyFilter(f *filterExpr, v Value, sc *scope) (Value, error) {
	fn, ok := filters[f.name]
	if !ok {
		if unsupportedFilters[f.name] {
			return nil, &Error{Kind: "TemplateRuntimeError", Msg: fmt.Sprintf("the filter '%s' is not supported in chat templates", f.name), Line: f.line}
		}
		return nil, &Error{Kind: "TemplateAssertionError", Msg: fmt.Sprintf("no filter named '%s'", f.name), Line: f.line}
	}
	args, err := r.evalList(f.args, sc)
	if err != nil {
		return nil, err
	}
	kwargs := NewDict()
	for _, kw := range f.kwargs {
		kv, err := r.eval(kw.value, sc)
		if err != nil {
			return nil, err
		}
		kwargs.Set(kw.name, kv)
	}
	out, err := fn(r, v, args, kwargs)
	return out, withLine(err, f.line)
}

func fSafe(_ *renderer, v Value, _ []Value, _ *Dict) (Value, error) { return v, nil }

func fString(_ *renderer, v Value, _ []Value, _ *Dict) (Value, error) { return toStr(v), nil }

func fAbs(_ *renderer, v Value, _ []Value, _ *Dict) (Value, error) {
	switch x := v.(type) {
	case bool, int64:
		i, _ := asInt(x)
		if i < 0 {
			i = -i
		}
		return i, nil
	case float64:
		return math.Abs(x), nil
	}
	return nil, errorf("TypeError", "bad operand type for abs(): '%s'", typeName(v))
}

func fAttr(_ *renderer, v Value, args []Value, _ *Dict) (Value, error) {
	if len(args) != 1 {
		return nil, errorf("TypeError", "attr() takes one argument")
	}
	name, err := wantString("attr", args[0])
	if err != nil {
		return nil, err
	}
	if u, ok := v.(*Undefined); ok {
		return nil, undefinedErr(u)
	}
	a, err := getAttrOnly(v, name)
	if err != nil || a != nil {
		return a, err
	}
	if ns, ok := v.(*Namespace); ok {
		if x, ok := ns.attrs.Get(name); ok {
			return x, nil
		}
	}
	return &Undefined{hint: fmt.Sprintf("'%s object' has no attribute '%s'", typeName(v), name)}, nil
}

func fCapitalize(_ *renderer, v Value, _ []Value, _ *Dict) (Value, error) {
	return pyCapitalize(toStr(v)), nil
}

func fDefault(_ *renderer, v Value, args []Value, kwargs *Dict) (Value, error) {
	a := newArgs("default", args, kwargs)
	def := a.get(0, "default_value", "")
	boolean := truthy(a.get(1, "boolean", false))
	if err := a.check(2, "default_value", "boolean"); err != nil {
		return nil, err
	}
	if _, u := v.(*Undefined); u || (boolean && !truthy(v)) {
		return def, nil
	}
	return v, nil
}

func fDictsort(_ *renderer, v Value, args []Value, kwargs *Dict) (Value, error) {
	d, ok := v.(*Dict)
	if !ok {
		return nil, errorf("TypeError", "dictsort: expected a mapping, got %s", typeName(v))
	}
	a := newArgs("dictsort", args, kwargs)
	caseSensitive := truthy(a.get(0, "case_sensitive", false))
	by := toStr(a.get(1, "by", "key"))
	reverse := truthy(a.get(2, "reverse", false))
	pos := 0
	switch by {
	case "key":
	case "value":
		pos = 1
	default:
		return nil, errorf("FilterArgumentError", "You can only sort by either \"key\" or \"value\"")
	}
	items := pairs(d)
	err := sortValues(items, func(x Value) Value {
		k := x.(*List).Items[pos]
		if s, ok := k.(string); ok && !caseSensitive {
			return strings.ToLower(s)
		}
		return k
	}, reverse)
	return &List{Items: items}, err
}

func pairs(d *Dict) []Value {
	out := make([]Value, len(d.keys))
	for i, k := range d.keys {
		out[i] = &List{Items: []Value{k, d.vals[i]}, Tuple: true}
	}
	return out
}

// htmlEscaper escapes as markupsafe does.
var htmlEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", "\"", "&#34;", "'", "&#39;")

func fEscape(_ *renderer, v Value, _ []Value, _ *Dict) (Value, error) {
	s := toStr(v)
	return htmlEscaper.Replace(s), nil
}

func seqItems(r *renderer, v Value) ([]Value, error) {
	return r.iterate(v)
}

func fFirst(r *renderer, v Value, _ []Value, _ *Dict) (Value, error) {
	items, err := seqItems(r, v)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return &Undefined{hint: "No first item, sequence was empty."}, nil
	}
	return items[0], nil
}

func fLast(r *renderer, v Value, _ []Value, _ *Dict) (Value, error) {
	items, err := seqItems(r, v)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return &Undefined{hint: "No last item, sequence was empty."}, nil
	}
	return items[len(items)-1], nil
}

func fFloat(_ *renderer, v Value, args []Value, kwargs *Dict) (Value, error) {
	a := newArgs("float", args, kwargs)
	def := a.get(0, "default", 0.0)
	switch x := v.(type) {
	case *Undefined:
		return nil, undefinedErr(x)
	case float64:
		return x, nil
	case bool, int64:
		f, _ := asNumber(x)
		return f, nil
	case string:
		f, err := strconv.ParseFloat(strings.TrimFunc(x, isPySpace), 64)
		if err != nil {
			return def, nil
		}
		return f, nil
	}
	return def, nil
}

func fInt(_ *renderer, v Value, args []Value, kwargs *Dict) (Value, error) {
	a := newArgs("int", args, kwargs)
	def := a.get(0, "default", int64(0))
	base, err := wantInt("int", a.get(1, "base", int64(10)))
	if err != nil {
		return nil, err
	}
	switch x := v.(type) {
	case *Undefined:
		return nil, undefinedErr(x)
	case bool, int64:
		i, _ := asInt(x)
		return i, nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return def, nil
		}
		return floatToInt(x), nil
	case string:
		s := strings.ReplaceAll(strings.TrimFunc(x, isPySpace), "_", "")
		if i, err := strconv.ParseInt(s, int(base), 64); err == nil {
			return i, nil
		}
		if f, err := strconv.ParseFloat(s, 64); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
			return floatToInt(f), nil
		}
	}
	return def, nil
}

func fIndent(_ *renderer, v Value, args []Value, kwargs *Dict) (Value, error) {
	a := newArgs("indent", args, kwargs)
	width := a.get(0, "width", int64(4))
	first := truthy(a.get(1, "first", false))
	blank := truthy(a.get(2, "blank", false))
	var ind string
	if s, ok := width.(string); ok {
		ind = s
	} else {
		n, err := wantInt("indent", width)
		if err != nil {
			return nil, err
		}
		if n > 1000 {
			n = 1000
		}
		ind = strings.Repeat(" ", int(max(n, 0)))
	}
	s, isStr := v.(string)
	if !isStr {
		return nil, errorf("TypeError", "unsupported operand type(s) for +=: '%s' and 'str'", typeName(v))
	}
	// jinja2's do_indent, quirks included
	s += "\n"
	lines := pySplitlines(s)
	var rv string
	if blank {
		rv = strings.Join(lines, "\n"+ind)
	} else {
		rv = lines[0]
		if len(lines) > 1 {
			parts := make([]string, 0, len(lines)-1)
			for _, ln := range lines[1:] {
				if ln != "" {
					ln = ind + ln
				}
				parts = append(parts, ln)
			}
			rv += "\n" + strings.Join(parts, "\n")
		}
	}
	if first {
		rv = ind + rv
	}
	return rv, nil
}

func fItems(_ *renderer, v Value, _ []Value, _ *Dict) (Value, error) {
	switch x := v.(type) {
	case *Undefined:
		return &List{}, nil
	case *Dict:
		return &List{Items: pairs(x)}, nil
	}
	return nil, errorf("TypeError", "Can only get item pairs from a mapping.")
}

func fJoin(r *renderer, v Value, args []Value, kwargs *Dict) (Value, error) {
	a := newArgs("join", args, kwargs)
	sep := toStr(a.get(0, "d", ""))
	attr := a.get(1, "attribute", nil)
	items, err := seqItems(r, v)
	if err != nil {
		return nil, err
	}
	parts := make([]string, len(items))
	for i, it := range items {
		if attr != nil {
			if it, err = attrPath(it, attr); err != nil {
				return nil, err
			}
		}
		parts[i] = toStr(it)
	}
	return strings.Join(parts, sep), nil
}

// attrPath looks up a dotted attribute path (or an integer index) the way Jinja's
// make_attrgetter does.
func attrPath(v Value, attr Value) (Value, error) {
	if s, ok := attr.(string); ok {
		for _, part := range strings.Split(s, ".") {
			var key Value = part
			if i, err := strconv.ParseInt(part, 10, 64); err == nil {
				key = i
			}
			var err error
			if v, err = getItem(v, key); err != nil {
				return nil, err
			}
		}
		return v, nil
	}
	return getItem(v, attr)
}

func fLength(_ *renderer, v Value, _ []Value, _ *Dict) (Value, error) {
	switch x := v.(type) {
	case string:
		return int64(runeLen(x)), nil
	case *List:
		return int64(len(x.Items)), nil
	case *Dict:
		return int64(x.Len()), nil
	case *Undefined:
		return int64(0), nil
	}
	return nil, errorf("TypeError", "object of type '%s' has no len()", typeName(v))
}

func fList(r *renderer, v Value, _ []Value, _ *Dict) (Value, error) {
	items, err := seqItems(r, v)
	if err != nil {
		return nil, err
	}
	return &List{Items: append([]Value(nil), items...)}, nil
}

func fLower(_ *renderer, v Value, _ []Value, _ *Dict) (Value, error) {
	return strings.ToLower(toStr(v)), nil
}
func fUpper(_ *renderer, v Value, _ []Value, _ *Dict) (Value, error) { return pyUpper(toStr(v)), nil }

func fMap(r *renderer, v Value, args []Value, kwargs *Dict) (Value, error) {
	if !truthy(v) {
		return &List{}, nil // Jinja iterates only a truthy value
	}
	items, err := seqItems(r, v)
	if err != nil {
		return nil, err
	}
	out := make([]Value, 0, len(items))
	if attr, ok := kwargs.Get("attribute"); ok {
		def, hasDef := kwargs.Get("default")
		for _, it := range items {
			x, err := attrPath(it, attr)
			if err != nil {
				return nil, err
			}
			if _, u := x.(*Undefined); u && hasDef {
				x = def
			}
			out = append(out, x)
		}
		return &List{Items: out}, nil
	}
	if len(args) == 0 {
		return nil, errorf("FilterArgumentError", "map requires a filter argument")
	}
	name, err := wantString("map", args[0])
	if err != nil {
		return nil, err
	}
	fn, ok := filters[name]
	if !ok {
		return nil, errorf("TemplateRuntimeError", "no filter named '%s'", name)
	}
	for _, it := range items {
		x, err := fn(r, it, args[1:], kwargs)
		if err != nil {
			return nil, err
		}
		out = append(out, x)
	}
	return &List{Items: out}, nil
}

func minMax(r *renderer, v Value, args []Value, kwargs *Dict, wantMax bool) (Value, error) {
	a := newArgs("min/max", args, kwargs)
	caseSensitive := truthy(a.get(0, "case_sensitive", false))
	attr := a.get(1, "attribute", nil)
	items, err := seqItems(r, v)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return &Undefined{hint: "No aggregated item, sequence was empty."}, nil
	}
	key := func(x Value) (Value, error) {
		if attr != nil {
			var err error
			if x, err = attrPath(x, attr); err != nil {
				return nil, err
			}
		}
		if s, ok := x.(string); ok && !caseSensitive {
			return strings.ToLower(s), nil
		}
		return x, nil
	}
	best := items[0]
	bk, err := key(best)
	if err != nil {
		return nil, err
	}
	for _, it := range items[1:] {
		k, err := key(it)
		if err != nil {
			return nil, err
		}
		c, err := compareValues(k, bk)
		if err != nil {
			return nil, err
		}
		if (wantMax && c > 0) || (!wantMax && c < 0) {
			best, bk = it, k
		}
	}
	return best, nil
}

func fMax(r *renderer, v Value, args []Value, kwargs *Dict) (Value, error) {
	return minMax(r, v, args, kwargs, true)
}
func fMin(r *renderer, v Value, args []Value, kwargs *Dict) (Value, error) {
	return minMax(r, v, args, kwargs, false)
}

func selectOrReject(r *renderer, v Value, args []Value, byAttr, keep bool) (Value, error) {
	if !truthy(v) {
		return &List{}, nil // Jinja iterates only a truthy value
	}
	items, err := seqItems(r, v)
	if err != nil {
		return nil, err
	}
	var attr Value
	if byAttr {
		if len(args) == 0 {
			return nil, errorf("FilterArgumentError", "Missing parameter for attribute name")
		}
		attr, args = args[0], args[1:]
	}
	test := ""
	if len(args) > 0 {
		s, err := wantString("select", args[0])
		if err != nil {
			return nil, err
		}
		test, args = s, args[1:]
	}
	var out []Value
	for _, it := range items {
		x := it
		if byAttr {
			if x, err = attrPath(it, attr); err != nil {
				return nil, err
			}
		}
		var ok bool
		if test == "" {
			ok = truthy(x)
		} else if ok, err = r.runTest(test, x, args); err != nil {
			return nil, err
		}
		if ok == keep {
			out = append(out, it)
		}
	}
	return &List{Items: out}, nil
}

func fSelect(r *renderer, v Value, args []Value, _ *Dict) (Value, error) {
	return selectOrReject(r, v, args, false, true)
}
func fReject(r *renderer, v Value, args []Value, _ *Dict) (Value, error) {
	return selectOrReject(r, v, args, false, false)
}
func fSelectattr(r *renderer, v Value, args []Value, _ *Dict) (Value, error) {
	return selectOrReject(r, v, args, true, true)
}
func fRejectattr(r *renderer, v Value, args []Value, _ *Dict) (Value, error) {
	return selectOrReject(r, v, args, true, false)
}

func fReplace(_ *renderer, v Value, args []Value, kwargs *Dict) (Value, error) {
	a := newArgs("replace", args, kwargs)
	old := toStr(a.get(0, "old", ""))
	nw := toStr(a.get(1, "new", ""))
	count := a.get(2, "count", nil)
	n := int64(-1)
	if count != nil {
		var err error
		if n, err = wantInt("replace", count); err != nil {
			return nil, err
		}
	}
	return pyReplace(toStr(v), old, nw, n)
}

func pyReplace(s, old, nw string, n int64) (Value, error) {
	if n < 0 {
		n = -1
	}
	if old == "" {
		// Python inserts new between every character (and at both ends).
		count := int64(runeLen(s) + 1)
		if n >= 0 && n < count {
			count = n
		}
		if int64(len(nw))*count+int64(len(s)) > maxOutput {
			return nil, errorf("RuntimeError", "string too large")
		}
	} else if strings.Count(s, old)*len(nw) > maxOutput {
		return nil, errorf("RuntimeError", "string too large")
	}
	return strings.Replace(s, old, nw, int(n)), nil
}

func fReverse(r *renderer, v Value, _ []Value, _ *Dict) (Value, error) {
	if s, ok := v.(string); ok {
		rs := []rune(s)
		for i, j := 0, len(rs)-1; i < j; i, j = i+1, j-1 {
			rs[i], rs[j] = rs[j], rs[i]
		}
		return string(rs), nil
	}
	items, err := seqItems(r, v)
	if err != nil {
		return nil, err
	}
	out := make([]Value, len(items))
	for i, it := range items {
		out[len(items)-1-i] = it
	}
	return &List{Items: out}, nil
}

func fRound(_ *renderer, v Value, args []Value, kwargs *Dict) (Value, error) {
	a := newArgs("round", args, kwargs)
	prec, err := wantInt("round", a.get(0, "precision", int64(0)))
	if err != nil {
		return nil, err
	}
	method := toStr(a.get(1, "method", "common"))
	f, ok := asNumber(v)
	if !ok {
		if u, isU := v.(*Undefined); isU {
			return nil, undefinedErr(u)
		}
		return nil, errorf("TypeError", "type %s doesn't define __round__ method", typeName(v))
	}
	if i, isInt := asInt(v); isInt && method == "common" && prec >= 0 {
		return i, nil // Python's round(int, n) is the int itself
	}
	if prec > 300 {
		prec = 300
	}
	p := math.Pow(10, float64(prec))
	switch method {
	case "common":
		// Python's round() on the scaled value, as Jinja does: round half to even on the
		// exact binary value, which strconv reproduces.
		s := strconv.FormatFloat(f, 'f', int(max(prec, 0)), 64)
		out, _ := strconv.ParseFloat(s, 64)
		if prec < 0 {
			out = math.RoundToEven(f*p) / p
		}
		return out, nil
	case "ceil":
		return math.Ceil(f*p) / p, nil
	case "floor":
		return math.Floor(f*p) / p, nil
	}
	return nil, errorf("FilterArgumentError", "method must be common, ceil or floor")
}

func fSort(r *renderer, v Value, args []Value, kwargs *Dict) (Value, error) {
	a := newArgs("sort", args, kwargs)
	reverse := truthy(a.get(0, "reverse", false))
	caseSensitive := truthy(a.get(1, "case_sensitive", false))
	attr := a.get(2, "attribute", nil)
	items, err := seqItems(r, v)
	if err != nil {
		return nil, err
	}
	out := append([]Value(nil), items...)
	var keyErr error
	err = sortValues(out, func(x Value) Value {
		if attr != nil {
			var e error
			if x, e = attrPath(x, attr); e != nil && keyErr == nil {
				keyErr = e
			}
		}
		if s, ok := x.(string); ok && !caseSensitive {
			return strings.ToLower(s)
		}
		return x
	}, reverse)
	if keyErr != nil {
		return nil, keyErr
	}
	return &List{Items: out}, err
}

func fSum(r *renderer, v Value, args []Value, kwargs *Dict) (Value, error) {
	a := newArgs("sum", args, kwargs)
	attr := a.get(0, "attribute", nil)
	total := a.get(1, "start", int64(0))
	items, err := seqItems(r, v)
	if err != nil {
		return nil, err
	}
	for _, it := range items {
		if attr != nil {
			if it, err = attrPath(it, attr); err != nil {
				return nil, err
			}
		}
		if total, err = binaryOp("+", total, it); err != nil {
			return nil, err
		}
	}
	return total, nil
}

// isWordBeginning reports the delimiters of jinja2's title filter: [-\s({\[<] with Python's \s.
func isWordBeginning(r rune) bool {
	return isPySpace(r) || strings.ContainsRune("-({[<", r)
}

func fTitle(_ *renderer, v Value, _ []Value, _ *Dict) (Value, error) {
	// jinja2: item[0].upper() + item[1:].lower() for the delimiter runs and words alike
	s := toStr(v)
	var b strings.Builder
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		delim := isWordBeginning(r)
		end := n
		for end < len(s) {
			r2, n2 := utf8.DecodeRuneInString(s[end:])
			if isWordBeginning(r2) != delim {
				break
			}
			end += n2
		}
		b.WriteString(pyUpperRune(r))
		b.WriteString(pyLower(s[n:end]))
		s = s[end:]
	}
	return b.String(), nil
}

func fTrim(_ *renderer, v Value, args []Value, kwargs *Dict) (Value, error) {
	a := newArgs("trim", args, kwargs)
	chars := a.get(0, "chars", nil)
	s := toStr(v)
	if chars == nil {
		return strings.TrimFunc(s, isPySpace), nil
	}
	return strings.Trim(s, toStr(chars)), nil
}

func fUnique(r *renderer, v Value, args []Value, kwargs *Dict) (Value, error) {
	a := newArgs("unique", args, kwargs)
	caseSensitive := truthy(a.get(0, "case_sensitive", false))
	attr := a.get(1, "attribute", nil)
	items, err := seqItems(r, v)
	if err != nil {
		return nil, err
	}
	var out, seen []Value
	for _, it := range items {
		k := it
		if attr != nil {
			if k, err = attrPath(it, attr); err != nil {
				return nil, err
			}
		}
		if s, ok := k.(string); ok && !caseSensitive {
			k = strings.ToLower(s)
		}
		switch k.(type) {
		case *List, *Dict, *Namespace:
			if l, ok := k.(*List); !ok || !l.Tuple {
				return nil, errorf("TypeError", "unhashable type: '%s'", typeName(k))
			}
		}
		dup := false
		for _, s := range seen {
			if valuesEqual(s, k) {
				dup = true
				break
			}
		}
		if !dup {
			seen = append(seen, k)
			out = append(out, it)
		}
	}
	return &List{Items: out}, nil
}

func fWordcount(_ *renderer, v Value, _ []Value, _ *Dict) (Value, error) {
	n := 0
	for _, f := range strings.FieldsFunc(toStr(v), func(r rune) bool {
		return !(r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r))
	}) {
		if f != "" {
			n++
		}
	}
	return int64(n), nil
}

func fCenter(_ *renderer, v Value, args []Value, kwargs *Dict) (Value, error) {
	a := newArgs("center", args, kwargs)
	w, err := wantInt("center", a.get(0, "width", int64(80)))
	if err != nil {
		return nil, err
	}
	s := toStr(v)
	n := int64(runeLen(s))
	if w > maxCollection {
		return nil, errorf("RuntimeError", "string too large")
	}
	if w <= n {
		return s, nil
	}
	pad := w - n
	left := pad / 2
	if pad%2 == 1 && w%2 == 1 {
		left++
	}
	return strings.Repeat(" ", int(left)) + s + strings.Repeat(" ", int(pad-left)), nil
}

func fBatch(r *renderer, v Value, args []Value, kwargs *Dict) (Value, error) {
	a := newArgs("batch", args, kwargs)
	n, err := wantInt("batch", a.get(0, "linecount", int64(1)))
	if err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, errorf("ValueError", "batch size must be positive")
	}
	if n > maxCollection {
		return nil, errorf("RuntimeError", "batch size %d too large", n)
	}
	fill, hasFill := a.get(1, "fill_with", nil), a.get(1, "fill_with", nil) != nil
	items, err := seqItems(r, v)
	if err != nil {
		return nil, err
	}
	var out []Value
	for i := 0; i < len(items); i += int(n) {
		end := min(i+int(n), len(items))
		row := append([]Value(nil), items[i:end]...)
		for hasFill && int64(len(row)) < n {
			row = append(row, fill)
		}
		out = append(out, &List{Items: row})
	}
	return &List{Items: out}, nil
}

func fTojson(_ *renderer, v Value, args []Value, kwargs *Dict) (Value, error) {
	a := newArgs("tojson", args, kwargs)
	opts := jsonOptions{}
	opts.ensureASCII = truthy(a.get(0, "ensure_ascii", false))
	indent := a.get(1, "indent", nil)
	seps := a.get(2, "separators", nil)
	opts.sortKeys = truthy(a.get(3, "sort_keys", false))
	if err := a.check(4, "ensure_ascii", "indent", "separators", "sort_keys"); err != nil {
		return nil, err
	}
	switch x := indent.(type) {
	case nil:
	case string:
		opts.indent, opts.hasIndent = x, true
	default:
		n, err := wantInt("tojson", indent)
		if err != nil {
			return nil, err
		}
		if n > 1000 {
			n = 1000
		}
		opts.indent, opts.hasIndent = strings.Repeat(" ", int(max(n, 0))), true
	}
	opts.itemSep, opts.keySep = ", ", ": "
	if opts.hasIndent {
		opts.itemSep = ","
	}
	if seps != nil {
		l, ok := seps.(*List)
		if !ok || len(l.Items) != 2 {
			return nil, errorf("ValueError", "tojson: separators must be a pair of strings")
		}
		opts.itemSep, opts.keySep = toStr(l.Items[0]), toStr(l.Items[1])
	}
	var b strings.Builder
	if err := writeJSON(&b, v, &opts, 0); err != nil {
		return nil, err
	}
	return b.String(), nil
}

// floatToInt is Python's int(float): truncation, exact even beyond the int64 range (a
// *big.Int then, which prints and serializes but takes no further arithmetic).
func floatToInt(f float64) Value {
	t := math.Trunc(f)
	if t >= -(1<<63) && t < 1<<63 {
		return int64(t)
	}
	b, _ := new(big.Float).SetFloat64(t).Int(nil)
	return b
}

// fFormat is jinja2's format filter: printf-style formatting, value % args.
func fFormat(_ *renderer, v Value, args []Value, kwargs *Dict) (Value, error) {
	if kwargs.Len() > 0 {
		return nil, errorf("FilterArgumentError", "format: keyword arguments are not supported")
	}
	s, err := wantString("format", v)
	if err != nil {
		return nil, err
	}
	return percentFormat(s, &List{Items: args, Tuple: true})
}
