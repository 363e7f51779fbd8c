package cuda

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ebitengine/purego"

	"github.com/halo-shell/halo-shell/internal/libsearch"
)

// libSpec describes one shared library this package loads at run time.
type libSpec struct {
	// What names the library in messages ("CUDA driver").
	What string
	// Env is the environment variable that overrides the search with a file path.
	Env string
	// Sonames are the file names tried, best first.
	Sonames []string
	// Hint says what to install when the library is missing.
	Hint string
}

var (
	specDriver = libSpec{
		What:    "CUDA driver",
		Env:     swLibCUDA.Name,
		Sonames: []string{"libcuda.so.1", "libcuda.so"},
		Hint:    "install the NVIDIA driver (it provides libcuda.so.1)",
	}
	specNVRTC = libSpec{
		What:    "NVRTC",
		Env:     swLibNVRTC.Name,
		Sonames: []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"},
		Hint:    "install the CUDA toolkit's NVRTC (cuda-nvrtc-13-0, or pip nvidia-cuda-nvrtc)",
	}
	specCublasLt = libSpec{
		What:    "cuBLASLt",
		Env:     swLibCublasLt.Name,
		Sonames: []string{"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"},
		Hint:    "install the CUDA toolkit's cuBLAS (libcublas-13-0, or pip nvidia-cublas)",
	}
)

// standardLibDirs are searched after LD_LIBRARY_PATH, in this order.
var standardLibDirs = []string{
	"/usr/local/cuda/lib64",
	"/usr/local/cuda/targets/x86_64-linux/lib",
	"/usr/local/nvidia/lib64",
	"/usr/local/nvidia/lib",
	"/usr/lib/x86_64-linux-gnu",
	"/lib/x86_64-linux-gnu",
	"/usr/lib64",
	"/usr/lib/wsl/lib",
}

// sitePackagesGlobs find the nvidia/*/lib folders that PyTorch's pip wheels install.
var sitePackagesGlobs = []string{
	"/opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib",
	"/usr/local/lib/python3*/dist-packages/nvidia/*/lib",
	"/usr/lib/python3/dist-packages/nvidia/*/lib",
}

// LibraryInfo reports where one library was found, or why it was not.
type LibraryInfo struct {
	What  string   `json:"what"`
	Env   string   `json:"env"`
	Path  string   `json:"path,omitempty"`
	Tried []string `json:"tried,omitempty"`
	Err   string   `json:"error,omitempty"`
}

// searchEnv is what library discovery reads from the outside world; tests replace it.
type searchEnv struct {
	getenv func(string) string
	glob   func(string) ([]string, error)
	exists func(string) bool
}

func osSearchEnv() searchEnv {
	e := libsearch.OS()
	return searchEnv{getenv: e.Getenv, glob: e.Glob, exists: e.Exists}
}

// searchSpec is how spec is searched for: its override variable and file names in the
// standard folders, then in pip wheels' folders.
func searchSpec(spec libSpec) libsearch.Spec {
	return libsearch.Spec{Override: spec.Env, Sonames: spec.Sonames, Dirs: standardLibDirs, Globs: sitePackagesGlobs}
}

// libCandidates lists, best first, the paths to try for spec. The second result is true when the
// list comes from the override variable alone (a set variable is never second-guessed).
func libCandidates(spec libSpec, env searchEnv) ([]string, bool) {
	return libsearch.Candidates(searchSpec(spec), libsearch.Env{Getenv: env.getenv, Glob: env.glob, Exists: env.exists})
}

// openLibrary dlopens the first candidate that loads and reports what it tried.
func openLibrary(spec libSpec, env searchEnv) (uintptr, LibraryInfo, error) {
	info := LibraryInfo{What: spec.What, Env: spec.Env}
	cands, override := libCandidates(spec, env)
	var lastErr error
	for _, p := range cands {
		info.Tried = append(info.Tried, p)
		if spec.Env == specNVRTC.Env && filepath.IsAbs(p) {
			preloadNVRTCBuiltins(filepath.Dir(p))
		}
		h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err == nil {
			info.Path = p
			if !filepath.IsAbs(p) {
				info.Path = p + " (found by the dynamic loader)"
			}
			return h, info, nil
		}
		lastErr = err
	}
	var err error
	if override {
		err = fmt.Errorf("cuda: %s: cannot load %s=%q: %v; point %s at the library file or unset it", spec.What, spec.Env, cands[0], lastErr, spec.Env)
	} else {
		err = fmt.Errorf("cuda: %s not found (tried %s; last error: %v): %s, or set %s to its path", spec.What, strings.Join(info.Tried, ", "), lastErr, spec.Hint, spec.Env)
	}
	info.Err = err.Error()
	return 0, info, err
}

// preloadNVRTCBuiltins loads libnvrtc-builtins from NVRTC's own folder first, so that NVRTC's later
// dlopen of it by soname succeeds even when that folder is not on the loader's search path.
func preloadNVRTCBuiltins(dir string) {
	m, _ := filepath.Glob(filepath.Join(dir, nvrtcBuiltinsPattern))
	sort.Sort(sort.Reverse(sort.StringSlice(m)))
	for _, p := range m {
		if _, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL); err == nil {
			return
		}
	}
}

// symbolTable binds C functions of one library into Go function variables.
type symbolTable struct {
	lib    uintptr
	what   string
	errors []string
}

// bind points fn (a pointer to a func variable) at the first of names the library exports.
// Missing symbols are collected and reported together by err.
func (s *symbolTable) bind(fn any, names ...string) {
	if addr := s.addr(names...); addr != 0 {
		purego.RegisterFunc(fn, addr)
	}
}

// bindOptional binds fn to the first of names the library exports, and leaves it nil, without
// recording an error, when it exports none: for entry points that only some features need.
func (s *symbolTable) bindOptional(fn any, names ...string) {
	if addr := s.lookup(names...); addr != 0 {
		purego.RegisterFunc(fn, addr)
	}
}

// addr returns the address of the first of names the library exports, or records it missing.
func (s *symbolTable) addr(names ...string) uintptr {
	addr := s.lookup(names...)
	if addr == 0 {
		s.errors = append(s.errors, strings.Join(names, " or "))
	}
	return addr
}

// lookup returns the address of the first of names the library exports, or 0.
func (s *symbolTable) lookup(names ...string) uintptr {
	for _, n := range names {
		if addr, err := purego.Dlsym(s.lib, n); err == nil && addr != 0 {
			return addr
		}
	}
	return 0
}

func (s *symbolTable) err() error {
	if len(s.errors) == 0 {
		return nil
	}
	return fmt.Errorf("cuda: %s is missing symbols %s: the library is too old or not the one expected; point the override variable at a CUDA 12.x/13.x build", s.what, strings.Join(s.errors, ", "))
}
