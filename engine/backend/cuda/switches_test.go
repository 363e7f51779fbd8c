package cuda

import (
	"strconv"
	"strings"
	"testing"
)

// TestOptionsFromSwitches shows each tuning switch changing the options a Backend is made
// with, and a value outside a switch's list refused with its name.
func TestOptionsFromSwitches(t *testing.T) {
	def := backendOptions{attnMMA: true, attnWG: true, emptyUncleared: true}
	cases := []struct {
		name, env, val, arch string
		want                 backendOptions
		err                  string
	}{
		{"defaults on sm_90", "", "", "sm_90", def, ""},
		{"defaults on sm_89", "", "", "sm_89", backendOptions{attnMMA: true, emptyUncleared: true}, ""},
		{"attention mma", "HALO_CUDA_ATTENTION", "mma", "sm_90", backendOptions{attnMMA: true, emptyUncleared: true}, ""},
		{"attention simt", "HALO_CUDA_ATTENTION", "simt", "sm_90", backendOptions{emptyUncleared: true}, ""},
		{"attention typo", "HALO_CUDA_ATTENTION", "smit", "sm_90", backendOptions{}, `HALO_CUDA_ATTENTION="smit" is not one of auto, mma, simt`},
		{"fused backward", "HALO_CUDA_ATTN_BWD", "fused", "sm_90", backendOptions{attnMMA: true, attnWG: true, attnFused: true, emptyUncleared: true}, ""},
		{"cleared empty", "HALO_CUDA_EMPTY", "cleared", "sm_90", backendOptions{attnMMA: true, attnWG: true}, ""},
		{"split-K off", "HALO_CUDA_GEMM_SPLITK", "off", "sm_90", backendOptions{attnMMA: true, attnWG: true, emptyUncleared: true, noSplitK: true}, ""},
		{"beta fold", "HALO_CUDA_GEMM_BETA", "fold", "sm_90", backendOptions{attnMMA: true, attnWG: true, emptyUncleared: true, gemmFoldBeta: true}, ""},
		{"beta typo", "HALO_CUDA_GEMM_BETA", "folded", "sm_90", backendOptions{}, "HALO_CUDA_GEMM_BETA"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.env != "" {
				t.Setenv(c.env, c.val)
			}
			got, err := optionsFromSwitches(c.arch)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("options = %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
}

// TestSwitchDefaultsMatchCode keeps the documented defaults of the GEMM tuning switches equal
// to the values the code uses when they are unset.
func TestSwitchDefaultsMatchCode(t *testing.T) {
	d := defaultGemmTuneConfig()
	if swGemmCandidates.Default != strconv.Itoa(d.Candidates) {
		t.Errorf("%s documents %s, code uses %d", swGemmCandidates.Name, swGemmCandidates.Default, d.Candidates)
	}
	if f, _ := strconv.ParseFloat(swGemmTuneMinFLOPs.Default, 64); f != d.MinFLOPs {
		t.Errorf("%s documents %s, code uses %g", swGemmTuneMinFLOPs.Name, swGemmTuneMinFLOPs.Default, d.MinFLOPs)
	}
}

// TestDebugAndPathSwitches shows the remaining switches taking effect where the host can see
// it: the kernel cache directory, ptxas' verbose option, the library override and the
// synchronous queue.
func TestDebugAndPathSwitches(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("HALO_CUDA_CACHE", dir)
	if got, err := KernelCacheDir(); err != nil || got != dir {
		t.Errorf("KernelCacheDir = %q, %v; want %q", got, err, dir)
	}
	t.Setenv("HALO_CUDA_PTXAS_VERBOSE", "1")
	if !strings.Contains(strings.Join(kernelOpts(), " "), "ptxas") {
		t.Errorf("HALO_CUDA_PTXAS_VERBOSE=1: kernel options %v lack the ptxas report", kernelOpts())
	}
	if _, ok := swNVRTCLog.Lookup(); ok {
		t.Fatal("HALO_CUDA_NVRTC_LOG is set in the test environment")
	}
	t.Setenv("HALO_CUDA_NVRTC_LOG", "1")
	if _, ok := swNVRTCLog.Lookup(); !ok {
		t.Error("HALO_CUDA_NVRTC_LOG=1 not seen")
	}
	if q := newCmdQueue("test", func() bool { return false }); !q.async {
		t.Error("the command queue is synchronous without HALO_CUDA_SYNC_OPS")
	}
	t.Setenv("HALO_CUDA_SYNC_OPS", "1")
	if q := newCmdQueue("test", func() bool { return false }); q.async {
		t.Error("HALO_CUDA_SYNC_OPS=1: the command queue still posts asynchronously")
	}
	for _, s := range []libSpec{specDriver, specNVRTC, specCublasLt} {
		if !strings.HasPrefix(s.Env, "HALO_LIB") {
			t.Errorf("%s: override variable %q", s.What, s.Env)
		}
	}
}
