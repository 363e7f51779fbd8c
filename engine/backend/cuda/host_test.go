package cuda

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// These tests need no GPU: they cover library discovery, the caching allocator's bookkeeping,
// the on-disk kernel cache and kernel-argument packing.

func fakeEnv(vars map[string]string, files ...string) searchEnv {
	have := map[string]bool{}
	for _, f := range files {
		have[f] = true
	}
	return searchEnv{
		getenv: func(k string) string { return vars[k] },
		glob: func(p string) ([]string, error) {
			var out []string
			for f := range have {
				if ok, _ := filepath.Match(p, filepath.Dir(f)); ok {
					out = append(out, filepath.Dir(f))
				}
			}
			return out, nil
		},
		exists: func(p string) bool { return have[p] },
	}
}

func TestLibCandidatesOrder(t *testing.T) {
	tests := []struct {
		name     string
		vars     map[string]string
		files    []string
		spec     libSpec
		want     []string
		override bool
	}{
		{
			name: "override variable wins alone",
			vars: map[string]string{"HALO_LIBCUDA": "/opt/x/libcuda.so.1", "LD_LIBRARY_PATH": "/ld"},
			spec: specDriver, files: []string{"/ld/libcuda.so.1"},
			want: []string{"/opt/x/libcuda.so.1"}, override: true,
		},
		{
			name: "LD_LIBRARY_PATH before standard places, then the loader's search",
			vars: map[string]string{"LD_LIBRARY_PATH": "/a::/b"},
			spec: specNVRTC,
			files: []string{"/b/libnvrtc.so.13", "/usr/local/cuda/lib64/libnvrtc.so.13",
				"/a/libnvrtc.so.12"},
			want: []string{"/b/libnvrtc.so.13", "/usr/local/cuda/lib64/libnvrtc.so.13", "/a/libnvrtc.so.12",
				"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"},
		},
		{
			name:  "site-packages of a torch venv",
			spec:  specCublasLt,
			files: []string{"/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcublasLt.so.13"},
			want: []string{"/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcublasLt.so.13",
				"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, override := libCandidates(tc.spec, fakeEnv(tc.vars, tc.files...))
			if override != tc.override || strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("candidates = %v (override %v), want %v (override %v)", got, override, tc.want, tc.override)
			}
		})
	}
}

