package jinja

import (
	"fmt"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/halo-shell/halo-shell/internal/pyfmt"
)

// Value is a template value. Its dynamic type is one of: nil (Python None), bool, int64,
// float64, string, *List, *Dict, *Namespace, *Undefined, *Macro, *Func, or one of the
// engine's internal objects (loop, cycler, joiner, bound methods).
type Value = any

// List is a Python list, or a tuple when Tuple is set.
type List struct {
	Items []Value
	Tuple bool
	View  string // "dict_keys", "dict_values" or "dict_items" for dict views
}

// Dict is a Python dict: keys keep their insertion order. Keys are nil, bool, int64,
// float64 or string.
type Dict struct {
	keys  []Value
	index map[Value]int
	vals  []Value
}

// NewDict returns an empty dict.
func NewDict() *Dict { return &Dict{index: map[Value]int{}} }

func normKey(k Value) Value {
	switch v := k.(type) {
	case bool:
		if v {
			return int64(1)
		}
		return int64(0)
	case float64:
		if v == math.Trunc(v) && math.Abs(v) < 1<<53 {
			return int64(v)
		}
	}
	return k
}

// hashable reports whether k can be a dict key.
func hashable(k Value) bool {
	switch k.(type) {
	case nil, bool, int64, float64, string:
		return true
	}
	return false
}

// Set inserts or replaces key k.
func (d *Dict) Set(k Value, v Value) {
	nk := normKey(k)
	if i, ok := d.index[nk]; ok {
		d.vals[i] = v
		return
	}
	d.index[nk] = len(d.keys)
	d.keys = append(d.keys, k)
	d.vals = append(d.vals, v)
}

// Get returns the value at key k.
func (d *Dict) Get(k Value) (Value, bool) {
	if !hashable(k) {
		return nil, false
	}
	i, ok := d.index[normKey(k)]
	if !ok {
		return nil, false
	}
	return d.vals[i], true
}

// Len is the number of entries.
func (d *Dict) Len() int { return len(d.keys) }

// Keys returns the keys in insertion order.
func (d *Dict) Keys() []Value { return d.keys }

// Namespace is the mutable object made by namespace(); set statements may assign its
// attributes.
type Namespace struct{ attrs *Dict }

// Undefined is a missing value; hint says what was missing. Using it where a real value is
// needed is an error carrying the hint, as with Jinja's default Undefined.
type Undefined struct {
	hint   string
	unsafe bool // an attribute refused by the sandbox
}

func (u *Undefined) message() string {
	if u.hint == "" {
		return "value is undefined"
	}
	return u.hint
}

// Func is a callable implemented in Go.
type Func struct {
	Name string
	Fn   func(r *renderer, args []Value, kwargs *Dict) (Value, error)
}

// Macro is a template macro.
type Macro struct {
	node   *macroNode
	params []string
	defs   []expr
	body   []node
	scope  *scope
	name   string
	caller Value // set for call blocks
}

// Error is a template runtime error. Kind is the Python exception name that Jinja would
// raise (TemplateError for raise_exception, UndefinedError, TypeError, ...).
type Error struct {
	Kind string
	Msg  string
	Line int
}

func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s: %s (template line %d)", e.Kind, e.Msg, e.Line)
	}
	return fmt.Sprintf("%s: %s", e.Kind, e.Msg)
}

func errorf(kind, format string, args ...any) error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

func undefinedErr(u *Undefined) error {
	if u.unsafe {
		return &Error{Kind: "SecurityError", Msg: u.hint}
	}
	return &Error{Kind: "UndefinedError", Msg: u.message()}
}

// typeName is Python's type name of v, as used in error messages.
func typeName(v Value) string {
	switch x := v.(type) {
	case nil:
		return "NoneType"
	case bool:
		return "bool"
	case int64:
		return "int"
	case float64:
		return "float"
	case *big.Int:
		return "int"
	case string:
		return "str"
	case *List:
		if x.View != "" {
			return x.View
		}
		if x.Tuple {
			return "tuple"
		}
		return "list"
	case *Dict:
		return "dict"
	case *Namespace:
		return "Namespace"
	case *Undefined:
		return "Undefined"
	case *Macro:
		return "Macro"
	case *Func, *boundMethod:
		return "function"
	case *loopObj:
		return "LoopContext"
	}
	return fmt.Sprintf("%T", v)
}

// truthy is Python truthiness.
func truthy(v Value) bool {
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case int64:
		return x != 0
	case float64:
		return x != 0
	case *big.Int:
		return x.Sign() != 0
	case string:
		return x != ""
	case *List:
		return len(x.Items) > 0
	case *Dict:
		return x.Len() > 0
	case *Undefined:
		return false
	}
	return true
}

// toStr is Python's str(v) as Jinja prints it (Undefined prints as "").
func toStr(v Value) string {
	switch x := v.(type) {
	case string:
		return x
	case *Undefined:
		return ""
	}
	return repr(v)
}

// repr is Python's repr(v).
func repr(v Value) string {
	var b strings.Builder
	writeRepr(&b, v, 0)
	return b.String()
}

