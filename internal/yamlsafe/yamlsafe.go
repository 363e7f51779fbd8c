// Package yamlsafe is the one way halo-shell reads YAML: it bounds a document before
// github.com/goccy/go-yaml decodes it, so that a small hostile file cannot take the process's
// memory or time.
//
// Three shapes of input do that to go-yaml. An alias bomb (nine levels of anchors, each a
// list of ten aliases of the one before: 1.5 KB) expands to 10^9 nodes when decoded. Deep
// flow nesting ("[[[[...", 400 KB) makes its parser build a path string per level (quadratic
// memory) and recurse once per level. And a large file costs more than in proportion. Check measures
// the three before any of them happens: the size in bytes, the nesting depth from the lexer's
// tokens (linear, no recursion), and the node count with every alias counted as the nodes it
// stands for, on the parsed tree without expanding it. A broken limit is a *LimitError that
// names the limit, its value and where in the document it was crossed.
//
// Unmarshal is Check and then the decode, of exactly one document: a file with a second
// document ("---") is refused rather than read in part. ReadFile reads a file of at most
// MaxBytes without trusting its size (a FIFO, /dev/zero).
//
// It is not a YAML parser; it knows nothing of what a document means.
package yamlsafe

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/lexer"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"
)

// Limits bound one YAML document. Zero fields take the defaults.
type Limits struct {
	// MaxBytes is the largest document, in bytes (default 64 KiB; a training config is a
	// few KB). It also bounds time: go-yaml's lexer is quadratic in the length of some
	// inputs (a run of double quotes, a flow mapping repeating one key).
	MaxBytes int
	// MaxDepth bounds the nesting of mappings and sequences (default 64).
	MaxDepth int
	// MaxNodes bounds the nodes of the document with every alias expanded (default 100000).
	MaxNodes int64
}

// DefaultLimits are the limits of a zero Limits.
var DefaultLimits = Limits{MaxBytes: 64 << 10, MaxDepth: 64, MaxNodes: 100_000}

func (l Limits) withDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultLimits.MaxBytes
	}
	if l.MaxDepth <= 0 {
		l.MaxDepth = DefaultLimits.MaxDepth
	}
	if l.MaxNodes <= 0 {
		l.MaxNodes = DefaultLimits.MaxNodes
	}
	return l
}

// LimitError is a document that breaks one of the Limits.
type LimitError struct {
	// Limit is the field of Limits that was broken: "MaxBytes", "MaxDepth" or "MaxNodes".
	Limit string
	// Max is the limit's value.
	Max int64
	// Line and Column locate where the limit was crossed (0 when not known).
	Line, Column int
	// Msg says what the document does, e.g. "aliases expand it to more than 100000 nodes".
	Msg string
}

func (e *LimitError) Error() string {
	at := ""
	if e.Line > 0 {
		at = fmt.Sprintf(" (line %d, column %d)", e.Line, e.Column)
	}
	return fmt.Sprintf("yaml: %s%s: over the limit of %d (yamlsafe %s); a configuration never needs that much", e.Msg, at, e.Max, e.Limit)
}

// Error is a document refused for its form rather than for a limit (a second document).
type Error struct {
	Line, Column int
	Msg          string
}

func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("yaml: line %d, column %d: %s", e.Line, e.Column, e.Msg)
	}
	return "yaml: " + e.Msg
}

// Check returns a *LimitError when src breaks lim, a go-yaml error when it does not parse, or
// nil.
func Check(src []byte, lim Limits) error {
	_, err := check(src, lim.withDefaults())
	return err
}

func check(src []byte, lim Limits) (*ast.File, error) {
	if len(src) > lim.MaxBytes {
		return nil, &LimitError{Limit: "MaxBytes", Max: int64(lim.MaxBytes), Msg: fmt.Sprintf("the document has %d bytes", len(src))}
	}
	if err := checkDepth(lexer.Tokenize(string(src)), lim.MaxDepth); err != nil {
		return nil, err
	}
	f, err := parser.ParseBytes(src, 0)
	if err != nil {
		return nil, err
	}
	c := newCounter(lim.MaxNodes)
	for _, d := range f.Docs {
		c.collect(d)
	}
	for _, d := range f.Docs {
		c.count(d)
	}
	if c.err != nil {
		return nil, c.err
	}
	return f, nil
}

