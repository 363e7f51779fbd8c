package halo

import (
	"bytes"
	"embed"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/printer"
	"go/token"
	"sort"
	"strings"
	"sync"
)

//go:embed api.go types.go plot.go docs.go measure.go rewards.go
var sources embed.FS

var (
	docsOnce sync.Once
	docs     map[string]string
)

// Doc returns the documentation of an API name ("Step", "Tensor", "Tensor.At"; a leading
// "halo." is ignored): its declaration and doc comment. It returns "" for unknown names.
func Doc(name string) string {
	docsOnce.Do(loadDocs)
	return docs[strings.TrimPrefix(strings.TrimSpace(name), "halo.")]
}

// Names lists the documented API names, sorted.
func Names() []string {
	docsOnce.Do(loadDocs)
	out := make([]string, 0, len(docs))
	for n := range docs {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func loadDocs() {
	docs = map[string]string{}
	fset := token.NewFileSet()
	var files []*ast.File
	ents, err := sources.ReadDir(".")
	if err != nil {
		return
	}
	for _, e := range ents {
		b, err := sources.ReadFile(e.Name())
		if err != nil {
			continue
		}
		f, err := parser.ParseFile(fset, e.Name(), b, parser.ParseComments)
		if err != nil {
			continue
		}
		files = append(files, f)
	}
	p, err := doc.NewFromFiles(fset, files, "github.com/halo-shell/halo-shell/cell/halo")
	if err != nil {
		return
	}
	decl := func(d ast.Decl) string {
		if fd, ok := d.(*ast.FuncDecl); ok {
			fd = &ast.FuncDecl{Recv: fd.Recv, Name: fd.Name, Type: fd.Type} // no body
			d = fd
		}
		var b bytes.Buffer
		printer.Fprint(&b, fset, d)
		return b.String()
	}
	add := func(name string, d ast.Decl, text string) {
		docs[name] = strings.TrimSpace(decl(d) + "\n\n" + strings.TrimSpace(text))
	}
	for _, f := range p.Funcs {
		add(f.Name, f.Decl, f.Doc)
	}
	for _, t := range p.Types {
		add(t.Name, t.Decl, t.Doc)
		for _, f := range t.Funcs {
			add(f.Name, f.Decl, f.Doc)
		}
		for _, m := range t.Methods {
			add(t.Name+"."+m.Name, m.Decl, m.Doc)
		}
	}
	for _, c := range p.Consts {
		for _, n := range c.Names {
			add(n, c.Decl, c.Doc)
		}
	}
}
