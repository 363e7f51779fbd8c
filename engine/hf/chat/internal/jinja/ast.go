package jinja

// Statement nodes.
type (
	node interface{}

	textNode   struct{ text string }
	outputNode struct {
		expr   expr
		line   int
		folded bool // the whole expression is constant: jinja2 evaluates it at compile time
	}
	ifNode struct {
		conds  []expr
		bodies [][]node
		orelse []node
	}
	forNode struct {
		target    expr // nameExpr or tupleExpr of names
		iter      expr
		cond      expr // optional filter condition
		body      []node
		orelse    []node
		recursive bool
		line      int
	}
	setNode struct {
		target expr // nameExpr, tupleExpr or nsAttrExpr
		value  expr
		line   int
	}
	setBlockNode struct {
		target  expr
		filters []*filterExpr // applied in order to the captured body
		body    []node
		line    int
	}
	macroNode struct {
		name     string
		params   []string
		defaults []expr // aligned to the last len(defaults) params
		body     []node
	}
	callBlockNode struct {
		call     *callExpr
		params   []string
		defaults []expr
		body     []node
		line     int
	}
	filterBlockNode struct {
		filters []*filterExpr
		body    []node
	}
	withNode struct {
		targets []expr
		values  []expr
		body    []node
	}
	breakNode      struct{}
	continueNode   struct{}
	generationNode struct{ body []node }
)

// Expression nodes.
type (
	expr interface{}

	constExpr struct{ v Value }
	nameExpr  struct {
		name string
		line int
	}
	attrExpr struct {
		obj  expr
		attr string
		line int
	}
	itemExpr struct {
		obj  expr
		key  expr
		line int
	}
	sliceExpr struct{ start, stop, step expr } // used as an itemExpr key
	callExpr  struct {
		fn     expr
		args   []expr
		kwargs []kwarg
		star   expr
		dstar  expr
		line   int
	}
	kwarg struct {
		name  string
		value expr
	}
	filterExpr struct {
		obj    expr // nil inside filter blocks and set blocks
		name   string
		args   []expr
		kwargs []kwarg
		line   int
	}
	testExpr struct {
		obj    expr
		name   string
		args   []expr
		negate bool
		line   int
	}
	binExpr struct {
		op   string // + - * / // % ** ~ and or
		l, r expr
		line int
	}
	unaryExpr struct {
		op   string // not, -, +
		x    expr
		line int
	}
	compareExpr struct {
		first expr
		ops   []string // == != < <= > >= in notin
		rest  []expr
		line  int
	}
	condExpr struct {
		cond, then, orelse expr // orelse may be nil
	}
	listExpr   struct{ items []expr }
	tupleExpr  struct{ items []expr }
	dictExpr   struct{ keys, values []expr }
	nsAttrExpr struct {
		name, attr string
	}
)
