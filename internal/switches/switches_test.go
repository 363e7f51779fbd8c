package switches

import (
	"flag"
	"go/ast"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite SWITCHES.md at the repository root from the declarations")

func TestValueLookupOnCheck(t *testing.T) {
	s := &Switch{Name: "HALO_TEST_VALUE", Default: "auto", Values: []string{"auto", "off", "1"}, Doc: "test"}
	cases := []struct {
		env      string
		value    string
		set, on  bool
		checkErr string
	}{
		{"", "auto", false, false, ""},
		{"off", "off", true, false, ""},
		{"1", "1", true, true, ""},
		{"bogus", "bogus", true, false, `HALO_TEST_VALUE="bogus" is not one of auto, off, 1`},
	}
	for _, c := range cases {
		t.Run(c.env, func(t *testing.T) {
			t.Setenv("HALO_TEST_VALUE", c.env)
			if got := s.Value(); got != c.value {
				t.Errorf("Value = %q, want %q", got, c.value)
			}
			if _, set := s.Lookup(); set != c.set {
				t.Errorf("Lookup set = %v, want %v", set, c.set)
			}
			if s.On() != c.on {
				t.Errorf("On = %v, want %v", s.On(), c.on)
			}
			err := s.Check()
			if (err == nil) != (c.checkErr == "") || err != nil && !strings.Contains(err.Error(), c.checkErr) {
				t.Errorf("Check = %v, want %q", err, c.checkErr)
			}
		})
	}
}

func TestRegisterRefusesMistakes(t *testing.T) {
	cases := []struct {
		name string
		s    Switch
		want string
	}{
		{"lower case", Switch{Name: "HALO_lower", Doc: "x"}, "invalid name"},
		{"no prefix", Switch{Name: "CUDA_X", Doc: "x"}, "invalid name"},
		{"no doc", Switch{Name: "HALO_TEST_NODOC"}, "no documentation"},
		{"default outside values", Switch{Name: "HALO_TEST_BADDEF", Doc: "x", Default: "z", Values: []string{"a"}}, "not one of"},
		{"twice", Switch{Name: "HALO_CI", Doc: "x"}, "registered twice"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(r.(string), c.want) {
					t.Fatalf("panic = %v, want one containing %q", r, c.want)
				}
			}()
			Register(c.s)
		})
	}
}

func TestProblemsNamesTyposAndBadValues(t *testing.T) {
	got := Problems([]string{"PATH=/bin", "HALO_CJ=1", "HALO_CI=2", "HALO_REPL_HELPER=1", "HALO_ZZZZZZZZZZZZ=1"})
	want := []string{
		`HALO_CI="2" is not one of 1; the default "" applies only when it is unset`,
		"HALO_CJ is not a halo-shell switch (did you mean HALO_CI?); SWITCHES.md lists them",
		"HALO_ZZZZZZZZZZZZ is not a halo-shell switch; SWITCHES.md lists them",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("Problems =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestHaloLiteral(t *testing.T) {
	for lit, want := range map[string]string{
		`"HALO_X"`: "HALO_X", `"HALO_CUDA_EMPTY=cleared"`: "HALO_CUDA_EMPTY", `"HALO_"`: "",
		`"HALO_x"`: "", `"XHALO_A"`: "", "`HALO_B=`": "HALO_B",
	} {
		got, _ := haloLiteral(basicLit(lit))
		if got != want {
			t.Errorf("haloLiteral(%s) = %q, want %q", lit, got, want)
		}
	}
}

// TestEveryNameIsRegistered scans the repository: every HALO_* name in non-test code is
// declared with Register and none is read with os.Getenv directly; a HALO_* variable a test
// reads is declared too; every declared switch is exercised by some test; SWITCHES.md equals
// the declarations.
func TestEveryNameIsRegistered(t *testing.T) {
	root, err := ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	decls, uses, err := Scan(root)
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]Declared{}
	for _, d := range decls {
		if prev, dup := declared[d.Name]; dup {
			t.Errorf("%s declared twice: %s and %s", d.Name, prev.Pos, d.Pos)
		}
		declared[d.Name] = d
	}
	for _, u := range uses {
		_, ok := declared[u.Name]
		switch {
		case u.Getenv && !u.Test && !strings.HasPrefix(u.Pos, "internal/switches/"):
			t.Errorf("%s: os.Getenv(%q): declare it with switches.Register and read it with Value", u.Pos, u.Name)
		case !ok && (!u.Test || u.Getenv):
			t.Errorf("%s: %s is not declared: add a switches.Register with its default and documentation", u.Pos, u.Name)
		}
	}
	// Every switch is exercised by a test: its name, or the variable it is assigned to, occurs in
	// a test file (of its package, for the variable).
	testText := map[string]string{} // dir -> concatenated test sources
	var all strings.Builder
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		testText[filepath.ToSlash(rel)] += string(b)
		all.Write(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The scripts' variables: every HALO_* word in scripts/ is declared, and a Script switch
	// is read by some script (that is its exercise).
	scriptText, err := scriptSources(filepath.Join(root, "scripts"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`\bHALO_[A-Z0-9_]*[A-Z0-9]\b`).FindAllString(scriptText, -1) {
		if _, ok := declared[m]; !ok {
			t.Errorf("scripts/ use %s, which is not declared: add a switches.Register (Kind Script if only scripts read it)", m)
			declared[m] = Declared{} // once
		}
	}
	for _, d := range decls {
		if d.Kind == Script {
			if !strings.Contains(scriptText, d.Name) {
				t.Errorf("%s (%s) is a Script switch that no script under scripts/ reads", d.Name, d.Pos)
			}
			continue
		}
		if strings.Contains(all.String(), `"`+d.Name) {
			continue
		}
		if d.Const != "" && regexp.MustCompile(`\b`+regexp.QuoteMeta(d.Const)+`\b`).MatchString(testText[d.Package]) {
			continue
		}
		if d.Var != "" && d.Var != "_" {
			word := regexp.MustCompile(`\b` + regexp.QuoteMeta(d.Var) + `\b`)
			if word.MatchString(testText[d.Package]) {
				continue
			}
			if d.Package == "internal/switches" && strings.Contains(all.String(), "switches."+d.Var) {
				continue
			}
		}
		t.Errorf("%s (%s) is not exercised by any test: set it in a test that shows its effect", d.Name, d.Pos)
	}
	page := Markdown(decls)
	path := filepath.Join(root, "SWITCHES.md")
	if *update {
		if err := os.WriteFile(path, []byte(page), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./internal/switches -update writes it)", err)
	}
	if string(old) != page {
		t.Errorf("SWITCHES.md is out of date with the declarations: go test ./internal/switches -update")
	}
}

// scriptSources concatenates the shell and Python scripts under dir.
func scriptSources(dir string) (string, error) {
	var b strings.Builder
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if strings.HasSuffix(path, ".sh") || strings.HasSuffix(path, ".py") {
			text, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			b.Write(text)
			b.WriteByte('\n')
		}
		return nil
	})
	return b.String(), err
}

func basicLit(s string) *ast.BasicLit { return &ast.BasicLit{Kind: token.STRING, Value: s} }
