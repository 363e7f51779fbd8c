package parallel

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"math"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/optim"
	"github.com/halo-shell/halo-shell/engine/profile"
)

// fakeTimer is a DeviceTimer that records its Mark calls.
type fakeTimer struct{ record func() }

func (t fakeTimer) Mark() (backend.TimeMark, error)                    { t.record(); return 1, nil }
func (fakeTimer) Elapsed(_, _ backend.TimeMark) (time.Duration, error) { return 0, nil }
func (fakeTimer) Release(...backend.TimeMark)                          {}

// interfaceMembers makes and calls the members of backend.Optional that are interfaces (a func
// member needs no entry: allCapabilities makes it by reflection). make returns an implementation
// that calls record when used; call uses it once.
var interfaceMembers = map[reflect.Type]struct {
	make func(record func()) any
	call func(v any) error
}{
	reflect.TypeFor[backend.DeviceTimer](): {
		make: func(record func()) any { return fakeTimer{record} },
		call: func(v any) error { _, err := v.(backend.DeviceTimer).Mark(); return err },
	},
	reflect.TypeFor[backend.SyncCounter](): {
		make: func(record func()) any { return fakeSyncs{record} },
		call: func(v any) error { v.(backend.SyncCounter).HostSyncs(); return nil },
	},
}

// fakeSyncs is a SyncCounter that records its calls.
type fakeSyncs struct{ record func() }

func (s fakeSyncs) HostSyncs() int64 { s.record(); return 0 }

// allCapabilities is a CPU backend with every member of backend.Optional present, so that a
// member added to the struct is covered without editing this test: func members are made by
// reflection (each counts its calls and returns zero values), interface members come from
// interfaceMembers (a new one fails the test until it has an entry there).
type allCapabilities struct {
	backend.Backend
	opt   backend.Optional
	calls map[string]int
}

func newAllCapabilities(t *testing.T) *allCapabilities {
	t.Helper()
	b := &allCapabilities{Backend: cpu.New(cpu.Options{Workers: 1}), calls: map[string]int{}}
	v := reflect.ValueOf(&b.opt).Elem()
	for i := range v.NumField() {
		f := v.Type().Field(i)
		record := func() { b.calls[f.Name]++ }
		switch f.Type.Kind() {
		case reflect.Func:
			v.Field(i).Set(makeCounted(f.Type, record))
		case reflect.Interface:
			m, ok := interfaceMembers[f.Type]
			if !ok {
				t.Fatalf("backend.Optional.%s is an interface (%s) this test cannot make: add it to interfaceMembers", f.Name, f.Type)
			}
			v.Field(i).Set(reflect.ValueOf(m.make(record)))
		case reflect.Pointer:
			// A group of func members handed out together (DSV4): each counts as
			// "Group.Member".
			st := f.Type.Elem()
			if st.Kind() != reflect.Struct {
				t.Fatalf("backend.Optional.%s is a pointer to %s: a group must be a struct of funcs", f.Name, st.Kind())
			}
			g := reflect.New(st)
			for j := range st.NumField() {
				gf := st.Field(j)
				if gf.Type.Kind() != reflect.Func {
					t.Fatalf("backend.Optional.%s.%s is a %s: a group's members are funcs", f.Name, gf.Name, gf.Type.Kind())
				}
				name := f.Name + "." + gf.Name
				g.Elem().Field(j).Set(makeCounted(gf.Type, func() { b.calls[name]++ }))
			}
			v.Field(i).Set(g)
		default:
			t.Fatalf("backend.Optional.%s is a %s: members are funcs, interfaces or groups of funcs, nil where absent", f.Name, f.Type.Kind())
		}
	}
	return b
}

func (b *allCapabilities) Optional() backend.Optional { return b.opt }

// makeCounted makes a func of type ft that calls record and returns zero values.
func makeCounted(ft reflect.Type, record func()) reflect.Value {
	return reflect.MakeFunc(ft, func([]reflect.Value) []reflect.Value {
		record()
		out := make([]reflect.Value, ft.NumOut())
		for j := range out {
			out[j] = reflect.Zero(ft.Out(j))
		}
		return out
	})
}

// callMember calls member i of opt once with zero arguments and returns its error result.
func callMember(t *testing.T, opt backend.Optional, i int) error {
	t.Helper()
	f := reflect.ValueOf(opt).Field(i)
	if f.Kind() == reflect.Interface {
		return interfaceMembers[f.Type()].call(f.Interface())
	}
	return callFunc(f)
}

