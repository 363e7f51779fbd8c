package jinja

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// strMethods are the Python str methods templates may call.
var strMethods = map[string]bool{
	"strip": true, "lstrip": true, "rstrip": true, "split": true, "rsplit": true, "splitlines": true,
	"startswith": true, "endswith": true, "replace": true, "upper": true, "lower": true, "title": true,
	"capitalize": true, "swapcase": true, "find": true, "rfind": true, "index": true, "rindex": true,
	"count": true, "join": true, "isdigit": true, "isalpha": true, "isalnum": true, "isspace": true,
	"isupper": true, "islower": true, "isnumeric": true, "isdecimal": true, "istitle": true, "zfill": true,
	"removeprefix": true, "removesuffix": true, "center": true, "ljust": true, "rjust": true, "partition": true,
	"rpartition": true, "casefold": true, "format": true,
}

func callMethod(r *renderer, m *boundMethod, args []Value, kwargs *Dict) (Value, error) {
	switch recv := m.recv.(type) {
	case string:
		return strMethod(r, recv, m.name, args, kwargs)
	case *List:
		switch m.name {
		case "index":
			if len(args) < 1 {
				return nil, errorf("TypeError", "index expected at least 1 argument, got 0")
			}
			for i, it := range recv.Items {
				if valuesEqual(it, args[0]) {
					return int64(i), nil
				}
			}
			return nil, errorf("ValueError", "%s is not in list", repr(args[0]))
		case "count":
			if len(args) != 1 {
				return nil, errorf("TypeError", "count() takes exactly one argument (%d given)", len(args))
			}
			n := int64(0)
			for _, it := range recv.Items {
				if valuesEqual(it, args[0]) {
					n++
				}
			}
			return n, nil
		}
	case *Dict:
		switch m.name {
		case "items":
			return &List{Items: pairs(recv), View: "dict_items"}, nil
		case "keys":
			return &List{Items: append([]Value(nil), recv.keys...), View: "dict_keys"}, nil
		case "values":
			return &List{Items: append([]Value(nil), recv.vals...), View: "dict_values"}, nil
		case "copy":
			d := NewDict()
			for i, k := range recv.keys {
				d.Set(k, recv.vals[i])
			}
			return d, nil
		case "get":
			if len(args) < 1 || len(args) > 2 {
				return nil, errorf("TypeError", "get expected 1 or 2 arguments, got %d", len(args))
			}
			if !hashable(args[0]) {
				return nil, errorf("TypeError", "unhashable type: '%s'", typeName(args[0]))
			}
			if v, ok := recv.Get(args[0]); ok {
				return v, nil
			}
			if len(args) == 2 {
				return args[1], nil
			}
			return nil, nil
		}
	}
	return nil, errorf("AttributeError", "'%s' object has no attribute '%s'", typeName(m.recv), m.name)
}

// optString returns an optional string argument (None means absent).
func optString(fn string, v Value) (string, bool, error) {
	if v == nil {
		return "", false, nil
	}
	s, err := wantString(fn, v)
	return s, err == nil, err
}

