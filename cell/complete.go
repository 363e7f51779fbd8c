package cell

import (
	"go/token"
	"reflect"
	"sort"
	"strings"
	"unicode"

	"github.com/traefik/yaegi/stdlib"

	"github.com/halo-shell/halo-shell/cell/halo"
	"github.com/halo-shell/halo-shell/cell/internal/symbols"
)

var builtins = []string{"append", "cap", "clear", "close", "complex", "copy", "delete", "false", "imag", "iota", "len", "make", "max", "min", "new", "nil", "panic", "print", "println", "real", "recover", "true",
	"bool", "byte", "complex128", "complex64", "error", "float32", "float64", "int", "int16", "int32", "int64", "int8", "rune", "string", "uint", "uint16", "uint32", "uint64", "uint8", "uintptr", "any"}

// Complete returns completions for the text before cursor (a byte offset into src): command
// names after ':' or '%', hyperparameter keys after set, package members after "pkg.", and
// declared names, imported packages, keywords and builtins otherwise. start is the offset
// where the completed word begins; each candidate replaces src[start:cursor].
func (it *Interpreter) Complete(src string, cursor int) (start int, candidates []string) {
	if cursor < 0 || cursor > len(src) {
		cursor = len(src)
	}
	before := src[:cursor]
	lineStart := strings.LastIndexByte(before, '\n') + 1
	line := before[lineStart:]
	trimmed := strings.TrimLeft(line, " \t")
	if trimmed != "" && (trimmed[0] == ':' || trimmed[0] == '%') {
		return completeCommand(trimmed, cursor)
	}
	i := len(before)
	for i > 0 {
		r := rune(before[i-1])
		if r == '_' || r == '.' || r < unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r)) {
			i--
			continue
		}
		break
	}
	word := before[i:]
	if dot := strings.LastIndexByte(word, '.'); dot >= 0 {
		pkg, prefix := word[:dot], word[dot+1:]
		it.nmu.Lock()
		path, ok := it.imports[pkg]
		it.nmu.Unlock()
		if !ok {
			return cursor, nil
		}
		return cursor - len(prefix), filter(packageNames(path), prefix)
	}
	if word == "" {
		return cursor, nil
	}
	var names []string
	it.nmu.Lock()
	for n := range it.names {
		names = append(names, n)
	}
	for n := range it.imports {
		names = append(names, n)
	}
	it.nmu.Unlock()
	for k := token.BREAK; k <= token.VAR; k++ {
		if k.IsKeyword() {
			names = append(names, k.String())
		}
	}
	names = append(names, builtins...)
	return i, filter(names, word)
}

func completeCommand(line string, cursor int) (int, []string) {
	prefix := line[:1]
	body := line[1:]
	name, rest, hasArgs := strings.Cut(body, " ")
	if !hasArgs {
		var out []string
		for _, c := range commands {
			out = append(out, prefix+c.Name)
		}
		return cursor - len(line), filter(out, line)
	}
	words := strings.Fields(rest)
	cur := ""
	if len(words) > 0 && !strings.HasSuffix(rest, " ") {
		cur = words[len(words)-1]
	}
	switch strings.ToLower(name) {
	case "help":
		var out []string
		for _, c := range commands {
			out = append(out, c.Name)
		}
		return cursor - len(cur), filter(out, cur)
	case "set":
		var out []string
		for _, k := range halo.HyperKeys() {
			out = append(out, k+"=")
		}
		out = append(out, "lr=")
		return cursor - len(cur), filter(out, cur)
	case "layout":
		return cursor - len(cur), filter([]string{"dp=", "tp=", "cp=", "ep=", "etp=", "fsdp", "devices="}, cur)
	case "plot":
		return cursor - len(cur), filter([]string{"loss", "lr"}, cur)
	}
	return cursor, nil
}

func packageSymbols(path string) map[string]reflect.Value {
	name := path[strings.LastIndexByte(path, '/')+1:]
	key := path + "/" + name
	if syms, ok := symbols.Symbols[key]; ok {
		return syms
	}
	return stdlib.Symbols[key]
}

// packageSymbol returns a compiled package's symbol.
func packageSymbol(path, name string) (reflect.Value, bool) {
	v, ok := packageSymbols(path)[name]
	return v, ok
}

// packageNames lists the exported names of a package the interpreter knows.
func packageNames(path string) []string {
	syms := packageSymbols(path)
	out := make([]string, 0, len(syms))
	for n := range syms {
		if n != "" && unicode.IsUpper(rune(n[0])) {
			out = append(out, n)
		}
	}
	return out
}

func filter(names []string, prefix string) []string {
	seen := map[string]bool{}
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, prefix) && n != prefix && !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// Inspect documents the name at cursor in src: a command (":step", "%set") or a halo API
// name ("halo.Step", "halo.Tensor.At"). ok is false when there is nothing to document.
func (it *Interpreter) Inspect(src string, cursor int) (doc string, ok bool) {
	if cursor < 0 || cursor > len(src) {
		cursor = len(src)
	}
	lineStart := strings.LastIndexByte(src[:cursor], '\n') + 1
	lineEnd := len(src)
	if i := strings.IndexByte(src[cursor:], '\n'); i >= 0 {
		lineEnd = cursor + i
	}
	line := strings.TrimSpace(src[lineStart:lineEnd])
	if line != "" && (line[0] == ':' || line[0] == '%') {
		name, _, _ := strings.Cut(line[1:], " ")
		if lookup(strings.ToLower(name)) == nil {
			return "", false
		}
		return Help(line[:1], name), true
	}
	isWord := func(b byte) bool {
		return b == '_' || b == '.' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
	}
	i, j := cursor, cursor
	for i > lineStart && isWord(src[i-1]) {
		i--
	}
	for j < lineEnd && isWord(src[j]) {
		j++
	}
	word := strings.Trim(src[i:j], ".")
	rest, found := strings.CutPrefix(word, "halo.")
	if !found {
		return "", false
	}
	// halo.Step(...).Loss: document the longest prefix that names something.
	parts := strings.Split(rest, ".")
	for k := len(parts); k > 0; k-- {
		if d := halo.Doc(strings.Join(parts[:k], ".")); d != "" {
			return d, true
		}
	}
	return "", false
}