// callFunc calls the func f once with zero arguments and returns its error result.
func callFunc(f reflect.Value) error {
	ft := f.Type()
	args := make([]reflect.Value, ft.NumIn())
	for j := range args {
		args[j] = reflect.Zero(ft.In(j))
	}
	var out []reflect.Value
	if ft.IsVariadic() {
		out = f.CallSlice(args)
	} else {
		out = f.Call(args)
	}
	if n := len(out); n > 0 && ft.Out(n-1) == reflect.TypeFor[error]() && !out[n-1].IsNil() {
		return out[n-1].Interface().(error)
	}
	return nil
}

// wrapper is one way the tree wraps a backend.Backend; types names the wrapper types (module
// directory and type name) it exercises.
type wrapper struct {
	name  string
	types []string
	wrap  func(backend.Backend) backend.Backend
}

func recordingProfile(b backend.Backend) backend.Backend {
	rec := profile.NewRecorder()
	rec.Enable(true, false)
	rec.BeginStep(1)
	return profile.Wrap(b, rec)
}

// wrappers are the wrappers of the tree, alone and stacked as the trainer stacks them (a
// parallel plan's rank backend over a profiled device).
var wrappers = []wrapper{
	{"profile, off", []string{"engine/profile.Backend"}, func(b backend.Backend) backend.Backend { return profile.Wrap(b, nil) }},
	{"profile, recording", []string{"engine/profile.Backend"}, recordingProfile},
	{"rank backend", []string{"engine/parallel.rankBackend"}, func(b backend.Backend) backend.Backend { return newRankBackend(b, nil, nil) }},
	{"rank backend over profile", []string{"engine/parallel.rankBackend", "engine/profile.Backend"}, func(b backend.Backend) backend.Backend {
		return newRankBackend(recordingProfile(b), nil, nil)
	}},
	{"profile over rank backend", []string{"engine/profile.Backend", "engine/parallel.rankBackend"}, func(b backend.Backend) backend.Backend {
		return recordingProfile(newRankBackend(b, nil, nil))
	}},
}

// TestWrappersKeepOptionalCapabilities wraps a backend that has every optional capability in
// each wrapper and checks that each capability is still there and reaches the inner backend's,
// once per call.
func TestWrappersKeepOptionalCapabilities(t *testing.T) {
	for _, w := range wrappers {
		t.Run(w.name, func(t *testing.T) {
			in := newAllCapabilities(t)
			opt := w.wrap(in).Optional()
			v := reflect.ValueOf(opt)
			for i := range v.NumField() {
				name := v.Type().Field(i).Name
				if v.Field(i).IsNil() {
					t.Errorf("the wrapper hides the optional %s of the backend it wraps", name)
					continue
				}
				if v.Field(i).Kind() == reflect.Pointer {
					g := v.Field(i).Elem()
					for j := range g.NumField() {
						member := name + "." + g.Type().Field(j).Name
						if g.Field(j).IsNil() {
							t.Errorf("the wrapper hides the optional %s of the backend it wraps", member)
							continue
						}
						clear(in.calls)
						if err := callFunc(g.Field(j)); err != nil {
							t.Errorf("%s: %v", member, err)
						}
						if in.calls[member] != 1 || len(in.calls) != 1 {
							t.Errorf("one call of the wrapper's %s made the calls %v on the inner backend, want %s once", member, in.calls, member)
						}
					}
					continue
				}
				clear(in.calls)
				if err := callMember(t, opt, i); err != nil {
					t.Errorf("%s: %v", name, err)
				}
				if in.calls[name] != 1 || len(in.calls) != 1 {
					t.Errorf("one call of the wrapper's %s made the calls %v on the inner backend, want %s once", name, in.calls, name)
				}
			}
		})
	}
}

// devices are the Backend implementations of the tree that drive a device themselves rather
// than wrap another backend.
var devices = []string{"engine/backend/cpu.Backend", "engine/backend/cuda.Backend"}

