package jinja

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// strFormat is Python's str.format as the sandbox allows it: positional ({} or {0}) and
// named fields, attribute and index lookups in field names, !r and !s conversions, and format
// specs [[fill]align][sign][0][width][,][.precision][type] for strings, ints and floats.
func strFormat(format string, args []Value, kwargs *Dict) (Value, error) {
	var b strings.Builder
	auto := 0
	for i := 0; i < len(format); {
		c := format[i]
		if c == '}' {
			if i+1 < len(format) && format[i+1] == '}' {
				b.WriteByte('}')
				i += 2
				continue
			}
			return nil, errorf("ValueError", "Single '}' encountered in format string")
		}
		if c != '{' {
			b.WriteByte(c)
			i++
			continue
		}
		if i+1 < len(format) && format[i+1] == '{' {
			b.WriteByte('{')
			i += 2
			continue
		}
		end := strings.IndexByte(format[i:], '}')
		if end < 0 {
			return nil, errorf("ValueError", "Single '{' encountered in format string")
		}
		field := format[i+1 : i+end]
		i += end + 1
		spec := ""
		if k := strings.IndexByte(field, ':'); k >= 0 {
			field, spec = field[:k], field[k+1:]
		}
		conv := ""
		if k := strings.IndexByte(field, '!'); k >= 0 {
			field, conv = field[:k], field[k+1:]
		}
		// the first part of the field name selects the argument
		name := field
		rest := ""
		if k := strings.IndexAny(field, ".["); k >= 0 {
			name, rest = field[:k], field[k:]
		}
		var v Value
		switch {
		case name == "":
			if auto >= len(args) {
				return nil, errorf("IndexError", "Replacement index %d out of range for positional args tuple", auto)
			}
			v = args[auto]
			auto++
		case name[0] >= '0' && name[0] <= '9':
			n, err := strconv.Atoi(name)
			if err != nil || n >= len(args) {
				return nil, errorf("IndexError", "Replacement index %s out of range for positional args tuple", name)
			}
			v = args[n]
		default:
			kv, ok := kwargs.Get(name)
			if !ok {
				return nil, errorf("KeyError", "'%s'", name)
			}
			v = kv
		}
		for rest != "" {
			var err error
			if rest[0] == '.' {
				k := strings.IndexAny(rest[1:], ".[")
				attr := rest[1:]
				if k >= 0 {
					attr, rest = rest[1:k+1], rest[k+1:]
				} else {
					rest = ""
				}
				if v, err = getAttr(v, attr); err != nil {
					return nil, err
				}
				continue
			}
			if rest[0] != '[' {
				return nil, errorf("ValueError", "Only '.' or '[' may follow ']' in format field specifier")
			}
			k := strings.IndexByte(rest, ']')
			if k < 0 {
				return nil, errorf("ValueError", "Missing ']' in format string")
			}
			key := rest[1:k]
			rest = rest[k+1:]
			var kv Value = key
			if n, e := strconv.ParseInt(key, 10, 64); e == nil {
				kv = n
			}
			if v, err = getItem(v, kv); err != nil {
				return nil, err
			}
		}
		switch conv {
		case "":
		case "r":
			v = repr(v)
		case "s":
			v = toStr(v)
		default:
			return nil, errorf("ValueError", "Unknown conversion specifier %s", conv)
		}
		s, err := formatSpec(v, spec)
		if err != nil {
			return nil, err
		}
		b.WriteString(s)
		if b.Len() > maxOutput {
			return nil, errorf("RuntimeError", "string too large")
		}
	}
	return b.String(), nil
}

