package jinja

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// jsonOptions are the arguments of Python's json.dumps that tojson exposes.
type jsonOptions struct {
	ensureASCII bool
	hasIndent   bool
	indent      string
	itemSep     string
	keySep      string
	sortKeys    bool
}

// writeJSON writes v as Python's json.dumps would.
func writeJSON(b *strings.Builder, v Value, o *jsonOptions, level int) error {
	if level > 500 {
		return errorf("ValueError", "tojson: value nests too deeply (circular reference?)")
	}
	if b.Len() > maxOutput {
		return errorf("RuntimeError", "tojson: output too large")
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if x {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		b.WriteString(jsonFloat(x))
	case *big.Int:
		b.WriteString(x.String())
	case string:
		writeJSONString(b, x, o.ensureASCII)
	case *List:
		if x.View != "" {
			return errorf("TypeError", "Object of type %s is not JSON serializable", x.View)
		}
		if len(x.Items) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, it := range x.Items {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			o.newline(b, level+1)
			if err := writeJSON(b, it, o, level+1); err != nil {
				return err
			}
		}
		o.newline(b, level)
		b.WriteByte(']')
	case *Dict:
		if x.Len() == 0 {
			b.WriteString("{}")
			return nil
		}
		idx := make([]int, x.Len())
		for i := range idx {
			idx[i] = i
		}
		if o.sortKeys {
			var err error
			sort.SliceStable(idx, func(i, j int) bool {
				c, e := compareValues(x.keys[idx[i]], x.keys[idx[j]])
				if e != nil && err == nil {
					err = e
				}
				return c < 0
			})
			if err != nil {
				return err
			}
		}
		b.WriteByte('{')
		for n, i := range idx {
			if n > 0 {
				b.WriteString(o.itemSep)
			}
			o.newline(b, level+1)
			var ks string
			switch k := x.keys[i].(type) {
			case string:
				ks = k
			case nil:
				ks = "null"
			case bool:
				ks = map[bool]string{true: "true", false: "false"}[k]
			case int64:
				ks = strconv.FormatInt(k, 10)
			case float64:
				ks = jsonFloat(k)
			default:
				return errorf("TypeError", "keys must be str, int, float, bool or None, not %s", typeName(k))
			}
			writeJSONString(b, ks, o.ensureASCII)
			b.WriteString(o.keySep)
			if err := writeJSON(b, x.vals[i], o, level+1); err != nil {
				return err
			}
		}
		o.newline(b, level)
		b.WriteByte('}')
	default:
		return errorf("TypeError", "Object of type %s is not JSON serializable", typeName(v))
	}
	return nil
}

func (o *jsonOptions) newline(b *strings.Builder, level int) {
	if !o.hasIndent {
		return
	}
	b.WriteByte('\n')
	for i := 0; i < level; i++ {
		b.WriteString(o.indent)
	}
}

func jsonFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	return pyFloatRepr(f)
}

// writeJSONString writes s as a JSON string literal the way Python's json module does.
func writeJSONString(b *strings.Builder, s string, ensureASCII bool) {
	b.WriteByte('"')
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			r = 0xfffd
		}
		i += n
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20:
				fmt.Fprintf(b, `\u%04x`, r)
			case ensureASCII && r > 0x7e:
				if r > 0xffff {
					r -= 0x10000
					fmt.Fprintf(b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
				} else {
					fmt.Fprintf(b, `\u%04x`, r)
				}
			default:
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// FromJSON decodes JSON into a template value the way Python's json.loads does: objects keep
// their key order, numbers without a fraction or exponent are ints, others floats.
func FromJSON(data []byte) (Value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeJSONValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("unexpected data after the JSON value")
	}
	return v, nil
}

func decodeJSONValue(dec *json.Decoder, depth int) (Value, error) {
	if depth > 1000 {
		return nil, fmt.Errorf("JSON nests more than 1000 levels deep")
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '[':
			l := &List{}
			for dec.More() {
				v, err := decodeJSONValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				l.Items = append(l.Items, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return l, nil
		case '{':
			d := NewDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, ok := kt.(string)
				if !ok {
					return nil, fmt.Errorf("object key is not a string")
				}
				v, err := decodeJSONValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				d.Set(k, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return d, nil
		}
		return nil, fmt.Errorf("unexpected %v", t)
	case json.Number:
		return NumberValue(string(t)), nil
	case string:
		return t, nil
	case bool:
		return t, nil
	case nil:
		return nil, nil
	}
	return nil, fmt.Errorf("unexpected JSON token %v", tok)
}

// NumberValue converts a JSON number literal to an int64 (no fraction or exponent, fits) or
// a float64, as Python's json module does.
func NumberValue(s string) Value {
	if !strings.ContainsAny(s, ".eE") {
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			return i
		}
	}
	f, _ := strconv.ParseFloat(s, 64)
	return f
}