// TestEveryWrapperIsCovered scans the module's non-test sources for the types that implement
// backend.Backend (they embed one, or define Optional() backend.Optional) and fails when one is
// neither a device nor exercised by TestWrappersKeepOptionalCapabilities.
func TestEveryWrapperIsCovered(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	found, _, err := scanBackendUses(root)
	if err != nil {
		t.Fatal(err)
	}
	covered := map[string]bool{}
	for _, w := range wrappers {
		for _, ty := range w.types {
			covered[ty] = true
		}
	}
	for _, d := range devices {
		covered[d] = true
	}
	for _, ty := range found {
		if !covered[ty] {
			t.Errorf("%s implements backend.Backend but no case of TestWrappersKeepOptionalCapabilities wraps a backend in it: add one (or list it in devices if it drives a device itself)", ty)
		}
		delete(covered, ty)
	}
	for ty := range covered {
		t.Errorf("%s is listed as a backend of the tree but the sources have no such type (renamed?)", ty)
	}
}

// TestNoCapabilityTypeAssertions: no non-test source finds a capability by asserting a value to
// a type of engine/backend (v.(backend.DeviceTimer)); through a wrapper that takes the slow path
// without a word, which is what Backend.Optional is for.
func TestNoCapabilityTypeAssertions(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	_, asserts, err := scanBackendUses(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range asserts {
		t.Errorf("%s: a type assertion to an engine/backend type; ask the backend's Optional() for the capability instead", a)
	}
}

// scanBackendUses reads the non-test Go files under root. types are "dir.Type" (dir relative to
// root) for every type that embeds backend.Backend or has a method Optional() backend.Optional;
// asserts are "file:line" of every type assertion or type switch case naming a type of
// engine/backend.
func scanBackendUses(root string) (types, asserts []string, err error) {
	seen := map[string]bool{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		dir, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		isSel := func(e ast.Expr, pkg, sel string) bool {
			if s, ok := e.(*ast.StarExpr); ok {
				e = s.X
			}
			s, ok := e.(*ast.SelectorExpr)
			if !ok {
				return false
			}
			x, ok := s.X.(*ast.Ident)
			return ok && x.Name == pkg && s.Sel.Name == sel
		}
		isBackendType := func(e ast.Expr) bool {
			if s, ok := e.(*ast.StarExpr); ok {
				e = s.X
			}
			s, ok := e.(*ast.SelectorExpr)
			if !ok {
				return false
			}
			x, ok := s.X.(*ast.Ident)
			return ok && x.Name == "backend"
		}
		ast.Inspect(f, func(n ast.Node) bool {
			var ts []ast.Expr
			switch n := n.(type) {
			case *ast.TypeAssertExpr:
				ts = []ast.Expr{n.Type}
			case *ast.TypeSwitchStmt:
				for _, c := range n.Body.List {
					ts = append(ts, c.(*ast.CaseClause).List...)
				}
			}
			for _, ty := range ts {
				if ty != nil && isBackendType(ty) {
					rel, _ := filepath.Rel(root, path)
					asserts = append(asserts, fmt.Sprintf("%s:%d", filepath.ToSlash(rel), fset.Position(ty.Pos()).Line))
				}
			}
			return true
		})
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					ts, ok := spec.(*ast.TypeSpec)
					if !ok {
						continue
					}
					st, ok := ts.Type.(*ast.StructType)
					if !ok {
						continue
					}
					for _, fld := range st.Fields.List {
						if len(fld.Names) == 0 && isSel(fld.Type, "backend", "Backend") {
							seen[filepath.ToSlash(dir)+"."+ts.Name.Name] = true
						}
					}
				}
			case *ast.FuncDecl:
				if d.Recv == nil || d.Name.Name != "Optional" || d.Type.Results == nil || len(d.Type.Results.List) != 1 ||
					!isSel(d.Type.Results.List[0].Type, "backend", "Optional") {
					continue
				}
				recv := d.Recv.List[0].Type
				if s, ok := recv.(*ast.StarExpr); ok {
					recv = s.X
				}
				if id, ok := recv.(*ast.Ident); ok {
					seen[filepath.ToSlash(dir)+"."+id.Name] = true
				}
			}
		}
		return nil
	})
	for ty := range seen {
		types = append(types, ty)
	}
	sort.Strings(types)
	return types, asserts, err
}

// countingDevice is a CPU device that counts the calls of Add, RMSNorm and the optional
// AddRMSNorm that reach it; with fused false it drops AddRMSNorm, so that its callers take the
// fallback. Collectives may touch a device from other goroutines, hence the lock.
type countingDevice struct {
	backend.Backend
	fused bool
	mu    sync.Mutex
	n     map[string]int
}

