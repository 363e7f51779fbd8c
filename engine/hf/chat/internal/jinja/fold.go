package jinja

import "strings"

// jinja2 optimizes templates at compile time: every subexpression made only of constants is
// evaluated, and replaced by its value when that value has a "safe repr" (None, bools,
// numbers, strings, and lists, tuples and dicts of those). Evaluation at compile time goes
// through the sandbox's lenient getitem, so a failed subscript there is undefined instead of
// an error, which is observable. foldNodes reproduces that rewrite.

func foldNodes(ns []node) {
	for _, n := range ns {
		switch x := n.(type) {
		case *outputNode:
			x.expr = fold(x.expr)
			x.folded = isConst(x.expr)
		case *ifNode:
			for i := range x.conds {
				x.conds[i] = fold(x.conds[i])
				foldNodes(x.bodies[i])
			}
			foldNodes(x.orelse)
		case *forNode:
			x.iter = fold(x.iter)
			if x.cond != nil {
				x.cond = fold(x.cond)
			}
			foldNodes(x.body)
			foldNodes(x.orelse)
		case *setNode:
			x.value = fold(x.value)
		case *setBlockNode:
			foldFilters(x.filters)
			foldNodes(x.body)
		case *macroNode:
			foldList(x.defaults)
			foldNodes(x.body)
		case *callBlockNode:
			foldList(x.defaults)
			foldList(x.call.args)
			foldKwargs(x.call.kwargs)
			foldNodes(x.body)
		case *filterBlockNode:
			foldFilters(x.filters)
			foldNodes(x.body)
		case *withNode:
			foldList(x.values)
			foldNodes(x.body)
		case *generationNode:
			foldNodes(x.body)
		}
	}
}

func foldList(es []expr) {
	for i := range es {
		es[i] = fold(es[i])
	}
}

func foldKwargs(kws []kwarg) {
	for i := range kws {
		kws[i].value = fold(kws[i].value)
	}
}

func foldFilters(fs []*filterExpr) {
	for _, f := range fs {
		foldList(f.args)
		foldKwargs(f.kwargs)
	}
}

// fold rewrites e bottom-up, replacing constant subexpressions with their values.
func fold(e expr) expr {
	switch x := e.(type) {
	case nil, *constExpr, *nameExpr:
		return e
	case *attrExpr:
		x.obj = fold(x.obj)
	case *itemExpr:
		x.obj = fold(x.obj)
		x.key = fold(x.key)
	case *sliceExpr:
		if x.start != nil {
			x.start = fold(x.start)
		}
		if x.stop != nil {
			x.stop = fold(x.stop)
		}
		if x.step != nil {
			x.step = fold(x.step)
		}
		return e
	case *callExpr:
		x.fn = fold(x.fn)
		foldList(x.args)
		foldKwargs(x.kwargs)
		if x.star != nil {
			x.star = fold(x.star)
		}
		if x.dstar != nil {
			x.dstar = fold(x.dstar)
		}
		return e
	case *filterExpr:
		if x.obj != nil {
			x.obj = fold(x.obj)
		}
		foldList(x.args)
		foldKwargs(x.kwargs)
	case *testExpr:
		x.obj = fold(x.obj)
		foldList(x.args)
	case *binExpr:
		x.l = fold(x.l)
		x.r = fold(x.r)
	case *unaryExpr:
		x.x = fold(x.x)
	case *compareExpr:
		x.first = fold(x.first)
		foldList(x.rest)
	case *condExpr:
		x.cond = fold(x.cond)
		x.then = fold(x.then)
		if x.orelse != nil {
			x.orelse = fold(x.orelse)
		}
	case *listExpr:
		foldList(x.items)
	case *tupleExpr:
		foldList(x.items)
	case *dictExpr:
		foldList(x.keys)
		foldList(x.values)
	}
	if !isConst(e) {
		return e
	}
	v, ok := constValue(e)
	if !ok || !safeRepr(v, 0) {
		return e
	}
	return &constExpr{v: v}
}

// constValue evaluates a constant expression as jinja2's compiler does.
func constValue(e expr) (v Value, ok bool) {
	defer func() {
		if recover() != nil {
			v, ok = nil, false
		}
	}()
	r := &renderer{out: &strings.Builder{}, folding: true}
	v, err := r.eval(e, newScope(nil))
	return v, err == nil
}

// safeRepr is jinja2's has_safe_repr.
func safeRepr(v Value, depth int) bool {
	if depth > 100 {
		return false
	}
	switch x := v.(type) {
	case nil, bool, int64, float64, string:
		return true
	case *List:
		if x.View != "" {
			return false
		}
		for _, it := range x.Items {
			if !safeRepr(it, depth+1) {
				return false
			}
		}
		return true
	case *Dict:
		for i, k := range x.keys {
			if !safeRepr(k, depth+1) || !safeRepr(x.vals[i], depth+1) {
				return false
			}
		}
		return true
	}
	return false
}
