// Package jinja is a Jinja2 template engine for chat templates. It reproduces the output of
// Python's jinja2 as Hugging Face transformers configures it for chat templates: an
// ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loopcontrols
// extension, a {% generation %} block whose output spans are reported, and Python semantics
// for values (str/repr of lists, dicts and floats, int/float arithmetic, string methods,
// json.dumps for tojson).
//
// It is not a general Jinja implementation: there is no autoescaping, no template
// inheritance, includes or imports, no recursive loops, and only the filters, tests and
// methods that chat templates use. Runaway templates are stopped by limits on output size,
// evaluation steps and call depth.
package jinja

import (
	"fmt"
	"math"
	"reflect"
	"sort"
	"strings"
	"time"
)

// Template is a compiled template. It is safe for concurrent use.
type Template struct {
	body []node
}

// Compile parses a template source.
func Compile(src string) (t *Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			t, err = nil, fmt.Errorf("template: internal error while parsing: %v", r)
		}
	}()
	body, err := parse(src)
	if err != nil {
		return nil, err
	}
	return &Template{body: body}, nil
}

// UsesGeneration reports whether the template has {% generation %} blocks.
func (t *Template) UsesGeneration() bool {
	found := false
	var walk func([]node)
	walk = func(ns []node) {
		for _, n := range ns {
			switch x := n.(type) {
			case *generationNode:
				found = true
			case *ifNode:
				for _, b := range x.bodies {
					walk(b)
				}
				walk(x.orelse)
			case *forNode:
				walk(x.body)
				walk(x.orelse)
			case *macroNode:
				walk(x.body)
			case *setBlockNode:
				walk(x.body)
			case *filterBlockNode:
				walk(x.body)
			case *withNode:
				walk(x.body)
			case *callBlockNode:
				walk(x.body)
			}
		}
	}
	walk(t.body)
	return found
}

// Render executes the template with vars as its context (they may shadow the built-in
// globals). It returns the output and the byte spans of {% generation %} blocks rendered at
// the top level of the output.
func (t *Template) Render(vars map[string]Value) (out string, spans []Span, err error) {
	r := &renderer{out: &strings.Builder{}}
	defer func() {
		if p := recover(); p != nil {
			out, spans, err = "", nil, fmt.Errorf("template: internal error while rendering: %v", p)
		}
	}()
	global := newScope(nil)
	for k, v := range globals {
		global.set(k, v)
	}
	for k, v := range vars {
		global.set(k, v)
	}
	top := newScope(global)
	if err := r.execBody(t.body, top); err != nil {
		if err == errBreak || err == errContinue {
			return "", nil, &Error{Kind: "TemplateSyntaxError", Msg: "break or continue outside of a loop"}
		}
		return "", nil, err
	}
	return r.out.String(), r.genSpans, nil
}

// NewFunc wraps a Go function as a template callable.
func NewFunc(name string, fn func(args []Value, kwargs map[string]Value) (Value, error)) *Func {
	return &Func{Name: name, Fn: func(_ *renderer, args []Value, kw *Dict) (Value, error) {
		m := make(map[string]Value, kw.Len())
		for i, k := range kw.keys {
			m[k.(string)] = kw.vals[i]
		}
		return fn(args, m)
	}}
}

// StrftimeNow returns the strftime_now(format) global of transformers, reading the clock now.
func StrftimeNow(now func() time.Time) *Func {
	return NewFunc("strftime_now", func(args []Value, _ map[string]Value) (Value, error) {
		if len(args) != 1 {
			return nil, errorf("TypeError", "strftime_now() takes exactly one argument (%d given)", len(args))
		}
		f, ok := args[0].(string)
		if !ok {
			return nil, errorf("TypeError", "strftime() argument 1 must be str, not %s", typeName(args[0]))
		}
		return Strftime(now(), f), nil
	})
}

var (
	weekdays = []string{"Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"}
	months   = []string{"January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"}
)