func (d *countingDevice) count(op string) {
	d.mu.Lock()
	d.n[op]++
	d.mu.Unlock()
}

func (d *countingDevice) counts() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.n)
}

func (d *countingDevice) Add(out, a, b T) error { d.count("Add"); return d.Backend.Add(out, a, b) }

func (d *countingDevice) RMSNorm(out, rstd, x, w T, eps float32) error {
	d.count("RMSNorm")
	return d.Backend.RMSNorm(out, rstd, x, w, eps)
}

func (d *countingDevice) Optional() backend.Optional {
	o := d.Backend.Optional()
	f := o.AddRMSNorm
	if !d.fused || f == nil {
		o.AddRMSNorm = nil
		return o
	}
	o.AddRMSNorm = func(residualOut, out, rstd, x, residual, w T, eps float32) error {
		d.count("AddRMSNorm")
		return f(residualOut, out, rstd, x, residual, w, eps)
	}
	return o
}

// TestAddRMSNormRunsFusedUnderPlans: on profiled CPU devices under data, FSDP, tensor and
// context parallel plans, the residual add + norm of every rank reaches the device's fused
// AddRMSNorm, each call replacing one Add and one RMSNorm, and the loss and gradients match those
// of the same plan on devices without the fused op.
func TestAddRMSNormRunsFusedUnderPlans(t *testing.T) {
	layouts := []struct {
		n      int
		layout string
	}{{2, ""}, {2, "fsdp"}, {2, "tp=2"}, {2, "cp=2"}, {4, "tp=2 fsdp"}, {4, "tp=2 cp=2"}}
	type run struct {
		loss  float64
		grads map[string][]float32
		ops   []map[string]int // per rank
	}
	for _, family := range []string{"llama", "qwen3"} {
		src := tinyModel(t, family, 3)
		rows := tinyRows(8, 16, 41, 4)
		for _, tc := range layouts {
			t.Run(fmt.Sprintf("%s/%d/%s", family, tc.n, strings.ReplaceAll(tc.layout, " ", ",")), func(t *testing.T) {
				l, err := mesh.ParseLayout(tc.layout)
				if err != nil {
					t.Fatal(err)
				}
				exec := func(fused bool) run {
					devs := make([]*countingDevice, tc.n)
					p, err := New(src, cpuDevices(tc.n), l, Options{Optimizer: optim.Config{}, NewBackend: func(r int) (backend.Backend, error) {
						devs[r] = &countingDevice{Backend: cpu.New(cpu.Options{Workers: 1}), fused: fused, n: map[string]int{}}
						return profile.Wrap(devs[r], nil), nil
					}})
					if err != nil {
						t.Fatal(err)
					}
					defer p.Close()
					var out run
					if out.loss, _, err = p.ForwardBackward(rows); err != nil {
						t.Fatal(err)
					}
					if out.grads, err = p.Grads(); err != nil {
						t.Fatal(err)
					}
					for _, d := range devs {
						out.ops = append(out.ops, d.counts())
					}
					return out
				}
				f, u := exec(true), exec(false)
				for r := range f.ops {
					fo, uo := f.ops[r], u.ops[r]
					if fo["AddRMSNorm"] == 0 || uo["AddRMSNorm"] != 0 {
						t.Fatalf("rank %d: %d fused AddRMSNorm calls with the fused op, %d without; want some and none", r, fo["AddRMSNorm"], uo["AddRMSNorm"])
					}
					if fo["Add"]+fo["AddRMSNorm"] != uo["Add"] || fo["RMSNorm"]+fo["AddRMSNorm"] != uo["RMSNorm"] {
						t.Errorf("rank %d: fused run %v, unfused run %v: each AddRMSNorm should replace one Add and one RMSNorm", r, fo, uo)
					}
				}
				if math.Abs(f.loss-u.loss) > 1e-6*math.Abs(u.loss) {
					t.Errorf("loss %.9g fused, %.9g unfused", f.loss, u.loss)
				}
				names := make([]string, 0, len(u.grads))
				for name := range u.grads {
					names = append(names, name)
				}
				slices.Sort(names)
				for _, name := range names {
					if err := closeTo(f.grads[name], u.grads[name], 1e-6); err != nil {
						t.Errorf("gradient %s: fused against unfused: %v", name, err)
					}
				}
			})
		}
	}
}
