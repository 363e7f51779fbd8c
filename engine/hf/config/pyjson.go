package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/halo-shell/halo-shell/internal/pyfmt"
)

// This file holds a small JSON value model that writes exactly what Python's
// json.dumps(obj, indent=2, sort_keys=True) writes (the call transformers' to_json_string makes):
// floats in Python repr form (1e-06, 0.02, 10000.0), integers as integers, non-ASCII escaped as
// \uXXXX, keys sorted at every level, "[]" and "{}" for empty containers.

// pyValue is one of: nil (null), bool, pyInt, float64, string, []pyValue, pyObject.
type pyValue any

// pyInt is an integer as Python keeps it: arbitrary precision, written in decimal.
type pyInt string

// pyObject is a JSON object; keys are sorted when written.
type pyObject map[string]pyValue

// pyIntKeys is a Python dict with int keys (gemma4_text's per_layer_config): written as a JSON
// object in numeric key order, each key zero-padded to the width of the largest, as
// transformers writes per_layer_config.
type pyIntKeys map[int]pyValue

func intValue(v int) pyValue { return pyInt(strconv.Itoa(v)) }

// floatValue is a float written in Python repr form, or as an integer when the source file wrote
// it as an integer literal and it still holds an integral value (Python keeps ints as ints).
func floatValue(v float64, asInt bool) pyValue {
	if asInt && v == math.Trunc(v) && math.Abs(v) < 1<<53 {
		return pyInt(strconv.FormatInt(int64(v), 10))
	}
	return v
}

// encodePy writes v followed by a newline, as Python's json.dumps(v, indent=2, sort_keys=True)
// + "\n" does.
func encodePy(v pyValue) ([]byte, error) {
	var b bytes.Buffer
	if err := writePy(&b, v, 0); err != nil {
		return nil, err
	}
	b.WriteByte('\n')
	return b.Bytes(), nil
}

func writePy(b *bytes.Buffer, v pyValue, depth int) error {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if x {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case pyInt:
		b.WriteString(string(x))
	case float64:
		s, err := pyFloatRepr(x)
		if err != nil {
			return err
		}
		b.WriteString(s)
	case string:
		writePyString(b, x)
	case []pyValue:
		if len(x) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteString("[\n")
		for i, e := range x {
			indent(b, depth+1)
			if err := writePy(b, e, depth+1); err != nil {
				return err
			}
			if i < len(x)-1 {
				b.WriteByte(',')
			}
			b.WriteByte('\n')
		}
		indent(b, depth)
		b.WriteByte(']')
	case pyIntKeys:
		// transformers 5.17 writes the keys as strings zero-padded to the digits of the largest
		// one (str(i).zfill), so that json.dumps(sort_keys=True) keeps them in numeric order.
		keys := make([]int, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		if len(keys) == 0 {
			b.WriteString("{}")
			return nil
		}
		sort.Ints(keys)
		width := len(strconv.Itoa(keys[len(keys)-1]))
		b.WriteString("{\n")
		for i, k := range keys {
			indent(b, depth+1)
			writePyString(b, fmt.Sprintf("%0*d", width, k))
			b.WriteString(": ")
			if err := writePy(b, x[k], depth+1); err != nil {
				return err
			}
			if i < len(keys)-1 {
				b.WriteByte(',')
			}
			b.WriteByte('\n')
		}
		indent(b, depth)
		b.WriteByte('}')
	case pyObject:
		if len(x) == 0 {
			b.WriteString("{}")
			return nil
		}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sortPyKeys(keys)
		b.WriteString("{\n")
		for i, k := range keys {
			indent(b, depth+1)
			writePyString(b, k)
			b.WriteString(": ")
			if err := writePy(b, x[k], depth+1); err != nil {
				return err
			}
			if i < len(keys)-1 {
				b.WriteByte(',')
			}
			b.WriteByte('\n')
		}
		indent(b, depth)
		b.WriteByte('}')
	default:
		return fmt.Errorf("config: internal error: cannot encode %T", v)
	}
	return nil
}

func indent(b *bytes.Buffer, depth int) {
	for i := 0; i < depth; i++ {
		b.WriteString("  ")
	}
}

// sortPyKeys sorts as Python sorts str keys: by code point. Go compares strings byte-wise in
// UTF-8, which orders code points the same way.
func sortPyKeys(keys []string) { sort.Strings(keys) }

// writePyString writes s as Python's json module does with ensure_ascii=True.
func writePyString(b *bytes.Buffer, s string) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r < 0x20 || r > 0x7e:
			write16 := func(u rune) {
				b.WriteString(`\u`)
				b.WriteByte(hex[u>>12&0xf])
				b.WriteByte(hex[u>>8&0xf])
				b.WriteByte(hex[u>>4&0xf])
				b.WriteByte(hex[u&0xf])
			}
			if r > 0xffff {
				r -= 0x10000
				write16(0xd800 + (r>>10)&0x3ff)
				write16(0xdc00 + r&0x3ff)
			} else {
				write16(r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}

// pyFloatRepr formats f as Python's repr(float): the shortest digits that round-trip, fixed
// notation with at least one decimal for exponents in [-4, 16), scientific otherwise with a
// signed two-digit-minimum exponent. NaN and infinities cannot be written.
func pyFloatRepr(f float64) (string, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return "", fmt.Errorf("config: cannot write %v: config.json holds finite numbers only", f)
	}
	return pyfmt.FloatRepr(f), nil
}

// decodePy turns raw JSON into a pyValue the way Python's json.loads would see it: integer
// literals stay integers, other numbers become floats.
func decodePy(raw []byte) (pyValue, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return fromGo(v)
}

func fromGo(v any) (pyValue, error) {
	switch x := v.(type) {
	case nil, bool, string:
		return x, nil
	case json.Number:
		return numberValue(string(x))
	case []any:
		out := make([]pyValue, len(x))
		for i, e := range x {
			p, err := fromGo(e)
			if err != nil {
				return nil, err
			}
			out[i] = p
		}
		return out, nil
	case map[string]any:
		out := make(pyObject, len(x))
		for k, e := range x {
			p, err := fromGo(e)
			if err != nil {
				return nil, err
			}
			out[k] = p
		}
		return out, nil
	}
	return nil, fmt.Errorf("unexpected JSON value %T", v)
}

// isIntLiteral reports whether a JSON number literal is an integer literal (no fraction or
// exponent), which Python's json.loads reads as int.
func isIntLiteral(lit string) bool { return !strings.ContainsAny(lit, ".eE") }

func numberValue(lit string) (pyValue, error) {
	if isIntLiteral(lit) {
		var n big.Int
		if _, ok := n.SetString(lit, 10); !ok {
			return nil, fmt.Errorf("bad integer %q", lit)
		}
		return pyInt(n.String()), nil
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil || math.IsInf(f, 0) {
		return nil, fmt.Errorf("number %s is out of the float64 range", lit)
	}
	return f, nil
}

// jsonKind names the JSON type of a raw value for error messages.
func jsonKind(raw []byte) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '"':
		return "string " + truncate(string(raw), 40)
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "boolean " + string(raw)
	case 'n':
		return "null"
	default:
		return "number " + truncate(string(raw), 40)
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