func strMethod(r *renderer, s, name string, args []Value, kwargs *Dict) (Value, error) {
	a := newArgs(name, args, kwargs)
	switch name {
	case "strip", "lstrip", "rstrip":
		chars, has, err := optString(name, a.get(0, "chars", nil))
		if err != nil {
			return nil, err
		}
		left, right := name != "rstrip", name != "lstrip"
		if !has {
			if left {
				s = strings.TrimLeftFunc(s, isPySpace)
			}
			if right {
				s = strings.TrimRightFunc(s, isPySpace)
			}
			return s, nil
		}
		if left {
			s = strings.TrimLeft(s, chars)
		}
		if right {
			s = strings.TrimRight(s, chars)
		}
		return s, nil
	case "split", "rsplit":
		sep, has, err := optString(name, a.get(0, "sep", nil))
		if err != nil {
			return nil, err
		}
		maxsplit, err := wantInt(name, a.get(1, "maxsplit", int64(-1)))
		if err != nil {
			return nil, err
		}
		var parts []string
		if !has {
			parts = splitWhitespace(s, int(maxsplit), name == "rsplit")
		} else {
			if sep == "" {
				return nil, errorf("ValueError", "empty separator")
			}
			if maxsplit < 0 {
				parts = strings.Split(s, sep)
			} else if name == "split" {
				parts = strings.SplitN(s, sep, int(maxsplit)+1)
			} else {
				parts = rsplitN(s, sep, int(maxsplit))
			}
		}
		out := make([]Value, len(parts))
		for i, p := range parts {
			out[i] = p
		}
		return &List{Items: out}, nil
	case "splitlines":
		keep := truthy(a.get(0, "keepends", false))
		var out []Value
		for _, ln := range splitLines(s, keep) {
			out = append(out, ln)
		}
		return &List{Items: out}, nil
	case "startswith", "endswith":
		if len(args) < 1 {
			return nil, errorf("TypeError", "%s() takes at least 1 argument (0 given)", name)
		}
		sub := s
		if len(args) > 1 {
			rs := []rune(s)
			var startP, endP *int64
			if st, ok := asInt(args[1]); ok {
				startP = &st
			}
			if len(args) > 2 {
				if en, ok := asInt(args[2]); ok {
					endP = &en
				}
			}
			st, en := sliceBounds(startP, endP, 1, int64(len(rs)))
			if st > en {
				return false, nil
			}
			sub = string(rs[st:en])
		}
		var cands []Value
		switch x := args[0].(type) {
		case string:
			cands = []Value{x}
		case *List:
			if !x.Tuple {
				return nil, errorf("TypeError", "%s first arg must be str or a tuple of str, not list", name)
			}
			cands = x.Items
		default:
			return nil, errorf("TypeError", "%s first arg must be str or a tuple of str, not %s", name, typeName(args[0]))
		}
		for _, c := range cands {
			cs, err := wantString(name, c)
			if err != nil {
				return nil, err
			}
			if (name == "startswith" && strings.HasPrefix(sub, cs)) || (name == "endswith" && strings.HasSuffix(sub, cs)) {
				return true, nil
			}
		}
		return false, nil
	case "replace":
		if len(args) < 2 {
			return nil, errorf("TypeError", "replace expected at least 2 arguments, got %d", len(args))
		}
		old, err := wantString(name, args[0])
		if err != nil {
			return nil, err
		}
		nw, err := wantString(name, args[1])
		if err != nil {
			return nil, err
		}
		n := int64(-1)
		if len(args) > 2 {
			if n, err = wantInt(name, args[2]); err != nil {
				return nil, err
			}
		}
		return pyReplace(s, old, nw, n)
	case "upper":
		return pyUpper(s), nil
	case "lower":
		return pyLower(s), nil
	case "casefold":
		return pyLower(strings.ReplaceAll(s, "ß", "ss")), nil
	case "title":
		return pyTitle(s), nil
	case "capitalize":
		return pyCapitalize(s), nil
	case "swapcase":
		return pySwapcase(s), nil
	case "find", "rfind", "index", "rindex", "count":
		if len(args) < 1 {
			return nil, errorf("TypeError", "%s() takes at least 1 argument (0 given)", name)
		}
		sub, err := wantString(name, args[0])
		if err != nil {
			return nil, err
		}
		if name == "count" {
			if sub == "" {
				return int64(runeLen(s) + 1), nil
			}
			return int64(strings.Count(s, sub)), nil
		}
		var i int
		if name == "find" || name == "index" {
			i = strings.Index(s, sub)
		} else {
			i = strings.LastIndex(s, sub)
		}
		if i < 0 {
			if name == "index" || name == "rindex" {
				return nil, errorf("ValueError", "substring not found")
			}
			return int64(-1), nil
		}
		return int64(runeLen(s[:i])), nil
	case "join":
		if len(args) != 1 {
			return nil, errorf("TypeError", "join() takes exactly one argument (%d given)", len(args))
		}
		items, err := r.iterate(args[0])
		if err != nil {
			return nil, err
		}
		parts := make([]string, len(items))
		for i, it := range items {
			p, ok := it.(string)
			if !ok {
				return nil, errorf("TypeError", "sequence item %d: expected str instance, %s found", i, typeName(it))
			}
			parts[i] = p
		}
		return strings.Join(parts, s), nil
	case "isdigit", "isnumeric", "isdecimal":
		return s != "" && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsDigit(r) }) < 0, nil
	case "isalpha":
		return s != "" && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsLetter(r) }) < 0, nil
	case "isalnum":
		return s != "" && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) < 0, nil
	case "isspace":
		return s != "" && strings.IndexFunc(s, func(r rune) bool { return !isPySpace(r) }) < 0, nil
	case "isupper":
		return hasCased(s) && strings.IndexFunc(s, unicode.IsLower) < 0, nil
	case "islower":
		return hasCased(s) && strings.IndexFunc(s, unicode.IsUpper) < 0, nil
	case "istitle":
		return hasCased(s) && pyTitle(s) == s, nil
	case "zfill", "center", "ljust", "rjust":
		w, err := wantInt(name, a.get(0, "width", int64(0)))
		if err != nil {
			return nil, err
		}
		if w > maxCollection {
			return nil, errorf("RuntimeError", "string too large")
		}
		n := int64(runeLen(s))
		if w <= n {
			return s, nil
		}
		fill := " "
		if len(args) > 1 {
			fill = toStr(args[1])
		}
		pad := int(w - n)
		switch name {
		case "zfill":
			sign := ""
			if strings.HasPrefix(s, "-") || strings.HasPrefix(s, "+") {
				sign, s = s[:1], s[1:]
			}
			return sign + strings.Repeat("0", pad) + s, nil
		case "ljust":
			return s + strings.Repeat(fill, pad), nil
		case "rjust":
			return strings.Repeat(fill, pad) + s, nil
		}
		left := pad / 2
		if pad%2 == 1 && w%2 == 1 {
			left++
		}
		return strings.Repeat(fill, left) + s + strings.Repeat(fill, pad-left), nil
	case "format":
		return strFormat(s, args, kwargs)
	case "removeprefix", "removesuffix":
		if len(args) != 1 {
			return nil, errorf("TypeError", "%s() takes exactly one argument", name)
		}
		x, err := wantString(name, args[0])
		if err != nil {
			return nil, err
		}
		if name == "removeprefix" {
			return strings.TrimPrefix(s, x), nil
		}
		return strings.TrimSuffix(s, x), nil
	case "partition", "rpartition":
		if len(args) != 1 {
			return nil, errorf("TypeError", "%s() takes exactly one argument", name)
		}
		sep, err := wantString(name, args[0])
		if err != nil {
			return nil, err
		}
		if sep == "" {
			return nil, errorf("ValueError", "empty separator")
		}
		var i int
		if name == "partition" {
			i = strings.Index(s, sep)
		} else {
			i = strings.LastIndex(s, sep)
		}
		if i < 0 {
			if name == "partition" {
				return &List{Items: []Value{s, "", ""}, Tuple: true}, nil
			}
			return &List{Items: []Value{"", "", s}, Tuple: true}, nil
		}
		return &List{Items: []Value{s[:i], sep, s[i+len(sep):]}, Tuple: true}, nil
	}
	return nil, errorf("AttributeError", "'str' object has no attribute '%s'", name)
}