// checkDepth follows the nesting of the token stream: flow collections by their brackets,
// block collections by the columns of their entries ("- " and the key before ": "), as the
// indentation stack of a YAML parser would.
func checkDepth(tks token.Tokens, maxDepth int) error {
	flow := 0
	var block []int // columns of the open block collections, increasing
	var prev *token.Token
	for _, tk := range tks {
		switch tk.Type {
		case token.DocumentHeaderType, token.DocumentEndType:
			flow, block = 0, block[:0]
		case token.SequenceStartType, token.MappingStartType:
			flow++
		case token.SequenceEndType, token.MappingEndType:
			if flow > 0 {
				flow--
			}
		case token.SequenceEntryType, token.MappingValueType, token.MappingKeyType:
			if flow > 0 {
				break
			}
			at := tk
			if tk.Type == token.MappingValueType && prev != nil {
				at = prev // a mapping's column is its key's
			}
			col := 0
			if at.Position != nil {
				col = at.Position.Column
			}
			for len(block) > 0 && block[len(block)-1] > col {
				block = block[:len(block)-1]
			}
			if len(block) == 0 || block[len(block)-1] < col {
				block = append(block, col)
			}
		}
		if tk.Type != token.SpaceType && tk.Type != token.CommentType {
			prev = tk
		}
		if d := flow + len(block); d > maxDepth {
			e := &LimitError{Limit: "MaxDepth", Max: int64(maxDepth), Msg: fmt.Sprintf("collections nest %d deep", d)}
			if tk.Position != nil {
				e.Line, e.Column = tk.Position.Line, tk.Position.Column
			}
			return e
		}
	}
	return nil
}

// counter counts the nodes of a tree as decoding visits them, an alias counting the nodes of
// the value its anchor names. go-yaml resolves aliases in the order it decodes, which for a
// struct is the order of the struct's fields, not of the document; so anchors are collected
// first, a name defined twice is refused (one alias, one value), and an anchor's size does not
// depend on where its aliases are. Counts saturate past max, so that no sum overflows.
type counter struct {
	max     int64
	anchors map[string]*ast.AnchorNode
	sizes   map[string]int64 // anchors whose size is known
	busy    map[string]bool  // anchors being sized (an alias inside its own anchor)
	total   int64
	err     error
}

func newCounter(max int64) *counter {
	return &counter{max: max, anchors: map[string]*ast.AnchorNode{}, sizes: map[string]int64{}, busy: map[string]bool{}}
}

func (c *counter) sat(n int64) int64 { return min(n, c.max+1) }

// collect records the anchors under n.
func (c *counter) collect(n ast.Node) {
	if n == nil || c.err != nil {
		return
	}
	switch n := n.(type) {
	case *ast.DocumentNode:
		c.collect(n.Body)
	case *ast.MappingNode:
		for _, v := range n.Values {
			c.collect(v)
		}
	case *ast.MappingValueNode:
		c.collect(n.Key)
		c.collect(n.Value)
	case *ast.MappingKeyNode:
		c.collect(n.Value)
	case *ast.SequenceNode:
		for _, v := range n.Values {
			c.collect(v)
		}
	case *ast.TagNode:
		c.collect(n.Value)
	case *ast.AnchorNode:
		if n.Name == nil {
			break
		}
		name := n.Name.GetToken().Value
		if first, dup := c.anchors[name]; dup {
			c.err = &Error{Line: pos(n.Start).Line, Column: pos(n.Start).Column,
				Msg: fmt.Sprintf("anchor &%s is defined again (first at line %d); give each anchor its own name", truncate(name), pos(first.Start).Line)}
			return
		}
		c.anchors[name] = n
		c.collect(n.Value)
	}
}

// size returns the nodes of n with its aliases expanded, saturated at max+1.
func (c *counter) size(n ast.Node) int64 {
	if n == nil {
		return 0
	}
	switch n := n.(type) {
	case *ast.DocumentNode:
		return c.size(n.Body)
	case *ast.MappingNode:
		sum := int64(1)
		for _, v := range n.Values {
			sum = c.sat(sum + c.size(v))
		}
		return sum
	case *ast.MappingValueNode:
		return c.sat(c.size(n.Key) + c.size(n.Value))
	case *ast.MappingKeyNode:
		return c.size(n.Value)
	case *ast.SequenceNode:
		sum := int64(1)
		for _, v := range n.Values {
			sum = c.sat(sum + c.size(v))
		}
		return sum
	case *ast.TagNode:
		return c.size(n.Value)
	case *ast.AnchorNode:
		return c.size(n.Value)
	case *ast.AliasNode:
		return c.aliasSize(n)
	case *ast.CommentGroupNode, *ast.CommentNode:
		return 0
	}
	return 1
}

func (c *counter) aliasSize(n *ast.AliasNode) int64 {
	if n.Value == nil {
		return 1
	}
	name := n.Value.GetToken().Value
	if s, ok := c.sizes[name]; ok {
		return s
	}
	a, ok := c.anchors[name]
	if !ok || c.busy[name] {
		return 1 // undefined (go-yaml refuses it) or inside its own anchor (decoded as null)
	}
	c.busy[name] = true
	s := c.size(a.Value)
	delete(c.busy, name)
	c.sizes[name] = s
	return s
}

