package nccl

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"

	"github.com/ebitengine/purego"

	"github.com/halo-shell/halo-shell/internal/libsearch"

	"github.com/halo-shell/halo-shell/internal/switches"
)

// EnvLibrary overrides library discovery with the path of libnccl.so.2.
const EnvLibrary = "HALO_LIBNCCL"

var _ = switches.Register(switches.Switch{Name: EnvLibrary, Kind: switches.Path,
	Doc: "Path of libnccl.so.2 to load instead of searching LD_LIBRARY_PATH, the standard folders and pip's nvidia-nccl wheels."})

var sonames = []string{"libnccl.so.2", "libnccl.so"}

// standardDirs are searched after LD_LIBRARY_PATH, in this order.
var standardDirs = []string{
	"/lib/x86_64-linux-gnu",
	"/usr/lib/x86_64-linux-gnu",
	"/usr/local/cuda/lib64",
	"/usr/local/cuda/targets/x86_64-linux/lib",
	"/usr/local/nvidia/lib64",
	"/usr/lib64",
}

// sitePackagesGlobs find the NCCL that PyTorch's pip wheels install.
var sitePackagesGlobs = []string{
	"/opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib",
	"/usr/local/lib/python3*/dist-packages/nvidia/nccl/lib",
	"/usr/local/lib/python3*/site-packages/nvidia/nccl/lib",
	"/usr/lib/python3/dist-packages/nvidia/nccl/lib",
}

// LibraryInfo reports where NCCL was found, or why it was not.
type LibraryInfo struct {
	Path    string   `json:"path,omitempty"`
	Version string   `json:"version,omitempty"`
	Tried   []string `json:"tried,omitempty"`
	Err     string   `json:"error,omitempty"`
}

// searchEnv is what discovery reads from the outside world; tests replace it.
type searchEnv struct {
	getenv func(string) string
	glob   func(string) ([]string, error)
	exists func(string) bool
}

func osSearchEnv() searchEnv {
	e := libsearch.OS()
	return searchEnv{getenv: e.Getenv, glob: e.Glob, exists: e.Exists}
}

// Search is how NCCL is searched for: HALO_LIBNCCL alone when set, else its file names in
// LD_LIBRARY_PATH, the standard folders and pip wheels' folders. Packaging (the Dockerfile's
// test) checks against it.
func Search() libsearch.Spec {
	return libsearch.Spec{Override: EnvLibrary, Sonames: sonames, Dirs: standardDirs, Globs: sitePackagesGlobs}
}

// candidates lists, best first, the paths to try; override is true when they come from
// HALO_LIBNCCL alone (a set variable is never second-guessed).
func candidates(env searchEnv) (paths []string, override bool) {
	return libsearch.Candidates(Search(), libsearch.Env{Getenv: env.getenv, Glob: env.glob, Exists: env.exists})
}

// open dlopens the first candidate that loads.
func open(env searchEnv) (uintptr, LibraryInfo, error) {
	var info LibraryInfo
	cands, override := candidates(env)
	var lastErr error
	for _, p := range cands {
		info.Tried = append(info.Tried, p)
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
		err = fmt.Errorf("nccl: cannot load %s=%q: %v; point %s at libnccl.so.2 or unset it", EnvLibrary, cands[0], lastErr, EnvLibrary)
	} else {
		err = fmt.Errorf("nccl: libnccl.so.2 not found (tried %s; last error: %v): install NCCL 2.18 or newer (Debian/Ubuntu libnccl2, or pip nvidia-nccl-cu12/cu13), or set %s to its path", strings.Join(info.Tried, ", "), lastErr, EnvLibrary)
	}
	info.Err = err.Error()
	return 0, info, err
}

var (
	loadOnce sync.Once
	loaded   *api
	loadErr  error
)

// load loads NCCL once per process.
func load() (*api, error) {
	loadOnce.Do(func() { loaded, loadErr = loadAPI(osSearchEnv()) })
	return loaded, loadErr
}

// Library reports where NCCL was found (or why not) and its version. It never fails.
func Library() LibraryInfo {
	a, err := load()
	if a == nil {
		return LibraryInfo{Err: err.Error()}
	}
	info := a.info
	if err != nil {
		info.Err = err.Error()
	}
	return info
}

// Version is the loaded NCCL's version code (22809 for 2.28.9).
func Version() (int, error) {
	a, err := load()
	if err != nil {
		return 0, err
	}
	return a.version, nil
}

// versionString formats an NCCL version code: major*10000 + minor*100 + patch (2.9 and newer).
func versionString(code int) string {
	if code >= 10000 {
		return fmt.Sprintf("%d.%d.%d", code/10000, code/100%100, code%100)
	}
	return fmt.Sprintf("%d.%d.%d", code/1000, code/100%10, code%100)
}

// nvlsDefault sets NCCL_NVLS_ENABLE=0 unless the environment already has a value for it. It
// returns the value in force.
func nvlsDefault(lookup func(string) (string, bool), set func(string, string) error) (string, error) {
	if v, ok := lookup("NCCL_NVLS_ENABLE"); ok {
		return v, nil
	}
	if err := set("NCCL_NVLS_ENABLE", "0"); err != nil {
		return "", fmt.Errorf("nccl: setting NCCL_NVLS_ENABLE=0: %v", err)
	}
	return "0", nil
}