// formatSpec applies a Python format spec to one value.
func formatSpec(v Value, spec string) (string, error) {
	if spec == "" {
		return toStr(v), nil
	}
	fill, align := " ", byte(0)
	if r, n := utf8.DecodeRuneInString(spec); n < len(spec) && strings.IndexByte("<>^=", spec[n]) >= 0 {
		fill, align, spec = string(r), spec[n], spec[n+1:]
	} else if len(spec) > 0 && strings.IndexByte("<>^=", spec[0]) >= 0 {
		align, spec = spec[0], spec[1:]
	}
	sign := byte('-')
	if len(spec) > 0 && strings.IndexByte("+- ", spec[0]) >= 0 {
		sign, spec = spec[0], spec[1:]
	}
	if len(spec) > 0 && spec[0] == '0' {
		if align == 0 {
			fill, align = "0", '='
		}
		spec = spec[1:]
	}
	width := 0
	for len(spec) > 0 && spec[0] >= '0' && spec[0] <= '9' {
		width = width*10 + int(spec[0]-'0')
		spec = spec[1:]
		if width > 1<<20 {
			return "", errorf("ValueError", "Too many decimal digits in format string")
		}
	}
	comma := false
	if len(spec) > 0 && spec[0] == ',' {
		comma, spec = true, spec[1:]
	}
	prec := -1
	if len(spec) > 0 && spec[0] == '.' {
		spec = spec[1:]
		prec = 0
		for len(spec) > 0 && spec[0] >= '0' && spec[0] <= '9' {
			prec = prec*10 + int(spec[0]-'0')
			spec = spec[1:]
			if prec > 1000 {
				return "", errorf("ValueError", "Too many decimal digits in format string")
			}
		}
	}
	typ := byte(0)
	if len(spec) == 1 {
		typ = spec[0]
	} else if len(spec) > 1 {
		return "", errorf("ValueError", "Invalid format specifier")
	}
	var body string
	numeric := false
	negative := false
	switch x := v.(type) {
	case string:
		if typ != 0 && typ != 's' {
			return "", errorf("ValueError", "Unknown format code '%c' for object of type 'str'", typ)
		}
		body = x
		if prec >= 0 && prec < runeLen(body) {
			body = string([]rune(body)[:prec])
		}
		if align == 0 {
			align = '<'
		}
	case bool, int64:
		i, _ := asInt(x)
		numeric = true
		switch typ {
		case 0, 'd':
			if prec >= 0 {
				return "", errorf("ValueError", "Precision not allowed in integer format specifier")
			}
			negative = i < 0
			if negative {
				i = -i
			}
			body = strconv.FormatInt(i, 10)
			if comma {
				body = groupThousands(body)
			}
		case 'f', 'F', 'e', 'E', 'g', 'G', '%':
			return formatSpec(float64(i), fmtSpecString(fill, align, sign, width, comma, prec, typ))
		case 'x', 'X', 'o', 'b':
			negative = i < 0
			if negative {
				i = -i
			}
			base := map[byte]int{'x': 16, 'X': 16, 'o': 8, 'b': 2}[typ]
			body = strconv.FormatInt(i, base)
			if typ == 'X' {
				body = strings.ToUpper(body)
			}
		default:
			return "", errorf("ValueError", "Unknown format code '%c' for object of type 'int'", typ)
		}
	case float64:
		numeric = true
		negative = x < 0 || (x == 0 && 1/x < 0)
		f := x
		if negative {
			f = -f
		}
		switch typ {
		case 0:
			if prec < 0 {
				body = pyFloatRepr(f)
			} else {
				body = strconv.FormatFloat(f, 'g', max(prec, 1), 64)
			}
		case 'f', 'F':
			if prec < 0 {
				prec = 6
			}
			body = strconv.FormatFloat(f, 'f', prec, 64)
		case 'e', 'E':
			if prec < 0 {
				prec = 6
			}
			body = strconv.FormatFloat(f, 'e', prec, 64) // Go writes exponents as Python does (e+04)
		case 'g', 'G':
			if prec < 0 {
				prec = 6
			}
			body = strconv.FormatFloat(f, 'g', max(prec, 1), 64)
		case '%':
			if prec < 0 {
				prec = 6
			}
			body = strconv.FormatFloat(f*100, 'f', prec, 64) + "%"
		default:
			return "", errorf("ValueError", "Unknown format code '%c' for object of type 'float'", typ)
		}
		if typ == 'E' || typ == 'G' || typ == 'F' {
			body = strings.ToUpper(body)
		}
		if comma {
			intPart, frac, _ := strings.Cut(body, ".")
			body = groupThousands(intPart)
			if frac != "" {
				body += "." + frac
			}
		}
	default:
		if typ != 0 {
			return "", errorf("TypeError", "unsupported format string passed to %s.__format__", typeName(v))
		}
		body = toStr(v)
		if align == 0 {
			align = '<'
		}
	}
	prefix := ""
	if numeric {
		switch {
		case negative:
			prefix = "-"
		case sign == '+':
			prefix = "+"
		case sign == ' ':
			prefix = " "
		}
		if align == 0 {
			align = '>'
		}
	}
	pad := width - runeLen(prefix+body)
	if pad <= 0 {
		return prefix + body, nil
	}
	switch align {
	case '<':
		return prefix + body + strings.Repeat(fill, pad), nil
	case '^':
		left := pad / 2
		return strings.Repeat(fill, left) + prefix + body + strings.Repeat(fill, pad-left), nil
	case '=':
		return prefix + strings.Repeat(fill, pad) + body, nil
	}
	return strings.Repeat(fill, pad) + prefix + body, nil
}

func fmtSpecString(fill string, align, sign byte, width int, comma bool, prec int, typ byte) string {
	var b strings.Builder
	if align != 0 {
		b.WriteString(fill)
		b.WriteByte(align)
	}
	b.WriteByte(sign)
	if width > 0 {
		fmt.Fprintf(&b, "%d", width)
	}
	if comma {
		b.WriteByte(',')
	}
	if prec >= 0 {
		fmt.Fprintf(&b, ".%d", prec)
	}
	b.WriteByte(typ)
	return b.String()
}

func groupThousands(digits string) string {
	if len(digits) <= 3 {
		return digits
	}
	var b strings.Builder
	first := len(digits) % 3
	if first > 0 {
		b.WriteString(digits[:first])
	}
	for i := first; i < len(digits); i += 3 {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(digits[i : i+3])
	}
	return b.String()
}