// splitWhitespace is Python's str.split() / str.rsplit() without a separator.
func splitWhitespace(s string, maxsplit int, fromRight bool) []string {
	if maxsplit < 0 {
		return strings.FieldsFunc(s, isPySpace)
	}
	if !fromRight {
		var out []string
		s = strings.TrimLeftFunc(s, isPySpace)
		for s != "" {
			if len(out) == maxsplit {
				out = append(out, s)
				return out
			}
			i := strings.IndexFunc(s, isPySpace)
			if i < 0 {
				out = append(out, s)
				return out
			}
			out = append(out, s[:i])
			s = strings.TrimLeftFunc(s[i:], isPySpace)
		}
		return out
	}
	var rev []string
	s = strings.TrimRightFunc(s, isPySpace)
	for s != "" {
		if len(rev) == maxsplit {
			rev = append(rev, s)
			break
		}
		i := strings.LastIndexFunc(s, isPySpace)
		if i < 0 {
			rev = append(rev, s)
			break
		}
		_, n := utf8.DecodeRuneInString(s[i:])
		rev = append(rev, s[i+n:])
		s = strings.TrimRightFunc(s[:i], isPySpace)
	}
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	return rev
}

func rsplitN(s, sep string, maxsplit int) []string {
	var rev []string
	for len(rev) < maxsplit {
		i := strings.LastIndex(s, sep)
		if i < 0 {
			break
		}
		rev = append(rev, s[i+len(sep):])
		s = s[:i]
	}
	rev = append(rev, s)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	return rev
}

// isCased reports whether r is a cased letter (Lu, Ll, Lt), as Python's str.title uses.
func isCased(r rune) bool { return unicode.IsUpper(r) || unicode.IsLower(r) || unicode.IsTitle(r) }

// splitLines is Python's str.splitlines.
func splitLines(s string, keep bool) []string {
	var out []string
	for len(s) > 0 {
		i := strings.IndexAny(s, "\n\r\v\f\x1c\x1d\x1e\u0085\u2028\u2029")
		if i < 0 {
			out = append(out, s)
			break
		}
		_, n := utf8.DecodeRuneInString(s[i:])
		if s[i] == '\r' && i+1 < len(s) && s[i+1] == '\n' {
			n = 2
		}
		if keep {
			out = append(out, s[:i+n])
		} else {
			out = append(out, s[:i])
		}
		s = s[i+n:]
	}
	return out
}

// pySplitlines is str.splitlines() without the line ends.
func pySplitlines(s string) []string { return splitLines(s, false) }