// Strftime formats t with Python's (C locale) strftime directives.
func Strftime(t time.Time, format string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 >= len(format) {
			b.WriteByte(c)
			continue
		}
		i++
		switch format[i] {
		case 'Y':
			fmt.Fprintf(&b, "%d", t.Year())
		case 'y':
			fmt.Fprintf(&b, "%02d", t.Year()%100)
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'e':
			fmt.Fprintf(&b, "%2d", t.Day())
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'I':
			h := t.Hour() % 12
			if h == 0 {
				h = 12
			}
			fmt.Fprintf(&b, "%02d", h)
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case 'f':
			fmt.Fprintf(&b, "%06d", t.Nanosecond()/1000)
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'A':
			b.WriteString(weekdays[t.Weekday()])
		case 'a':
			b.WriteString(weekdays[t.Weekday()][:3])
		case 'B':
			b.WriteString(months[t.Month()-1])
		case 'b', 'h':
			b.WriteString(months[t.Month()-1][:3])
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case 'w':
			fmt.Fprintf(&b, "%d", int(t.Weekday()))
		case 'u':
			wd := int(t.Weekday())
			if wd == 0 {
				wd = 7
			}
			fmt.Fprintf(&b, "%d", wd)
		case 'Z':
			name, _ := t.Zone()
			b.WriteString(name)
		case 'z':
			_, off := t.Zone()
			sign := '+'
			if off < 0 {
				sign, off = '-', -off
			}
			fmt.Fprintf(&b, "%c%02d%02d", sign, off/3600, off%3600/60)
		case 'F':
			fmt.Fprintf(&b, "%d-%02d-%02d", t.Year(), int(t.Month()), t.Day())
		case 'T':
			fmt.Fprintf(&b, "%02d:%02d:%02d", t.Hour(), t.Minute(), t.Second())
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(format[i])
		}
	}
	return b.String()
}

// FromGo converts a Go value to a template value: nil, bool, integers, floats, strings,
// slices, maps with string keys (keys sorted), Value types and json.RawMessage-like byte
// slices are not interpreted (use FromJSON).
func FromGo(v any) Value {
	switch x := v.(type) {
	case nil:
		return nil
	case bool, int64, float64, string, *List, *Dict, *Namespace, *Undefined, *Func:
		return x
	case int:
		return int64(x)
	case int32:
		return int64(x)
	case float32:
		return float64(x)
	case []any:
		out := make([]Value, len(x))
		for i, it := range x {
			out[i] = FromGo(it)
		}
		return &List{Items: out}
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		d := NewDict()
		for _, k := range keys {
			d.Set(k, FromGo(x[k]))
		}
		return d
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if rv.Uint() <= math.MaxInt64 {
			return int64(rv.Uint())
		}
		return float64(rv.Uint())
	case reflect.Float32, reflect.Float64:
		return rv.Float()
	case reflect.String:
		return rv.String()
	case reflect.Bool:
		return rv.Bool()
	case reflect.Slice, reflect.Array:
		out := make([]Value, rv.Len())
		for i := range out {
			out[i] = FromGo(rv.Index(i).Interface())
		}
		return &List{Items: out}
	case reflect.Map:
		if rv.Type().Key().Kind() == reflect.String {
			keys := make([]string, 0, rv.Len())
			for _, k := range rv.MapKeys() {
				keys = append(keys, k.String())
			}
			sort.Strings(keys)
			d := NewDict()
			for _, k := range keys {
				d.Set(k, FromGo(rv.MapIndex(reflect.ValueOf(k).Convert(rv.Type().Key())).Interface()))
			}
			return d
		}
	case reflect.Pointer:
		if rv.IsNil() {
			return nil
		}
		return FromGo(rv.Elem().Interface())
	}
	return &Undefined{hint: fmt.Sprintf("cannot use a Go %T in a template", v)}
}

// Str is Python's str(v) as Jinja prints it.
func Str(v Value) string { return toStr(v) }