// count walks n in document order adding each node to the running total, so that the error
// points at the node where the total crossed max.
func (c *counter) count(n ast.Node) {
	if n == nil || c.err != nil {
		return
	}
	switch n := n.(type) {
	case *ast.DocumentNode:
		c.count(n.Body)
	case *ast.MappingNode:
		c.add(1, n.Start, "")
		for _, v := range n.Values {
			c.count(v)
		}
	case *ast.MappingValueNode:
		c.count(n.Key)
		c.count(n.Value)
	case *ast.MappingKeyNode:
		c.count(n.Value)
	case *ast.SequenceNode:
		c.add(1, n.Start, "")
		for _, v := range n.Values {
			c.count(v)
		}
	case *ast.TagNode:
		c.count(n.Value)
	case *ast.AnchorNode:
		c.count(n.Value)
	case *ast.AliasNode:
		c.add(c.aliasSize(n), n.Start, "*"+n.Value.GetToken().Value)
	case *ast.CommentGroupNode, *ast.CommentNode:
	default:
		c.add(1, n.GetToken(), "")
	}
}

// add adds n nodes at token at; alias is the alias ("*name") they expand, or "".
func (c *counter) add(n int64, at *token.Token, alias string) {
	c.total = c.sat(c.total + n)
	if c.total > c.max && c.err == nil {
		p := pos(at)
		msg := fmt.Sprintf("the document has more than %d nodes", c.max)
		if alias != "" || len(c.sizes) > 0 {
			msg = fmt.Sprintf("aliases expand the document to more than %d nodes", c.max)
		}
		if alias != "" {
			msg += " at " + truncate(alias)
		}
		c.err = &LimitError{Limit: "MaxNodes", Max: c.max, Line: p.Line, Column: p.Column, Msg: msg}
	}
}

func pos(tk *token.Token) token.Position {
	if tk == nil || tk.Position == nil {
		return token.Position{}
	}
	return *tk.Position
}

// truncate shortens text taken from the document for an error message.
func truncate(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return s[:n] + fmt.Sprintf("... (%d bytes)", len(s))
}

// Unmarshal decodes the single YAML document in src into v with go-yaml's options, after
// Check with DefaultLimits. Empty input (or only comments) leaves v as it is.
func Unmarshal(src []byte, v any, opts ...yaml.DecodeOption) error {
	return UnmarshalLimits(src, v, Limits{}, opts...)
}

// UnmarshalLimits is Unmarshal with the given limits.
func UnmarshalLimits(src []byte, v any, lim Limits, opts ...yaml.DecodeOption) (err error) {
	f, err := check(src, lim.withDefaults())
	if err != nil {
		return err
	}
	var docs []*ast.DocumentNode
	for _, d := range f.Docs {
		if d != nil && d.Body != nil {
			docs = append(docs, d)
		}
	}
	if len(docs) == 0 {
		return nil
	}
	if len(docs) > 1 {
		e := &Error{Msg: fmt.Sprintf("the input holds %d YAML documents; only one is read, so the others would be ignored: remove the \"---\" line or split the file", len(docs))}
		if tk := docs[1].Start; tk != nil && tk.Position != nil {
			e.Line, e.Column = tk.Position.Line, tk.Position.Column
			e.Msg = fmt.Sprintf("a second YAML document starts here; only one is read, so it would be ignored: remove the \"---\" line or split the file (%d documents)", len(docs))
		}
		return e
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("yaml: cannot decode the document (%v)", r)
		}
	}()
	return yaml.NewDecoder(bytes.NewReader(src), opts...).Decode(v)
}

// ErrNotRegular is returned by ReadFile for a path that is not a regular file and not a pipe.
var ErrNotRegular = errors.New("not a regular file")

// ReadFile reads the file at path, refusing one of more than maxBytes (0: DefaultLimits'
// MaxBytes) without reading past that, whatever the file claims to be.
func ReadFile(path string, maxBytes int) ([]byte, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultLimits.MaxBytes
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if m := st.Mode(); m.IsDir() || m&(os.ModeDevice|os.ModeSocket) != 0 {
		return nil, fmt.Errorf("yaml: %s: %w (%v)", path, ErrNotRegular, m.Type())
	}
	b, err := io.ReadAll(io.LimitReader(f, int64(maxBytes)+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxBytes {
		return nil, &LimitError{Limit: "MaxBytes", Max: int64(maxBytes), Msg: fmt.Sprintf("%s has more than %d bytes", path, maxBytes)}
	}
	return b, nil
}
