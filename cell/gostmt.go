package cell

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
)

// goBuiltins cannot be taken as values, so a go statement calling one is not hoisted.
var goBuiltins = map[string]bool{"append": true, "cap": true, "clear": true, "close": true, "complex": true, "copy": true, "delete": true,
	"imag": true, "len": true, "make": true, "max": true, "min": true, "new": true, "panic": true, "print": true, "println": true, "real": true, "recover": true}

const goGuard = "defer func() { halo.GoPanic(recover()) }()"

// protectGoroutines rewrites every go statement of a chunk so that a panic in the goroutine
// is reported instead of ending the process (a panic in a goroutine cannot be recovered
// from outside it):
//
//	go f(a, b)  =>  { __hg1f, __hg1a0, __hg1a1 := f, a, b; go func() { defer ...; __hg1f(__hg1a0, __hg1a1) }() }
//
// The function and arguments are still evaluated where the go statement is, as Go does. The
// rewrite stays on the statement's line, so line numbers in messages do not move.
func (it *Interpreter) protectGoroutines(c chunk) string {
	src := c.src
	if !strings.Contains(src, "go") {
		return src
	}
	prefix := "package p;"
	suffix := ""
	if c.kind == stmtChunk {
		prefix, suffix = "package p; func _() {", "\n}"
	}
	for range 200 {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, "", prefix+src+suffix, 0)
		if err != nil {
			return src // the interpreter reports the syntax error
		}
		var target *ast.GoStmt
		ast.Inspect(f, func(n ast.Node) bool {
			if target != nil {
				return false
			}
			if g, ok := n.(*ast.GoStmt); ok && !guarded(g) {
				target = g
				return false
			}
			return true
		})
		if target == nil {
			return src
		}
		off := len(prefix)
		text := func(n ast.Node) string {
			return src[fset.Position(n.Pos()).Offset-off : fset.Position(n.End()).Offset-off]
		}
		it.goCount++
		pfx := fmt.Sprintf("__hg%d", it.goCount)
		call := target.Call
		var names, values, args []string
		fun := text(call.Fun)
		if id, ok := call.Fun.(*ast.Ident); !ok || !goBuiltins[id.Name] {
			names, values = append(names, pfx+"f"), append(values, fun)
			fun = pfx + "f"
		}
		for i, a := range call.Args {
			n := fmt.Sprintf("%sa%d", pfx, i)
			names, values, args = append(names, n), append(values, text(a)), append(args, n)
		}
		ell := ""
		if call.Ellipsis.IsValid() {
			ell = "..."
		}
		body := fmt.Sprintf("go func() { %s; %s(%s%s) }()", goGuard, fun, strings.Join(args, ", "), ell)
		repl := body
		if len(names) > 0 {
			repl = fmt.Sprintf("{ %s := %s; %s }", strings.Join(names, ", "), strings.Join(values, ", "), body)
		}
		start := fset.Position(target.Pos()).Offset - off
		end := fset.Position(target.End()).Offset - off
		src = src[:start] + repl + src[end:]
	}
	return src
}

// guarded reports whether a go statement is one protectGoroutines wrote.
func guarded(g *ast.GoStmt) bool {
	lit, ok := g.Call.Fun.(*ast.FuncLit)
	if !ok || len(lit.Body.List) == 0 {
		return false
	}
	d, ok := lit.Body.List[0].(*ast.DeferStmt)
	if !ok {
		return false
	}
	inner, ok := d.Call.Fun.(*ast.FuncLit)
	if !ok || len(inner.Body.List) != 1 {
		return false
	}
	es, ok := inner.Body.List[0].(*ast.ExprStmt)
	if !ok {
		return false
	}
	c, ok := es.X.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := c.Fun.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "GoPanic"
}
