package cuda

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"unsafe"
)

//go:embed kernels/*.cu kernels/*.cuh
var kernelFS embed.FS

// commonHeader is prepended to every kernel file (NVRTC is given no include paths, so kernels need
// no CUDA headers at run time).
const commonHeaderFile = "kernels/common.cuh"

// kernelHeaders are the headers prepended, after the common one, to the kernel files that use
// them (device code shared by several files, each compiled on its own so that one that fails to
// build leaves the others usable).
var kernelHeaders = map[string][]string{
	"attention_tc.cu":    {"attention_mma.cuh"},
	"attention_fused.cu": {"attention_mma.cuh"},
	"attention_wg.cu":    {"attention_mma.cuh", "wgmma.cuh"},
	"grouped_gemm.cu":    {"attention_mma.cuh", "grouped.cuh"},
	"grouped_gemm_wg.cu": {"attention_mma.cuh", "wgmma.cuh", "grouped.cuh"},
}

// kernelTarget is the NVRTC architecture that file is compiled for on a device of arch, and
// whether it is built there at all: the warpgroup-MMA files use Hopper's wgmma instructions,
// which exist only on sm_90 and only in the sm_90a target.
func kernelTarget(file, arch string) (string, bool) {
	if file == wgKernelFile || file == groupedWGFile {
		return arch + "a", wgArch(arch)
	}
	return arch, true
}

// wgKernelFile holds the Hopper attention kernels, groupedWGFile the Hopper grouped GEMMs.
const (
	wgKernelFile  = "attention_wg.cu"
	groupedWGFile = "grouped_gemm_wg.cu"
)

// wgArch reports whether a device of arch runs wgKernelFile.
func wgArch(arch string) bool { return arch == "sm_90" }

// kernelSource returns the full source compiled for one kernels/*.cu file.
func kernelSource(file string) (string, error) {
	hdr, err := kernelFS.ReadFile(commonHeaderFile)
	if err != nil {
		return "", fmt.Errorf("cuda: embedded %s: %w", commonHeaderFile, err)
	}
	body, err := kernelFS.ReadFile("kernels/" + file)
	if err != nil {
		return "", fmt.Errorf("cuda: no embedded kernel file %q: %w", file, err)
	}
	var sb strings.Builder
	sb.Write(hdr)
	for _, h := range kernelHeaders[file] {
		raw, err := kernelFS.ReadFile("kernels/" + h)
		if err != nil {
			return "", fmt.Errorf("cuda: embedded %s (for %s): %w", h, file, err)
		}
		sb.WriteString("\n#line 1 \"" + h + "\"\n")
		sb.Write(raw)
	}
	sb.WriteString("\n#line 1 \"" + file + "\"\n")
	sb.Write(body)
	return sb.String(), nil
}

// KernelFiles lists the embedded kernels/*.cu files.
func KernelFiles() []string {
	var out []string
	_ = fs.WalkDir(kernelFS, "kernels", func(p string, de fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".cu") {
			out = append(out, filepath.Base(p))
		}
		return nil
	})
	return out
}

// KernelCacheDir is where compiled kernels are kept: $HALO_CUDA_CACHE if set, else
// <user cache dir>/halo-shell/cuda-kernels.
func KernelCacheDir() (string, error) {
	if d, ok := swCache.Lookup(); ok {
		return d, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("cuda: no cache directory for compiled kernels (%v): set HALO_CUDA_CACHE", err)
	}
	return filepath.Join(base, "halo-shell", "cuda-kernels"), nil
}

// cacheKey names a compiled kernel by everything its bytes depend on.
func cacheKey(src, arch, nvrtcVersion string, opts []string) string {
	h := sha256.New()
	for _, s := range append([]string{src, arch, nvrtcVersion}, opts...) {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return arch + "-nvrtc" + nvrtcVersion + "-" + hex.EncodeToString(h.Sum(nil))[:32] + ".cubin"
}

// kernelCache compiles sources through compile and keeps the results under dir.
type kernelCache struct {
	dir     string
	arch    string
	version string
	compile func(name, src string) ([]byte, error)
}

// get returns the CUBIN for src, from disk when present. fromCache says which. A cache that cannot
// be written is not an error: the kernel still runs, only the next process compiles again.
func (c kernelCache) get(name, src string, opts []string) (cubin []byte, fromCache bool, err error) {
	key := cacheKey(src, c.arch, c.version, opts)
	path := ""
	if c.dir != "" {
		path = filepath.Join(c.dir, key)
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			return b, true, nil
		}
	}
	cubin, err = c.compile(name, src)
	if err != nil {
		return nil, false, err
	}
	if path != "" {
		_ = writeFileAtomic(path, cubin)
	}
	return cubin, false, nil
}

// invalidate removes a cached entry that failed to load.
func (c kernelCache) invalidate(src string, opts []string) {
	if c.dir != "" {
		_ = os.Remove(filepath.Join(c.dir, cacheKey(src, c.arch, c.version, opts)))
	}
}

func writeFileAtomic(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return err
	}
	return os.Rename(f.Name(), path)
}

