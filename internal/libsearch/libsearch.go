// Package libsearch lists where to look for a shared library that halo-shell loads at run time
// with dlopen (the CUDA driver, NVRTC, cuBLASLt, NCCL): an override variable first, then
// LD_LIBRARY_PATH, then standard folders and the folders pip wheels install, and last the bare
// soname for the dynamic loader's own search. It only lists paths; loading is the caller's.
package libsearch

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Env is what the search reads from the outside world; tests supply their own.
type Env struct {
	Getenv func(string) string
	Glob   func(string) ([]string, error)
	Exists func(string) bool // a regular file exists at the path
}

// OS is the Env of this process.
func OS() Env {
	return Env{
		Getenv: os.Getenv,
		Glob:   filepath.Glob,
		Exists: func(p string) bool {
			st, err := os.Stat(p)
			return err == nil && !st.IsDir()
		},
	}
}

// Spec describes one library.
type Spec struct {
	Override string   // environment variable naming the file to load; when set, nothing else is tried
	Sonames  []string // file names, best first (e.g. libcuda.so.1, libcuda.so)
	Dirs     []string // standard folders, searched after LD_LIBRARY_PATH
	Globs    []string // folder patterns (pip wheels' nvidia/*/lib), searched last, matches sorted
}

// Candidates lists, best first, the paths to try for s: every soname in every folder where
// the file exists (LD_LIBRARY_PATH, s.Dirs, then s.Globs), then each bare soname. The second
// result is true when the list is the override variable's value alone (a set variable is never
// second-guessed).
func Candidates(s Spec, env Env) ([]string, bool) {
	if p := env.Getenv(s.Override); s.Override != "" && p != "" {
		return []string{p}, true
	}
	var dirs []string
	for _, d := range strings.Split(env.Getenv("LD_LIBRARY_PATH"), ":") {
		if d != "" {
			dirs = append(dirs, d)
		}
	}
	dirs = append(dirs, s.Dirs...)
	for _, g := range s.Globs {
		m, _ := env.Glob(g)
		sort.Strings(m)
		dirs = append(dirs, m...)
	}
	seen := map[string]bool{}
	var out []string
	for _, so := range s.Sonames {
		for _, d := range dirs {
			p := filepath.Join(d, so)
			if !seen[p] && env.Exists(p) {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	return append(out, s.Sonames...), false
}
