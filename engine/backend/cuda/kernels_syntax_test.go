package cuda

import (
	_ "embed"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// cudaBuiltins declares, for clang, the CUDA built-ins the kernels use without CUDA's headers
// (NVRTC has them built in). Embedded, so that the test binary runs from any directory.
//
//go:embed testdata/cuda_builtins.h
var cudaBuiltins []byte

// writeBuiltins writes cudaBuiltins into dir and returns its path.
func writeBuiltins(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "cuda_builtins.h")
	if err := os.WriteFile(path, cudaBuiltins, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// clangForCUDA finds a clang that can parse CUDA (clang, or clang-14..19 as Debian names them).
func clangForCUDA() (string, bool) {
	for _, name := range []string{"clang", "clang-19", "clang-18", "clang-17", "clang-16", "clang-15", "clang-14"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, true
		}
	}
	return "", false
}

// TestKernelsParseAsCUDA checks every kernel file, exactly as kernelSource hands it to NVRTC,
// with clang's CUDA front end (device side, sm_80, -fsyntax-only): syntax, types and every
// template instantiation, so that a kernel edit that would not compile is caught without a GPU.
// Inline PTX is not checked (ptxas does that, on the GPU machine). Skipped without clang,
// except under HALO_CI=1 (CI installs it).
func TestKernelsParseAsCUDA(t *testing.T) {
	clang, ok := clangForCUDA()
	if !ok {
		if os.Getenv("HALO_CI") == "1" {
			t.Fatal("clang is not installed: CI installs clang to check the CUDA kernels")
		}
		t.Skip("needs clang (apt-get install clang) to parse the CUDA kernels")
	}
	dir := t.TempDir()
	builtins := writeBuiltins(t, dir)
	for _, f := range KernelFiles() {
		src, err := kernelSource(f)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, f)
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(clang, "-x", "cuda", "--cuda-gpu-arch=sm_80", "--cuda-device-only", "-nocudainc", "-nocudalib",
			"-fsyntax-only", "-include", builtins, path).CombinedOutput()
		if err != nil {
			t.Errorf("%s does not parse as CUDA: %v\n%s", f, err, strings.TrimSpace(string(out)))
		}
	}
}

// TestKernelSyntaxCheckCatchesErrors makes sure the check above can fail: a kernel calling an
// undeclared function and one with a type error are both refused.
func TestKernelSyntaxCheckCatchesErrors(t *testing.T) {
	clang, ok := clangForCUDA()
	if !ok {
		if os.Getenv("HALO_CI") == "1" {
			t.Fatal("clang is not installed: CI installs clang to check the CUDA kernels")
		}
		t.Skip("needs clang (apt-get install clang)")
	}
	builtins := writeBuiltins(t, t.TempDir())
	hdr, err := kernelFS.ReadFile(commonHeaderFile)
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"undeclared": `extern "C" __global__ void k(float* x) { x[threadIdx.x] = not_a_function(x[0]); }`,
		"types":      `extern "C" __global__ void k(float* x) { bf16* y = x; y[0] = 1; }`,
	} {
		path := filepath.Join(t.TempDir(), name+".cu")
		if err := os.WriteFile(path, append(hdr, body...), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(clang, "-x", "cuda", "--cuda-gpu-arch=sm_80", "--cuda-device-only", "-nocudainc", "-nocudalib",
			"-fsyntax-only", "-include", builtins, path).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "error") {
			t.Errorf("%s: clang accepted a broken kernel (%v): %s", name, err, out)
		}
	}
}