func TestOpenLibraryErrorsNameWhatToSet(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libcuda.so.1")
	tests := []struct {
		name string
		env  searchEnv
		want []string
	}{
		{"override points at a missing file", fakeEnv(map[string]string{"HALO_LIBCUDA": missing}),
			[]string{"CUDA driver", "HALO_LIBCUDA", missing, "unset it"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, info, err := openLibrary(specDriver, tc.env)
			if err == nil {
				t.Fatal("openLibrary succeeded for a missing file")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if info.Err != err.Error() || info.Path != "" {
				t.Errorf("info = %+v, want the error recorded and no path", info)
			}
		})
	}
}

func TestOpenLibrariesReportsEveryMissingLibrary(t *testing.T) {
	dir := t.TempDir()
	env := fakeEnv(map[string]string{
		"HALO_LIBCUDA":     filepath.Join(dir, "nope-cuda.so"),
		"HALO_LIBNVRTC":    filepath.Join(dir, "nope-nvrtc.so"),
		"HALO_LIBCUBLASLT": filepath.Join(dir, "nope-lt.so"),
	})
	l := openLibraries(env)
	if l.err == nil || !strings.Contains(l.err.Error(), "HALO_LIBCUDA") {
		t.Errorf("driver error = %v, want one naming HALO_LIBCUDA", l.err)
	}
	for _, w := range []string{"HALO_LIBNVRTC", "HALO_LIBCUBLASLT"} {
		if l.opsErr == nil || !strings.Contains(l.opsErr.Error(), w) {
			t.Errorf("library error = %v, want one naming %s", l.opsErr, w)
		}
	}
}

// TestAvailableSaysWhy checks the process-wide answer: on a machine without a GPU it is an error
// that names a library or device and a remedy; with one it is nil and a device exists.
func TestAvailableSaysWhy(t *testing.T) {
	err := Available()
	if err == nil {
		if DeviceCount() == 0 {
			t.Fatal("Available() == nil but DeviceCount() == 0")
		}
		return
	}
	msg := err.Error()
	if !strings.Contains(msg, "HALO_LIB") && !strings.Contains(msg, "nvidia-smi") {
		t.Errorf("Available() = %q: names neither an override variable nor what to check", msg)
	}
	dg := Diagnose()
	if dg.Usable || dg.Reason == "" || len(dg.Libraries) != 3 {
		t.Errorf("Diagnose() = %+v, want unusable with a reason and three libraries", dg)
	}
}

// fakeMemory hands out increasing addresses and can be made to run out.
type fakeMemory struct {
	next, limit, inUse uint64
	frees              int
	sizes              map[uintptr]uint64
}

func (m *fakeMemory) alloc(n uint64) (uintptr, error) {
	if m.limit > 0 && m.inUse+n > m.limit {
		return 0, fmt.Errorf("%w (fake)", errOutOfMemory)
	}
	m.next += 1 << 32
	m.inUse += n
	if m.sizes == nil {
		m.sizes = map[uintptr]uint64{}
	}
	m.sizes[uintptr(m.next)] = n
	return uintptr(m.next), nil
}

func (m *fakeMemory) free(p uintptr) error {
	m.frees++
	m.inUse -= m.sizes[p]
	delete(m.sizes, p)
	return nil
}

func TestSizeClass(t *testing.T) {
	for _, tc := range []struct{ in, want uint64 }{
		{1, 512}, {512, 512}, {513, 1024}, {smallLimit - 1, smallLimit}, {smallLimit, 2 << 20},
		{smallLimit + 1, 2 << 20}, {5 << 20, 6 << 20},
	} {
		if got := sizeClass(tc.in); got != tc.want {
			t.Errorf("sizeClass(%d) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestCachingAllocatorReusesAndCounts(t *testing.T) {
	raw := &fakeMemory{}
	a := newCachingAllocator(raw)
	p1, err := a.Alloc(1000)
	if err != nil {
		t.Fatal(err)
	}
	p2, _ := a.Alloc(3 << 20)
	if s := a.Stats(); s.Allocated != 1024+(4<<20) || s.Reserved != s.Allocated || s.PeakAllocated != s.Allocated {
		t.Fatalf("after two allocations: %+v", s)
	}
	if err := a.Free(p1); err != nil {
		t.Fatal(err)
	}
	p3, _ := a.Alloc(700) // same class as p1: must reuse it
	if p3 != p1 {
		t.Errorf("allocation of the same size class got %#x, want reused %#x", p3, p1)
	}
	s := a.Stats()
	if s.CacheHits != 1 || s.Allocs != 3 || s.Reserved != 1024+(4<<20) {
		t.Errorf("stats %+v: want 1 cache hit of 3 allocations and no new reservation", s)
	}
	if err := a.Free(p2); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(p2); err == nil || !strings.Contains(err.Error(), "double free") {
		t.Errorf("second free = %v, want a double-free error", err)
	}
	if s := a.Stats(); s.Allocated != 1024 || s.PeakAllocated != 1024+(4<<20) {
		t.Errorf("after free: %+v, want allocated 1024 and the peak kept", s)
	}
	a.ResetPeak()
	if s := a.Stats(); s.PeakAllocated != 1024 {
		t.Errorf("after ResetPeak: %+v", s)
	}
	if err := a.EmptyCache(); err != nil || raw.frees != 1 || a.Stats().Reserved != 1024 {
		t.Errorf("EmptyCache: err %v, frees %d, stats %+v: want the cached 4 MiB block returned", err, raw.frees, a.Stats())
	}
}

// TestCachingAllocatorHandsOutCachedBlocksOnAnyGoroutine checks Cached: only blocks on a free
// list, counted as cache hits, never a new reservation, safe beside the device goroutine's
// allocations and frees (run with -race).
func TestCachingAllocatorHandsOutCachedBlocksOnAnyGoroutine(t *testing.T) {
	raw := &fakeMemory{}
	a := newCachingAllocator(raw)
	if p, ok := a.Cached(1000); ok {
		t.Fatalf("Cached on an empty allocator returned %#x", p)
	}
	p1, err := a.Alloc(1000)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Cached(1000); ok {
		t.Fatal("Cached returned a live block")
	}
	if err := a.Free(p1); err != nil {
		t.Fatal(err)
	}
	if p, ok := a.Cached(4096); ok {
		t.Fatalf("Cached(4096) returned %#x from the 1024-byte class", p)
	}
	p2, ok := a.Cached(600)
	if !ok || p2 != p1 {
		t.Fatalf("Cached(600) = %#x, %v: want the freed block %#x", p2, ok, p1)
	}
	if s := a.Stats(); s.CacheHits != 1 || s.Allocs != 2 || s.Allocated != 1024 || s.Reserved != 1024 {
		t.Errorf("stats %+v: want 2 allocations, 1 cache hit, 1024 bytes live and reserved", s)
	}
	if err := a.Free(p2); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := make(chan struct{})
	wg.Add(1)
	go func() { // the device goroutine: allocate and free in a loop
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			p, err := a.Alloc(2048)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			err = a.Free(p)
			mu.Unlock()
			if err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for range 2000 {
		if p, ok := a.Cached(2048); ok {
			if err := a.Free(p); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(done)
	wg.Wait()
	if s := a.Stats(); s.Allocated != 0 {
		t.Errorf("after every block was freed: %+v", s)
	}
}

// TestCachingAllocatorCap: a cap set with setLimit (HALO_DEVICE_MEMORY_GIB or the run's
// max_device_memory_gib) refuses past it with the out-of-memory error naming the setting.
func TestCachingAllocatorCap(t *testing.T) {
	a := newCachingAllocator(&fakeMemory{})
	p, err := a.Alloc(6 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.setLimit(4<<20, "max_device_memory_gib"); err == nil || !strings.Contains(err.Error(), "already reserved") {
		t.Errorf("a cap below what is reserved: %v", err)
	}
	if err := a.setLimit(10<<20, "max_device_memory_gib"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Alloc(2 << 20); err != nil {
		t.Errorf("an allocation within the cap: %v", err)
	}
	_, err = a.Alloc(4 << 20)
	if !errors.Is(err, errOutOfMemory) || !strings.Contains(err.Error(), "max_device_memory_gib") {
		t.Errorf("an allocation past the cap: %v, want out of memory naming max_device_memory_gib", err)
	}
	a.Free(p)
	if _, err := a.Alloc(4 << 20); err != nil {
		t.Errorf("after a free (cache returned to the driver): %v", err)
	}
}

func TestCachingAllocatorOutOfMemory(t *testing.T) {
	raw := &fakeMemory{limit: 8 << 20}
	a := newCachingAllocator(raw)
	p, err := a.Alloc(6 << 20)
	if err != nil {
		t.Fatal(err)
	}
	a.Free(p) // cached, still reserved
	// A different class does not fit next to the cached block: the allocator must return the
	// cache to the driver and retry.
	if _, err := a.Alloc(4 << 20); err != nil {
		t.Fatalf("allocation after freeing the cache failed: %v", err)
	}
	if raw.frees != 1 {
		t.Errorf("driver frees = %d, want 1 (the cached block)", raw.frees)
	}
	_, err = a.Alloc(7 << 20)
	if err == nil || !errors.Is(err, errOutOfMemory) || !strings.Contains(err.Error(), "reduce the batch") {
		t.Errorf("over-limit allocation: %v, want an out-of-memory error with advice", err)
	}
	if _, err := a.Alloc(0); err == nil {
		t.Error("zero-byte allocation succeeded")
	}
	if _, err := a.Alloc(1 << 50); err == nil {
		t.Error("2^50-byte allocation succeeded")
	}
}

func TestKernelCache(t *testing.T) {
	dir := t.TempDir()
	compiles := 0
	c := kernelCache{dir: dir, arch: "sm_90", version: "13.0", compile: func(name, src string) ([]byte, error) {
		compiles++
		return []byte("cubin:" + src), nil
	}}
	b1, hit1, err := c.get("a.cu", "src-a", kernelOpts())
	if err != nil || hit1 || string(b1) != "cubin:src-a" {
		t.Fatalf("first get = %q, %v, %v", b1, hit1, err)
	}
	b2, hit2, err := c.get("a.cu", "src-a", kernelOpts())
	if err != nil || !hit2 || string(b2) != string(b1) || compiles != 1 {
		t.Fatalf("second get = %q, hit %v, err %v, compiles %d: want a cache hit", b2, hit2, err, compiles)
	}
	// Any change of source, arch or NVRTC version is a different entry.
	for _, cc := range []kernelCache{
		{dir: dir, arch: "sm_80", version: "13.0", compile: c.compile},
		{dir: dir, arch: "sm_90", version: "13.1", compile: c.compile},
	} {
		if _, hit, _ := cc.get("a.cu", "src-a", kernelOpts()); hit {
			t.Errorf("arch %s nvrtc %s hit the sm_90/13.0 entry", cc.arch, cc.version)
		}
	}
	if _, hit, _ := c.get("a.cu", "src-b", kernelOpts()); hit {
		t.Error("changed source hit the old entry")
	}
	c.invalidate("src-a", kernelOpts())
	if _, hit, _ := c.get("a.cu", "src-a", kernelOpts()); hit {
		t.Error("invalidated entry still hit")
	}
	// Compile errors pass through and leave nothing behind.
	bad := kernelCache{dir: dir, arch: "sm_90", version: "13.0", compile: func(string, string) ([]byte, error) {
		return nil, errors.New("syntax error")
	}}
	if _, _, err := bad.get("bad.cu", "oops", kernelOpts()); err == nil {
		t.Error("compile error was swallowed")
	}
	if _, err := os.Stat(filepath.Join(dir, cacheKey("oops", "sm_90", "13.0", kernelOpts()))); !os.IsNotExist(err) {
		t.Errorf("failed compile left a cache entry: %v", err)
	}
}

func TestKernelCacheDirOverride(t *testing.T) {
	t.Setenv("HALO_CUDA_CACHE", "/tmp/somewhere")
	if d, err := KernelCacheDir(); err != nil || d != "/tmp/somewhere" {
		t.Errorf("KernelCacheDir = %q, %v", d, err)
	}
}

// TestKernelTargets checks which architecture each kernel file is compiled for: the Hopper
// attention and grouped GEMM kernels only on sm_90, as sm_90a (wgmma exists nowhere else); every other file on
// every device, for the device's own architecture.
func TestKernelTargets(t *testing.T) {
	for _, c := range []struct {
		file, arch, want string
		built            bool
	}{
		{"attention_wg.cu", "sm_90", "sm_90a", true},
		{"attention_wg.cu", "sm_80", "", false},
		{"attention_wg.cu", "sm_89", "", false},
		{"attention_wg.cu", "sm_100", "", false},
		{"grouped_gemm_wg.cu", "sm_90", "sm_90a", true},
		{"grouped_gemm_wg.cu", "sm_86", "", false},
		{"grouped_gemm.cu", "sm_90", "sm_90", true},
		{"attention_tc.cu", "sm_90", "sm_90", true},
		{"rmsnorm.cu", "sm_86", "sm_86", true},
	} {
		got, built := kernelTarget(c.file, c.arch)
		if built != c.built || (built && got != c.want) {
			t.Errorf("kernelTarget(%s, %s) = %q, %v; want %q, %v", c.file, c.arch, got, built, c.want, c.built)
		}
	}
}

// TestWGKernelsFitTheirBlocks checks every compiled Hopper attention kernel's shared memory: it
// fits a block's 227 KiB, and as many blocks as its register budget is compiled for (at least
// two) fit a multiprocessor's 228 KiB with the 1 KiB the driver keeps for each; and every kernel
// the defaults name is compiled.
func TestWGKernelsFitTheirBlocks(t *testing.T) {
	for _, k := range wgKernels {
		n, blocks := int(k.Shared()), max(k.Blocks, 2)
		if n > 227<<10 || blocks*(n+1024) > 228<<10 {
			t.Errorf("%s: %d bytes of shared memory; %d blocks do not fit an sm_90 multiprocessor", k.Name(), n, blocks)
		}
		if n < 1024+2*wgRows*k.HD*2 {
			t.Errorf("%s: %d bytes cannot hold the aligned tiles", k.Name(), n)
		}
	}
	src, err := kernelSource(wgKernelFile)
	if err != nil {
		t.Fatal(err)
	}
	for key, k := range wgDefault {
		if !slices.Contains(wgKernels, k) {
			t.Errorf("default %s = %s is not in wgKernels", key, k.Name())
		}
	}
	// Every listed kernel is instantiated: its name's parts appear in one WG_* line.
	for _, k := range wgKernels {
		suf := k.suffix()
		macro := map[string]string{"fwd": "WG_FWD", "dq": "WG_DQ", "dkv": "WG_DKV"}[k.Kind]
		line := fmt.Sprintf("%s(%d, ", macro, k.HD)
		if k.Kind == "fwd" {
			line += fmt.Sprintf("%d, ", k.BK)
		}
		line += fmt.Sprintf("%s, %d)", suf, max(k.Blocks, 1))
		if !strings.Contains(src, line) {
			t.Errorf("%s: no %q in %s", k.Name(), line, wgKernelFile)
		}
	}
}

func TestEmbeddedKernels(t *testing.T) {
	files := KernelFiles()
	want := []string{"adamw.cu", "attention.cu", "attention_fused.cu", "attention_sinks.cu", "attention_tc.cu", "attention_wg.cu", "columns.cu", "crossentropy.cu", "decode.cu", "dropout.cu", "dsv4_attention.cu", "dsv4_hyper.cu", "dsv4_pool.cu", "dsv4_softmax.cu", "elementwise.cu", "embedding.cu", "gated_delta.cu", "gated_delta_stages.cu", "geglu.cu", "grouped_gemm.cu", "grouped_gemm_wg.cu", "moe.cu", "nf4.cu", "rmsnorm.cu", "rope.cu", "shortconv.cu", "swiglu.cu"}
	if strings.Join(files, ",") != strings.Join(want, ",") {
		t.Errorf("embedded kernel files = %v, want %v", files, want)
	}
	for _, f := range files {
		src, err := kernelSource(f)
		if err != nil {
			t.Fatal(err)
		}
		// Each file opens with its gradient contract and includes the common header first.
		body := src[strings.Index(src, "#line 1 \""+f+"\""):]
		lines := strings.SplitN(body, "\n", 3)
		if !strings.HasPrefix(lines[1], "// "+f+":") {
			t.Errorf("%s does not open with a '// %s:' header comment", f, f)
		}
		header := body[:strings.Index(body, "\n\n")]
		if !strings.Contains(header, "(=") && !strings.Contains(header, "(+=") {
			t.Errorf("%s: header marks no output as (=) or (+=)", f)
		}
		if !strings.Contains(src, "typedef unsigned short bf16;") {
			t.Errorf("%s is compiled without common.cuh", f)
		}
		for _, h := range kernelHeaders[f] {
			if !strings.Contains(src, "#line 1 \""+h+"\"") || strings.Index(src, h) > strings.Index(src, "#line 1 \""+f+"\"") {
				t.Errorf("%s is compiled without %s before it", f, h)
			}
		}
	}
}

func TestPackArgs(t *testing.T) {
	p := packArgs(uintptr(0xdeadbeef), int32(-2), float32(1.5), int64(-3), uint64(1<<40), uint32(7))
	if *(*uintptr)(p[0]) != 0xdeadbeef || *(*int32)(p[1]) != -2 || *(*float32)(p[2]) != 1.5 ||
		*(*int64)(p[3]) != -3 || *(*uint64)(p[4]) != 1<<40 || *(*uint32)(p[5]) != 7 {
		t.Errorf("packed values read back wrong")
	}
	if math.Float32bits(*(*float32)(p[2])) != math.Float32bits(1.5) {
		t.Error("float32 bits changed")
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "Go int") {
			t.Errorf("packing a Go int: recover() = %v, want a panic naming the problem", r)
		}
	}()
	packArgs(int(3))
}

// TestBF16ProbabilityRoundingNeedsMMATolerance simulates, on the host, what the tensor-core
// attention kernels do differently from the SIMT ones: they round the probabilities P to bf16
// before P·V. For one causal document it measures the largest change of the (bf16) output
// against the tolerance form the GPU tests use, and checks that the SIMT tolerance would not
// cover it while the tensor-core tolerance does, so neither tolerance is looser than needed.
func TestBF16ProbabilityRoundingNeedsMMATolerance(t *testing.T) {
	const T, HD = 300, 128
	rng := rand.New(rand.NewPCG(3, 3))
	bf := func(x float32) float32 { return tensor.BF16ToF32(tensor.F32ToBF16(x)) }
	mat := func() [][]float32 {
		m := make([][]float32, T)
		for i := range m {
			m[i] = make([]float32, HD)
			for d := range m[i] {
				m[i][d] = bf(float32(rng.NormFloat64()))
			}
		}
		return m
	}
	q, k, v := mat(), mat(), mat()
	scale := float32(1 / math.Sqrt(HD))
	var refs, errs []float64
	for i := 0; i < T; i++ {
		p := make([]float32, i+1)
		m := float32(math.Inf(-1))
		for j := range p {
			var dot float32
			for d := 0; d < HD; d++ {
				dot += q[i][d] * k[j][d]
			}
			p[j] = dot * scale
			m = max(m, p[j])
		}
		var l float32
		for j := range p {
			p[j] = float32(math.Exp(float64(p[j] - m)))
			l += p[j]
		}
		for d := 0; d < HD; d++ {
			var exact, rounded float32
			for j := range p {
				exact += p[j] * v[j][d]
				rounded += bf(p[j]) * v[j][d]
			}
			ref, got := bf(exact/l), bf(rounded/l)
			refs = append(refs, float64(ref))
			errs = append(errs, math.Abs(float64(got-ref)))
		}
	}
	var ss float64
	for _, r := range refs {
		ss += r * r
	}
	rms := math.Sqrt(ss / float64(len(refs)))
	worst := 0.0
	for i, e := range errs {
		worst = math.Max(worst, e/(attnAbsFrac*rms+2*bf16Eps*math.Abs(refs[i])))
	}
	t.Logf("P rounded to bf16: worst error / SIMT tolerance = %.2f", worst)
	if worst <= 1 {
		t.Errorf("bf16 rounding of P stays within the SIMT tolerance (ratio %.2f): the tensor-core tolerance factor %d is looser than needed", worst, mmaTolFactor)
	}
	if worst > mmaTolFactor {
		t.Errorf("bf16 rounding of P alone exceeds the tensor-core tolerance (ratio %.2f > %d)", worst, mmaTolFactor)
	}
}

// FuzzLibCandidates feeds arbitrary search paths to library discovery: it must never panic, must
// honour an override alone, and must otherwise end with the loader's own search by soname.
func FuzzLibCandidates(f *testing.F) {
	f.Add("/usr/lib:/opt/cuda/lib64", "")
	f.Add("::::", "/x/libcuda.so.1")
	f.Add("\x00:/a/../b", "")
	f.Fuzz(func(t *testing.T, ldPath, override string) {
		env := fakeEnv(map[string]string{"LD_LIBRARY_PATH": ldPath, "HALO_LIBCUDA": override}, "/usr/lib/libcuda.so.1")
		got, isOverride := libCandidates(specDriver, env)
		if override != "" {
			if !isOverride || len(got) != 1 || got[0] != override {
				t.Fatalf("override %q: candidates %v", override, got)
			}
			return
		}
		n := len(specDriver.Sonames)
		if len(got) < n || strings.Join(got[len(got)-n:], ",") != strings.Join(specDriver.Sonames, ",") {
			t.Fatalf("candidates %v do not end with the bare sonames", got)
		}
	})
}

// TestQwen3JSONIsAConfig checks the GPU tests' model configs parse with the shape asked for.
func TestQwen3JSONIsAConfig(t *testing.T) {
	cfg, err := config.Parse(qwen3JSON(256, 768, 8, 4, 2, 64, 32000), "small-qwen3")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.HiddenSize != 256 || cfg.IntermediateSize != 768 || cfg.NumHiddenLayers != 8 || cfg.NumAttentionHeads != 4 ||
		cfg.NumKeyValueHeads != 2 || cfg.HeadDim != 64 || cfg.VocabSize != 32000 || !cfg.TieWordEmbeddings {
		t.Fatalf("parsed %+v", cfg)
	}
}
