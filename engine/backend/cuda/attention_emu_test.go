package cuda

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/internal/switches"
)

// hostEmu holds the host emulation of CUDA kernels (testdata/hostemu: emu.h and one *_check.cc
// driver per kernel file), embedded so that the test binary runs from any directory.
//
//go:embed testdata/hostemu/*.h testdata/hostemu/*_check.cc
var hostEmu embed.FS

// buildHostEmu compiles kernel source src (a kernels/ file, possibly rewritten for the harness)
// with testdata/hostemu's emu.h and driver check ("attention_check") into a host program and
// returns its path. It skips the test without a C++17 compiler, and fails under CI, whose
// .ci/run installs g++; what names the kernels in those messages.
func buildHostEmu(t *testing.T, what, check, src string, flags ...string) string {
	t.Helper()
	var cxx string
	for _, name := range []string{"g++", "clang++", "clang++-19", "clang++-18", "clang++-17", "clang++-16", "clang++-15", "clang++-14"} {
		if p, err := exec.LookPath(name); err == nil {
			cxx = p
			break
		}
	}
	if cxx == "" {
		if switches.CI.Value() == "1" {
			t.Fatalf("no C++ compiler: .ci/run installs g++ to run the %s kernels on the host", what)
		}
		t.Skipf("needs g++ or clang++ to run the %s kernels on the host", what)
	}
	dir := t.TempDir()
	for _, f := range []string{"emu.h", "emu_fibers.h", "emu_tensor.h", check + ".cc"} {
		b, err := hostEmu.ReadFile("testdata/hostemu/" + f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "kernels.inc"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, check)
	args := append([]string{"-std=c++17"}, flags...)
	args = append(args, "-w", "-I", dir, filepath.Join(dir, check+".cc"), "-o", bin)
	if out, err := exec.Command(cxx, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s cannot build the host emulation of the %s kernels: %v\n%s", cxx, what, err, out)
	}
	return bin
}

// writeFloats writes v to a host emulation's input as one line of space-separated values.
func writeFloats(w *bytes.Buffer, v []float32) {
	for _, x := range v {
		w.WriteString(strconv.FormatFloat(float64(x), 'g', -1, 32))
		w.WriteByte(' ')
	}
	w.WriteByte('\n')
}

// runHostEmu runs the host emulation bin on in (two minutes at most) and returns, per case, its
// outputs by name: bin prints perCase lines per case, each a name and its values.
func runHostEmu(t *testing.T, bin string, in *bytes.Buffer, perCase, cases int) []map[string][]float32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Stdin = in
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("host emulation: %v\n%s", err, stderr.Bytes())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != perCase*cases {
		t.Fatalf("host emulation printed %d lines, want %d", len(lines), perCase*cases)
	}
	gots := make([]map[string][]float32, cases)
	for ci := range gots {
		got := map[string][]float32{}
		for _, line := range lines[perCase*ci : perCase*ci+perCase] {
			f := strings.Fields(line)
			vals := make([]float32, len(f)-1)
			for i, s := range f[1:] {
				v, err := strconv.ParseFloat(s, 32)
				if err != nil {
					t.Fatalf("unexpected output %q", s)
				}
				vals[i] = float32(v)
			}
			got[f[0]] = vals
		}
		gots[ci] = got
	}
	return gots
}

// maxErrOverRMS is max |got - want| / rms(want), +Inf where a difference is NaN.
func maxErrOverRMS(got, want []float32) float64 {
	var ss, worst float64
	for i := range want {
		ss += float64(want[i]) * float64(want[i])
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if math.IsNaN(d) {
			d = math.Inf(1)
		}
		worst = max(worst, d)
	}
	return worst / math.Sqrt(ss/float64(len(want))+1e-30)
}

// compareOutputs reports, for each output of names, a length that differs from the CPU's, or
// a max |err| / rms(want) above tol(name, want); c names the case and who the side under test.
func compareOutputs(t *testing.T, c any, names []string, got, want map[string][]float32, who string, tol func(name string, want []float32) float64) {
	t.Helper()
	for _, name := range names {
		g, w := got[name], want[name]
		if len(g) != len(w) {
			t.Errorf("%v: %s: %s has %d values, the CPU %d", c, name, who, len(g), len(w))
			continue
		}
		if len(w) == 0 {
			continue
		}
		if e, lim := maxErrOverRMS(g, w), tol(name, w); !(e <= lim) {
			t.Errorf("%v: %s: %s max |err|/rms = %.3g against the CPU, above %.1e", c, name, who, e, lim)
		}
	}
}

