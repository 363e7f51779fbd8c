package switches

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Declared is one Register call found in the sources.
type Declared struct {
	Switch
	Package string // directory of the declaring file, relative to the module root
	Var     string // the package-level variable it is assigned to, "" if none
	Const   string // the constant its Name is given by, "" if a literal
	Pos     string // file:line
}

// Use is one HALO_* string literal found in the sources.
type Use struct {
	Name   string
	Pos    string
	Test   bool // in a _test.go file
	Getenv bool // the argument of os.Getenv or os.LookupEnv
}

// Scan parses every Go file under root (a module root) and returns the Register calls and
// the HALO_* literals it finds. A Register call whose fields are not constant literals is an
// error, since the documentation is made from the sources.
func Scan(root string) ([]Declared, []Use, error) {
	var decls []Declared
	var uses []Use
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "bin", "out", ".cache", "node_modules":
				if path != root {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return fmt.Errorf("switches: parse %s: %w", rel, err)
		}
		isTest := strings.HasSuffix(path, "_test.go")
		local := f.Name.Name == "switches" && filepath.ToSlash(filepath.Dir(rel)) == "internal/switches"
		pos := func(p token.Pos) string {
			ps := fset.Position(p)
			return fmt.Sprintf("%s:%d", filepath.ToSlash(rel), ps.Line)
		}
		// Register calls assigned to package-level variables, and the file's string constants
		// (a Switch's Name may be one).
		varOf := map[*ast.CallExpr]string{}
		consts := map[string]string{}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok {
				continue
			}
			for _, spec := range gd.Specs {
				vs, ok := spec.(*ast.ValueSpec)
				if !ok {
					continue
				}
				for i, v := range vs.Values {
					if i >= len(vs.Names) {
						break
					}
					if c, ok := v.(*ast.CallExpr); ok {
						varOf[c] = vs.Names[i].Name
					}
					if gd.Tok == token.CONST {
						if str, err := constString(v, nil); err == nil {
							consts[vs.Names[i].Name] = str
						}
					}
				}
			}
		}
		var inspectErr error
		ast.Inspect(f, func(n ast.Node) bool {
			if inspectErr != nil {
				return false
			}
			switch n := n.(type) {
			case *ast.CallExpr:
				if !isTest && isRegister(n.Fun, local) && len(n.Args) == 1 {
					sw, err := literalSwitch(n.Args[0], local, consts)
					if err != nil {
						inspectErr = fmt.Errorf("switches: %s: %w", pos(n.Pos()), err)
						return false
					}
					decls = append(decls, Declared{Switch: sw, Package: filepath.ToSlash(filepath.Dir(rel)), Var: varOf[n], Const: nameConst(n.Args[0]), Pos: pos(n.Pos())})
				}
				if isGetenv(n.Fun) && len(n.Args) == 1 {
					if name, ok := haloLiteral(n.Args[0]); ok {
						uses = append(uses, Use{Name: name, Pos: pos(n.Pos()), Test: isTest, Getenv: true})
						return false
					}
				}
			case *ast.BasicLit:
				if name, ok := haloLiteral(n); ok {
					uses = append(uses, Use{Name: name, Pos: pos(n.Pos()), Test: isTest})
				}
			}
			return true
		})
		return inspectErr
	})
	sort.Slice(decls, func(i, j int) bool { return decls[i].Name < decls[j].Name })
	return decls, uses, err
}

// nameConst returns the identifier a Switch literal's Name field is, if it is one.
func nameConst(e ast.Expr) string {
	cl, _ := e.(*ast.CompositeLit)
	if cl == nil {
		return ""
	}
	for _, el := range cl.Elts {
		if kv, ok := el.(*ast.KeyValueExpr); ok {
			if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "Name" {
				if id, ok := kv.Value.(*ast.Ident); ok {
					return id.Name
				}
			}
		}
	}
	return ""
}

func isRegister(fun ast.Expr, local bool) bool {
	switch f := fun.(type) {
	case *ast.SelectorExpr:
		id, ok := f.X.(*ast.Ident)
		return ok && id.Name == "switches" && f.Sel.Name == "Register"
	case *ast.Ident:
		return local && f.Name == "Register"
	}
	return false
}

func isGetenv(fun ast.Expr) bool {
	f, ok := fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	id, ok := f.X.(*ast.Ident)
	return ok && id.Name == "os" && (f.Sel.Name == "Getenv" || f.Sel.Name == "LookupEnv")
}

// haloLiteral returns the HALO_* name a string literal starts with ("HALO_X" or "HALO_X=1").
func haloLiteral(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	if err != nil || !strings.HasPrefix(s, "HALO_") {
		return "", false
	}
	end := len("HALO_")
	for end < len(s) && (s[end] >= 'A' && s[end] <= 'Z' || s[end] >= '0' && s[end] <= '9' || s[end] == '_') {
		end++
	}
	if end < len(s) && s[end] != '=' {
		return "", false
	}
	if end == len("HALO_") {
		return "", false
	}
	return s[:end], true
}