// module is one loaded kernels/*.cu file.
type module struct {
	handle    uintptr
	fns       map[string]uintptr
	fromCache bool
}

// kernelOpts are the NVRTC options every kernel is compiled with. HALO_CUDA_PTXAS_VERBOSE=1 adds
// ptxas' resource report (registers, shared memory, spills) to the log that HALO_CUDA_NVRTC_LOG
// prints.
func kernelOpts() []string {
	o := []string{"-lineinfo"}
	if _, ok := swPtxasVerbose.Lookup(); ok {
		o = append(o, "--ptxas-options=-v")
	}
	return o
}

// function returns a kernel of a kernels/*.cu file, compiling and loading the file on first use.
func (d *Device) function(file, name string) (uintptr, error) {
	m, err := d.moduleOnThread(file)
	if err != nil {
		return 0, err
	}
	if f, ok := m.fns[name]; ok {
		return f, nil
	}
	var f uintptr
	if err := d.drv.check("cuModuleGetFunction", d.drv.cuModuleGetFunction(&f, m.handle, cString(name))); err != nil {
		return 0, fmt.Errorf("cuda: kernel %s in %s: %w", name, file, err)
	}
	m.fns[name] = f
	return f, nil
}

func (d *Device) moduleOnThread(file string) (*module, error) {
	if m, ok := d.modules[file]; ok {
		return m, nil
	}
	if d.libs.nvrtc == nil || d.libs.nvrtc.info.Err != "" {
		return nil, fmt.Errorf("cuda: kernels need NVRTC: %v", d.libs.opsErr)
	}
	src, err := kernelSource(file)
	if err != nil {
		return nil, err
	}
	arch, ok := kernelTarget(file, d.info.KernelArch)
	if !ok {
		return nil, fmt.Errorf("cuda: %s is built only for sm_90 (Hopper); the kernels are built for %s", file, d.info.KernelArch)
	}
	if d.emulated {
		arch = ptxTarget(arch) // PTX, which the driver compiles for the newer device
	}
	dir, _ := KernelCacheDir()
	nv := d.libs.nvrtc
	cache := kernelCache{dir: dir, arch: arch, version: nv.Version(), compile: func(name, src string) ([]byte, error) {
		return nv.compile(name, src, arch, kernelOpts())
	}}
	cubin, fromCache, err := cache.get(file, src, kernelOpts())
	if err != nil {
		return nil, err
	}
	var h uintptr
	r := d.drv.cuModuleLoadData(&h, unsafe.Pointer(&cubin[0]))
	if r != cuSuccess && fromCache {
		// A stale or damaged cache entry: compile afresh.
		cache.invalidate(src, kernelOpts())
		cache.dir = ""
		if cubin, _, err = cache.get(file, src, kernelOpts()); err != nil {
			return nil, err
		}
		fromCache = false
		r = d.drv.cuModuleLoadData(&h, unsafe.Pointer(&cubin[0]))
	}
	if err := d.drv.check("cuModuleLoadData("+file+")", r); err != nil {
		return nil, err
	}
	m := &module{handle: h, fns: map[string]uintptr{}, fromCache: fromCache}
	d.modules[file] = m
	return m, nil
}

// PrepareKernels compiles (or loads from the cache) every embedded kernel file, so that the first
// training step does not pay for compilation. It returns how many files came from the cache.
func (d *Device) PrepareKernels() (fromCache int, err error) {
	err = d.Do(func() error {
		var errs []error
		for _, f := range KernelFiles() {
			if _, ok := kernelTarget(f, d.info.KernelArch); !ok {
				continue
			}
			m, err := d.moduleOnThread(f)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if m.fromCache {
				fromCache++
			}
		}
		return errors.Join(errs...)
	})
	return fromCache, err
}

// launchOnThread launches kernel name of file with the given arguments (each a pointer to the
// argument's value) on the device's stream.
func (d *Device) launchOnThread(file, name string, grid, block [3]uint32, shared uint32, args ...unsafe.Pointer) error {
	f, err := d.function(file, name)
	if err != nil {
		return err
	}
	if err := d.checkShared(name, shared); err != nil {
		return err
	}
	if shared > 48<<10 {
		if err := d.drv.check("cuFuncSetAttribute", d.drv.cuFuncSetAttribute(f, funcAttrMaxDynamicShared, int32(shared))); err != nil {
			return fmt.Errorf("cuda: kernel %s: %d bytes of shared memory: %w", name, shared, err)
		}
		if file == wgKernelFile || file == groupedWGFile {
			// Two blocks of the Hopper attention kernels (up to 113 KiB each), or of the grouped
			// GEMM's two-CTA variant (97 KiB), share a multiprocessor only with all of its L1
			// given to shared memory.
			if err := d.drv.check("cuFuncSetAttribute", d.drv.cuFuncSetAttribute(f, funcAttrSharedCarveout, 100)); err != nil {
				return fmt.Errorf("cuda: kernel %s: shared memory carveout: %w", name, err)
			}
		}
	}
	if err := d.drv.check("cuLaunchKernel("+name+")", d.drv.launch(f, grid, block, shared, d.stream, args)); err != nil {
		return err
	}
	return nil
}
