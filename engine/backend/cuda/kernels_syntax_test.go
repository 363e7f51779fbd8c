package cuda

import (
	_ "embed"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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

// clangArchs returns the architectures of kernelArchs (and Hopper's sm_90a) that clang's CUDA
// front end knows: clang 14 stops at sm_86, later versions know sm_89 and sm_90a.
func clangArchs(t *testing.T, clang, builtins string) []string {
	t.Helper()
	probe := filepath.Join(t.TempDir(), "probe.cu")
	if err := os.WriteFile(probe, []byte(`extern "C" __global__ void k(float* x) { x[0] = 1; }`), 0o644); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range append(slices.Clone(kernelArchs), "sm_90a") {
		if err := exec.Command(clang, clangArgs(a, builtins, probe)...).Run(); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// clangArgs is a device-side syntax check of path for arch.
func clangArgs(arch, builtins, path string) []string {
	return []string{"-x", "cuda", "--cuda-gpu-arch=" + arch, "--cuda-device-only", "-nocudainc", "-nocudalib",
		"-fsyntax-only", "-include", builtins, path}
}

// TestKernelsParseAsCUDA checks every kernel file, exactly as kernelSource hands it to NVRTC,
// with clang's CUDA front end (device side, -fsyntax-only) for every architecture the file is
// built for that clang knows (sm_80 and sm_86 with clang 14; sm_89 and sm_90a with newer ones):
// syntax, types and every template instantiation, so that a kernel edit that would not compile
// for an A100 or a consumer card is caught without a GPU. A Hopper-only file is checked for
// sm_90a, or for sm_80 where clang does not know sm_90a. Inline PTX is not checked (ptxas does
// that: TestNVRTCCompilesEveryArch on the GPU machine). Skipped without clang, except under
// HALO_CI=1 (CI installs it).
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
	archs := clangArchs(t, clang, builtins)
	if !slices.Contains(archs, "sm_80") || !slices.Contains(archs, "sm_86") {
		t.Fatalf("%s knows only %v of the CUDA architectures; the check needs at least sm_80 and sm_86 (clang 14 or newer)", clang, archs)
	}
	t.Logf("%s checks %v", clang, archs)
	for _, f := range KernelFiles() {
		src, err := kernelSource(f)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, f)
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		var targets []string
		for _, a := range archs {
			if a == "sm_90a" {
				continue
			}
			if target, ok := kernelTarget(f, a); ok && slices.Contains(archs, target) {
				targets = append(targets, target)
			}
		}
		if len(targets) == 0 { // a Hopper-only file and a clang without sm_90a
			targets = []string{"sm_80"}
		}
		for _, a := range targets {
			out, err := exec.Command(clang, clangArgs(a, builtins, path)...).CombinedOutput()
			if err != nil {
				t.Errorf("%s does not parse as CUDA for %s: %v\n%s", f, a, err, strings.TrimSpace(string(out)))
			}
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
		out, err := exec.Command(clang, clangArgs("sm_86", builtins, path)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "error") {
			t.Errorf("%s: clang accepted a broken kernel (%v): %s", name, err, out)
		}
	}
}
