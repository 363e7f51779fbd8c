package libsearch

import (
	"slices"
	"testing"
)

func fake(vars map[string]string, files []string, globs map[string][]string) Env {
	return Env{
		Getenv: func(k string) string { return vars[k] },
		Glob:   func(p string) ([]string, error) { return globs[p], nil },
		Exists: func(p string) bool { return slices.Contains(files, p) },
	}
}

func TestCandidates(t *testing.T) {
	spec := Spec{Override: "HALO_LIBX", Sonames: []string{"libx.so.1", "libx.so"},
		Dirs: []string{"/usr/lib", "/opt/lib"}, Globs: []string{"/venv/*/lib"}}
	for _, tc := range []struct {
		name     string
		vars     map[string]string
		files    []string
		globs    map[string][]string
		want     []string
		override bool
	}{
		{"override alone", map[string]string{"HALO_LIBX": "/x/libx.so", "LD_LIBRARY_PATH": "/ld"}, []string{"/ld/libx.so.1"}, nil,
			[]string{"/x/libx.so"}, true},
		{"nothing found: bare sonames", nil, nil, nil, []string{"libx.so.1", "libx.so"}, false},
		{"LD_LIBRARY_PATH before standard folders, soname order first",
			map[string]string{"LD_LIBRARY_PATH": "/ld::/ld2"},
			[]string{"/usr/lib/libx.so.1", "/ld2/libx.so.1", "/ld/libx.so"}, nil,
			[]string{"/ld2/libx.so.1", "/usr/lib/libx.so.1", "/ld/libx.so", "libx.so.1", "libx.so"}, false},
		{"wheel folders last, sorted", nil,
			[]string{"/venv/b/lib/libx.so.1", "/venv/a/lib/libx.so.1", "/opt/lib/libx.so.1"},
			map[string][]string{"/venv/*/lib": {"/venv/b/lib", "/venv/a/lib"}},
			[]string{"/opt/lib/libx.so.1", "/venv/a/lib/libx.so.1", "/venv/b/lib/libx.so.1", "libx.so.1", "libx.so"}, false},
		{"a folder listed twice is tried once", map[string]string{"LD_LIBRARY_PATH": "/usr/lib"}, []string{"/usr/lib/libx.so.1"}, nil,
			[]string{"/usr/lib/libx.so.1", "libx.so.1", "libx.so"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ov := Candidates(spec, fake(tc.vars, tc.files, tc.globs))
			if !slices.Equal(got, tc.want) || ov != tc.override {
				t.Fatalf("got %q (override %v), want %q (override %v)", got, ov, tc.want, tc.override)
			}
		})
	}
}
