package boundary

import (
	"io/fs"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/halo-shell/halo-shell/"

// graph is what a pattern links (go list -deps, without tests): each package of the module,
// named relative to the module, with its direct imports from the module.
type graph struct {
	order   []string            // go list's order: dependencies before their importers
	imports map[string][]string // package -> the module's packages it imports
}

func list(t *testing.T, pattern string) graph {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command in PATH (go test puts GOROOT/bin there): %v", err)
	}
	cmd := exec.Command(goCmd, "list", "-deps", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", pattern)
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("go list -deps %s: %v\n%s", pattern, err, msg)
	}
	g := graph{imports: map[string][]string{}}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		p, ok := strings.CutPrefix(f[0], module)
		if !ok {
			continue
		}
		g.order = append(g.order, p)
		for _, imp := range f[1:] {
			if rel, ok := strings.CutPrefix(imp, module); ok {
				g.imports[p] = append(g.imports[p], rel)
			}
		}
	}
	if len(g.order) == 0 {
		t.Fatalf("go list -deps %s listed none of the module's packages", pattern)
	}
	return g
}

// path returns an import chain from one of roots to dst ("tui -> session -> engine/train").
func (g graph) path(roots []string, dst string) string {
	prev := map[string]string{}
	queue := append([]string(nil), roots...)
	for _, r := range roots {
		prev[r] = ""
	}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == dst {
			chain := []string{p}
			for q := prev[p]; q != ""; q = prev[q] {
				chain = append([]string{q}, chain...)
			}
			return strings.Join(chain, " -> ")
		}
		for _, imp := range g.imports[p] {
			if _, seen := prev[imp]; !seen {
				prev[imp] = p
				queue = append(queue, imp)
			}
		}
	}
	return dst
}

// under reports whether p is pkg or lies below it.
func under(p, pkg string) bool { return p == pkg || strings.HasPrefix(p, pkg+"/") }

// watchSources lists every directory of the module, so that go test's cache, which records
// the directories a test reads (with the size and time of each entry), runs this test again
// after any source file changes: the go list it runs as a subprocess is invisible to the cache.
func watchSources(t *testing.T) {
	t.Helper()
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && (d.Name() == ".git" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		t.Fatalf("listing the module's sources: %v", err)
	}
}

func TestDependencyDirection(t *testing.T) {
	watchSources(t)
	// The heavy parts first, so that a failure names the one that came in.
	engine := []string{"engine/backend/cuda", "engine/comm/nccl", "engine/train", "engine/backend", "engine"}
	clientRefuses := append([]string{"session/server"}, engine...)
	aboveEngine := []string{"session", "tui", "repl", "kernel", "cell", "cmd"}
	const frontEnd = "a front end links no engine: it reaches a session over RPC (session), and what it needs from the engine lives in session/proto or a leaf under internal/"
	for _, tc := range []struct {
		pattern string
		refuse  []string
		why     string
	}{
		{"./tui", clientRefuses, frontEnd},
		{"./repl", clientRefuses, frontEnd},
		{"./kernel", clientRefuses, frontEnd},
		{"./cell", clientRefuses, frontEnd},
		{"./session", clientRefuses, "the session client links neither the server nor the engine"},
		{"./internal/layoutspec", append(aboveEngine, engine...), "a leaf shared by the engine and its clients"},
		{"./internal/profilekeys", append(aboveEngine, engine...), "a leaf shared by the engine and its clients"},
		{"./engine/...", aboveEngine, "the engine knows nothing of sessions or front ends"},
	} {
		t.Run(strings.TrimPrefix(tc.pattern, "./"), func(t *testing.T) {
			g := list(t, tc.pattern)
			self, tree := strings.CutSuffix(strings.TrimPrefix(tc.pattern, "./"), "/...")
			var roots []string
			refused := map[string]string{} // package -> the rule that refuses it
			for _, p := range g.order {
				if p == self || (tree && under(p, self)) {
					roots = append(roots, p)
					continue
				}
				for _, r := range tc.refuse {
					if under(p, r) {
						refused[p] = r
						break
					}
				}
			}
			// Name only where a refused package comes in: imported by one that is allowed.
			for _, p := range g.order {
				if _, bad := refused[p]; bad {
					continue
				}
				for _, imp := range g.imports[p] {
					if r, bad := refused[imp]; bad {
						t.Errorf("%s links %s (%s), refused under %s: %s (%d refused packages in all)",
							tc.pattern, imp, g.path(roots, imp), r, tc.why, len(refused))
					}
				}
			}
		})
	}
}
