package jinja

import "fmt"

// unsupportedFilters are jinja2 built-in filters this engine does not implement: a template
// using them compiles (as in jinja2) and fails only if it runs one.
var unsupportedFilters = map[string]bool{
	"filesizeformat": true, "groupby": true, "pprint": true, "random": true, "slice": true, "striptags": true,
	"truncate": true, "urlencode": true, "urlize": true, "wordwrap": true, "xmlattr": true,
}

// checkNames fails, as jinja2's compiler does, on filters and tests that do not exist, except
// inside if statements and conditional expressions (where jinja2 defers the error to run
// time); loops, macros and blocks inside those are checked again.
func checkNames(ns []node) error {
	c := &nameChecker{}
	c.nodes(ns, false)
	return c.err
}

type nameChecker struct{ err error }

func (c *nameChecker) fail(line int, format string, args ...any) {
	if c.err == nil {
		c.err = &SyntaxError{Line: line, Msg: fmt.Sprintf(format, args...)}
	}
}

func (c *nameChecker) nodes(ns []node, soft bool) {
	for _, n := range ns {
		switch x := n.(type) {
		case *outputNode:
			c.expr(x.expr, soft)
		case *ifNode:
			for i := range x.conds {
				c.expr(x.conds[i], true)
				c.nodes(x.bodies[i], true)
			}
			c.nodes(x.orelse, true)
		case *forNode:
			c.expr(x.iter, soft)
			c.expr(x.cond, false)
			c.nodes(x.body, false)
			c.nodes(x.orelse, false)
		case *setNode:
			c.expr(x.value, soft)
		case *setBlockNode:
			c.filters(x.filters, soft)
			c.nodes(x.body, false)
		case *macroNode:
			c.exprs(x.defaults, false)
			c.nodes(x.body, false)
		case *callBlockNode:
			c.expr(x.call, soft)
			c.nodes(x.body, false)
		case *filterBlockNode:
			c.filters(x.filters, soft)
			c.nodes(x.body, false)
		case *withNode:
			c.exprs(x.values, soft)
			c.nodes(x.body, false)
		case *generationNode:
			c.nodes(x.body, soft)
		}
	}
}

func (c *nameChecker) filters(fs []*filterExpr, soft bool) {
	for _, f := range fs {
		c.expr(f, soft)
	}
}

func (c *nameChecker) exprs(es []expr, soft bool) {
	for _, e := range es {
		c.expr(e, soft)
	}
}

func (c *nameChecker) expr(e expr, soft bool) {
	switch x := e.(type) {
	case *attrExpr:
		c.expr(x.obj, soft)
	case *itemExpr:
		c.expr(x.obj, soft)
		c.expr(x.key, soft)
	case *sliceExpr:
		c.expr(x.start, soft)
		c.expr(x.stop, soft)
		c.expr(x.step, soft)
	case *callExpr:
		c.expr(x.fn, soft)
		c.exprs(x.args, soft)
		for _, k := range x.kwargs {
			c.expr(k.value, soft)
		}
		c.expr(x.star, soft)
		c.expr(x.dstar, soft)
	case *filterExpr:
		if _, ok := filters[x.name]; !ok && !unsupportedFilters[x.name] && !soft {
			c.fail(x.line, "no filter named '%s'", x.name)
		}
		c.expr(x.obj, soft)
		c.exprs(x.args, soft)
		for _, k := range x.kwargs {
			c.expr(k.value, soft)
		}
	case *testExpr:
		if !knownTest(x.name) && !soft {
			c.fail(x.line, "no test named '%s'", x.name)
		}
		c.expr(x.obj, soft)
		c.exprs(x.args, soft)
	case *binExpr:
		c.expr(x.l, soft)
		c.expr(x.r, soft)
	case *unaryExpr:
		c.expr(x.x, soft)
	case *compareExpr:
		c.expr(x.first, soft)
		c.exprs(x.rest, soft)
	case *condExpr:
		c.expr(x.cond, true)
		c.expr(x.then, true)
		c.expr(x.orelse, true)
	case *listExpr:
		c.exprs(x.items, soft)
	case *tupleExpr:
		c.exprs(x.items, soft)
	case *dictExpr:
		c.exprs(x.keys, soft)
		c.exprs(x.values, soft)
	}
}

func knownTest(name string) bool {
	switch name {
	case "defined", "undefined", "none", "boolean", "true", "false", "integer", "float", "number", "string", "mapping",
		"iterable", "sequence", "callable", "escaped", "lower", "upper", "odd", "even", "divisibleby", "sameas", "eq",
		"equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">=", "in", "filter", "test":
		return true
	}
	return false
}