func writeRepr(b *strings.Builder, v Value, depth int) {
	if depth > 100 {
		b.WriteString("...")
		return
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("None")
	case bool:
		if x {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		b.WriteString(pyFloatRepr(x))
	case *big.Int:
		b.WriteString(x.String())
	case string:
		b.WriteString(pyStrRepr(x))
	case *List:
		open, close := "[", "]"
		if x.Tuple {
			open, close = "(", ")"
		}
		if x.View != "" {
			open, close = x.View+"([", "])"
		}
		b.WriteString(open)
		for i, it := range x.Items {
			if i > 0 {
				b.WriteString(", ")
			}
			writeRepr(b, it, depth+1)
		}
		if x.Tuple && len(x.Items) == 1 {
			b.WriteString(",")
		}
		b.WriteString(close)
	case *Dict:
		b.WriteString("{")
		for i, k := range x.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			writeRepr(b, k, depth+1)
			b.WriteString(": ")
			writeRepr(b, x.vals[i], depth+1)
		}
		b.WriteString("}")
	case *Namespace:
		b.WriteString("<Namespace ")
		writeRepr(b, x.attrs, depth+1)
		b.WriteString(">")
	case *Undefined:
		b.WriteString("Undefined")
	case *Macro:
		fmt.Fprintf(b, "<Macro '%s'>", x.name)
	case *Func:
		fmt.Fprintf(b, "<function %s>", x.Name)
	case *boundMethod:
		fmt.Fprintf(b, "<built-in method %s of %s object>", x.name, typeName(x.recv))
	default:
		fmt.Fprintf(b, "<%s object>", typeName(v))
	}
}

// pyFloatRepr formats f as Python's repr(float).
func pyFloatRepr(f float64) string { return pyfmt.FloatRepr(f) }

// pyStrRepr formats s as Python's repr(str).
func pyStrRepr(s string) string {
	q := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		q = '"'
	}
	var b strings.Builder
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == rune(q) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == utf8.RuneError:
			b.WriteString(`\ufffd`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r < 0x7f || unicode.IsPrint(r):
			b.WriteRune(r)
		case r <= 0xff:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
	}
	b.WriteByte(q)
	return b.String()
}

// valuesEqual is Python ==.
func valuesEqual(a, b Value) bool {
	switch x := a.(type) {
	case nil:
		return b == nil
	case bool, int64, float64:
		fa, oka := asNumber(a)
		fb, okb := asNumber(b)
		if oka && okb {
			ia, aInt := asInt(a)
			ib, bInt := asInt(b)
			if aInt && bInt {
				return ia == ib
			}
			return fa == fb
		}
		return false
	case string:
		y, ok := b.(string)
		return ok && x == y
	case *List:
		y, ok := b.(*List)
		if !ok || y.Tuple != x.Tuple || len(x.Items) != len(y.Items) {
			return false
		}
		for i := range x.Items {
			if !valuesEqual(x.Items[i], y.Items[i]) {
				return false
			}
		}
		return true
	case *Dict:
		y, ok := b.(*Dict)
		if !ok || x.Len() != y.Len() {
			return false
		}
		for i, k := range x.keys {
			v, ok := y.Get(k)
			if !ok || !valuesEqual(x.vals[i], v) {
				return false
			}
		}
		return true
	case *Undefined:
		_, ok := b.(*Undefined)
		return ok
	}
	return a == b
}

// asNumber returns v as a float64 when v is a bool, int or float.
func asNumber(v Value) (float64, bool) {
	switch x := v.(type) {
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	case int64:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

// asInt returns v as an int64 when v is a bool or int.
func asInt(v Value) (int64, bool) {
	switch x := v.(type) {
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	case int64:
		return x, true
	}
	return 0, false
}

// compareValues is Python's ordering for <, <=, >, >=; it returns -1, 0 or 1.
func compareValues(a, b Value) (int, error) {
	if ia, ok := asInt(a); ok {
		if ib, ok := asInt(b); ok {
			return cmpOrdered(ia, ib), nil
		}
	}
	if fa, ok := asNumber(a); ok {
		if fb, ok := asNumber(b); ok {
			if math.IsNaN(fa) || math.IsNaN(fb) {
				return 2, nil
			}
			return cmpOrdered(fa, fb), nil
		}
	}
	if sa, ok := a.(string); ok {
		if sb, ok := b.(string); ok {
			return cmpOrdered(sa, sb), nil
		}
	}
	if la, ok := a.(*List); ok {
		if lb, ok := b.(*List); ok && la.Tuple == lb.Tuple {
			for i := 0; i < len(la.Items) && i < len(lb.Items); i++ {
				if valuesEqual(la.Items[i], lb.Items[i]) {
					continue
				}
				return compareValues(la.Items[i], lb.Items[i])
			}
			return cmpOrdered(len(la.Items), len(lb.Items)), nil
		}
	}
	if u, ok := a.(*Undefined); ok {
		return 0, undefinedErr(u)
	}
	if u, ok := b.(*Undefined); ok {
		return 0, undefinedErr(u)
	}
	return 0, errorf("TypeError", "'<' not supported between instances of '%s' and '%s'", typeName(a), typeName(b))
}

func cmpOrdered[T int | int64 | float64 | string](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// sortValues sorts vs with Python ordering; key maps each item to its sort key.
func sortValues(vs []Value, key func(Value) Value, reverse bool) error {
	var err error
	sort.SliceStable(vs, func(i, j int) bool {
		a, b := key(vs[i]), key(vs[j])
		if reverse {
			a, b = b, a
		}
		c, e := compareValues(a, b)
		if e != nil && err == nil {
			err = e
		}
		return c == -1
	})
	return err
}

// runeLen is the number of code points of s (Python len).
func runeLen(s string) int { return utf8.RuneCountInString(s) }