func literalSwitch(e ast.Expr, local bool, consts map[string]string) (Switch, error) {
	cl, ok := e.(*ast.CompositeLit)
	if !ok {
		return Switch{}, fmt.Errorf("Register's argument must be a Switch literal")
	}
	var sw Switch
	for _, el := range cl.Elts {
		kv, ok := el.(*ast.KeyValueExpr)
		if !ok {
			return Switch{}, fmt.Errorf("Switch literal must name its fields")
		}
		key, _ := kv.Key.(*ast.Ident)
		if key == nil {
			return Switch{}, fmt.Errorf("Switch literal must name its fields")
		}
		var err error
		switch key.Name {
		case "Name":
			sw.Name, err = constString(kv.Value, consts)
		case "Default":
			sw.Default, err = constString(kv.Value, consts)
		case "Doc":
			sw.Doc, err = constString(kv.Value, consts)
		case "Values":
			sw.Values, err = constStrings(kv.Value, consts)
		case "Kind":
			sw.Kind, err = constKind(kv.Value, local)
		default:
			err = fmt.Errorf("unknown Switch field %s", key.Name)
		}
		if err != nil {
			return Switch{}, fmt.Errorf("%s: %w", key.Name, err)
		}
	}
	if sw.Name == "" {
		return Switch{}, fmt.Errorf("Switch literal has no Name")
	}
	return sw, nil
}

// constString accepts a string literal, a string constant of the same file, or a + of those.
func constString(e ast.Expr, consts map[string]string) (string, error) {
	switch v := e.(type) {
	case *ast.Ident:
		if s, ok := consts[v.Name]; ok {
			return s, nil
		}
	case *ast.BasicLit:
		if v.Kind == token.STRING {
			return strconv.Unquote(v.Value)
		}
	case *ast.BinaryExpr:
		if v.Op == token.ADD {
			a, err := constString(v.X, consts)
			if err != nil {
				return "", err
			}
			b, err := constString(v.Y, consts)
			return a + b, err
		}
	case *ast.ParenExpr:
		return constString(v.X, consts)
	}
	return "", fmt.Errorf("must be a string literal or a constant of the same file (the documentation is read from the source)")
}

func constStrings(e ast.Expr, consts map[string]string) ([]string, error) {
	cl, ok := e.(*ast.CompositeLit)
	if !ok {
		return nil, fmt.Errorf("must be a []string literal")
	}
	var out []string
	for _, el := range cl.Elts {
		s, err := constString(el, consts)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

func constKind(e ast.Expr, local bool) (Kind, error) {
	name := ""
	switch v := e.(type) {
	case *ast.SelectorExpr:
		if id, ok := v.X.(*ast.Ident); ok && id.Name == "switches" {
			name = v.Sel.Name
		}
	case *ast.Ident:
		if local {
			name = v.Name
		}
	}
	for k, n := range kindNames {
		if strings.EqualFold(n, name) {
			return Kind(k), nil
		}
	}
	return 0, fmt.Errorf("must be one of switches.Tuning, Debug, Path, Plumbing, Testing")
}

// Markdown renders the declarations as the SWITCHES.md page.
func Markdown(decls []Declared) string {
	var b strings.Builder
	b.WriteString("# Environment switches\n\n")
	b.WriteString("Every HALO_* environment variable halo-shell reads, with its default. This page is made from\n")
	b.WriteString("the declarations in the sources (`switches.Register`); `go test ./internal/switches -update`\n")
	b.WriteString("rewrites it, and the test fails when it is out of date or a variable is read without a\n")
	b.WriteString("declaration. `halo-shell` warns at start about a HALO_* variable it does not know (a typo)\n")
	b.WriteString("and about a value outside a switch's list.\n")
	for k := range kindNames {
		var rows []Declared
		for _, d := range decls {
			if int(d.Kind) == k {
				rows = append(rows, d)
			}
		}
		if len(rows) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n## %s\n\n", kindTitle[k])
		b.WriteString("| variable | default | values | declared in | what it does |\n|---|---|---|---|---|\n")
		for _, d := range rows {
			def := "unset"
			if d.Default != "" {
				def = "`" + d.Default + "`"
			}
			vals := ""
			if len(d.Values) > 0 {
				vals = "`" + strings.Join(d.Values, "`, `") + "`"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | `%s` | %s |\n", d.Name, def, vals, d.Package, strings.ReplaceAll(d.Doc, "|", "\\|"))
		}
	}
	return b.String()
}

var kindTitle = [...]string{
	Tuning:   "Tuning (same results, other implementation; defaults are the measured fastest)",
	Debug:    "Debugging",
	Path:     "Paths and libraries",
	Plumbing: "Plumbing (set by halo-shell for the processes it starts)",
	Testing:  "Test suites",
	Script:   "Scripts (read by the scripts under scripts/, not by the program)",
}

// ModuleRoot walks up from dir to the directory holding go.mod.
func ModuleRoot(dir string) (string, error) {
	d, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("switches: no go.mod above %s", dir)
		}
		d = parent
	}
}