// hostEmuTol bounds max |err| / rms(ref) of the fp32 kernels against the float64 reference:
// the worst measured is about 1e-5 (sums over 512 head dims and 150 keys), a wrong mask, chunk
// or reduction is of order 1.
const hostEmuTol = 1e-4

// TestAttentionKernelsOnHost runs the SIMT attention kernels of attention.cu, forward and
// backward, as host C++ (testdata/hostemu: a block's threads as fibers, __syncthreads and warp
// shuffles as barriers) and compares them with a float64 reference of attention.cu's contract:
// the whole-tile kernels at head dim 64 (which checks the harness against kernels the GPU tests
// cover), the chunked *_wide ones at head dims 64 (chunks past HD skipped), 300 (a last chunk
// partly past HD), 320 and 512, over GQA groups, windows shorter and longer than a 32-key tile,
// documents of 1 to 70 tokens, blocks whose rows see different key ranges and a last block past
// N, and separate key boundaries (decoding). It needs a C++17 compiler (g++ or clang++) and
// skips without one; it is skipped with -short.
func TestAttentionKernelsOnHost(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the attention kernels in a host emulation for about a minute")
	}
	src, err := kernelSource("attention.cu")
	if err != nil {
		t.Fatal(err)
	}
	// Dynamic shared memory comes from the harness, static shared arrays become function
	// statics (the harness runs one block at a time).
	n := strings.Count(src, "extern __shared__ float sm[];")
	if n != 6 {
		t.Fatalf("attention.cu declares dynamic shared memory %d times; the harness expects the 6 kernels' sm[]", n)
	}
	src = strings.ReplaceAll(src, "extern __shared__ float sm[];", "float* sm = emu_smem;")
	src = strings.ReplaceAll(src, "__shared__ ", "static ")
	// _FORTIFY_SOURCE would check _longjmp against the current stack, which a fiber switch leaves.
	bin := buildHostEmu(t, "attention", "attention_check", src, "-O2", "-U_FORTIFY_SOURCE")
	cases := []struct {
		hd, nh, nkv, window int
		scale               float64 // times 1/sqrt(hd)
		wide                bool
		lensQ, lensK        string
	}{
		{64, 4, 2, 0, 1, false, "1,7,33", "-"},
		{64, 4, 2, 16, 1, true, "1,7,33", "-"},
		{320, 2, 1, 0, 1, true, "1,40,9", "-"},
		{300, 2, 2, 0, 4, true, "20,13", "-"},
		{512, 4, 2, 5, 1, true, "37,3", "-"},
		{512, 2, 1, 40, 1, true, "70", "-"},
		{512, 2, 1, 0, 1, true, "2,1,5", "40,1,9"},
	}
	var in bytes.Buffer
	for _, c := range cases {
		w := 0
		if c.wide {
			w = 1
		}
		fmt.Fprintf(&in, "%d %d %d %d %g %d %s %s\n", c.hd, c.nh, c.nkv, c.window, c.scale, w, c.lensQ, c.lensK)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Stdin = &in
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if ctx.Err() != nil {
		t.Fatalf("the host emulation did not finish in 5 minutes (a barrier some threads never reach?); output so far:\n%s", out)
	}
	if err != nil {
		t.Fatalf("host emulation: %v\n%s%s", err, out, stderr.Bytes())
	}
	seen := map[int]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var ci int
		var name, val string
		if _, err := fmt.Sscanf(line, "case %d %s %s", &ci, &name, &val); err != nil || ci < 0 || ci >= len(cases) {
			t.Fatalf("unexpected output line %q", line)
		}
		e, err := strconv.ParseFloat(val, 64)
		if err != nil {
			t.Fatalf("unexpected output line %q", line)
		}
		seen[ci]++
		c := cases[ci]
		t.Logf("head dim %d (wide %v), docs %s keys %s: %s max |err|/rms = %.2g", c.hd, c.wide, c.lensQ, c.lensK, name, e)
		if !(e <= hostEmuTol) {
			t.Errorf("head dim %d (wide %v), NH %d, NKV %d, window %d, docs %s keys %s: %s max |err|/rms = %.3g, above %.0e",
				c.hd, c.wide, c.nh, c.nkv, c.window, c.lensQ, c.lensK, name, e, hostEmuTol)
		}
	}
	for ci, c := range cases {
		want := 5 // out, lse, dq, dk, dv
		if c.lensK != "-" {
			want = 2 // the forward alone
		}
		if seen[ci] != want {
			t.Errorf("case %d: %d outputs reported, want %d", ci, seen[ci], want)
		}
	}
}
