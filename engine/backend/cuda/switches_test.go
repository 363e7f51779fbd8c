package cuda

import (
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/internal/switches"
)

// TestOptionsFromSwitches shows each tuning switch changing the options a Backend is made
// with, and a value outside a switch's list refused with its name.
func TestOptionsFromSwitches(t *testing.T) {
	// with is the sm_90 defaults changed by f.
	with := func(f func(o *backendOptions)) backendOptions {
		o := defaultBackendOptions("sm_90")
		f(&o)
		return o
	}
	def := with(func(*backendOptions) {})
	if !def.attnMMA || !def.attnWG || def.attnFused || !def.emptyUncleared || def.noSplitK || def.gemmFoldBeta || !def.moeKernels || def.groupedWG != "auto" {
		t.Fatalf("sm_90 defaults %+v: want tensor-core and warpgroup attention, the split backward, uncleared Empty, split-K, direct Beta, the MoE kernels, warpgroup grouped GEMMs", def)
	}
	cases := []struct {
		name, env, val, arch string
		want                 backendOptions
		err                  string
	}{
		{"defaults on sm_90", "", "", "sm_90", def, ""},
		{"defaults on sm_89", "", "", "sm_89", with(func(o *backendOptions) { o.attnWG, o.groupedWG = false, "" }), ""},
		{"attention mma", "HALO_CUDA_ATTENTION", "mma", "sm_90", with(func(o *backendOptions) { o.attnWG = false }), ""},
		{"attention simt", "HALO_CUDA_ATTENTION", "simt", "sm_90", with(func(o *backendOptions) { o.attnMMA, o.attnWG = false, false }), ""},
		{"attention typo", "HALO_CUDA_ATTENTION", "smit", "sm_90", backendOptions{}, `HALO_CUDA_ATTENTION="smit" is not one of auto, mma, simt`},
		{"fused backward", "HALO_CUDA_ATTN_BWD", "fused", "sm_90", with(func(o *backendOptions) { o.attnFused = true }), ""},
		{"cleared empty", "HALO_CUDA_EMPTY", "cleared", "sm_90", with(func(o *backendOptions) { o.emptyUncleared = false }), ""},
		{"split-K off", "HALO_CUDA_GEMM_SPLITK", "off", "sm_90", with(func(o *backendOptions) { o.noSplitK = true }), ""},
		{"beta fold", "HALO_CUDA_GEMM_BETA", "fold", "sm_90", with(func(o *backendOptions) { o.gemmFoldBeta = true }), ""},
		{"beta typo", "HALO_CUDA_GEMM_BETA", "folded", "sm_90", backendOptions{}, "HALO_CUDA_GEMM_BETA"},
		{"moe kernels on", "HALO_CUDA_MOE_KERNELS", "on", "sm_90", def, ""},
		{"moe kernels off", "HALO_CUDA_MOE_KERNELS", "off", "sm_90", with(func(o *backendOptions) { o.moeKernels = false }), ""},
		{"grouped mma on sm_90", "HALO_CUDA_GROUPED_GEMM", "mma", "sm_90", with(func(o *backendOptions) { o.groupedWG = "" }), ""},
		{"grouped wg-n256 on sm_90", "HALO_CUDA_GROUPED_GEMM", "wg-n256", "sm_90", with(func(o *backendOptions) { o.groupedWG = "wg-n256" }), ""},
		{"grouped wg-n128x2 on sm_89", "HALO_CUDA_GROUPED_GEMM", "wg-n128x2", "sm_89", with(func(o *backendOptions) { o.attnWG, o.groupedWG = false, "" }), ""},
		{"grouped auto on sm_89", "HALO_CUDA_GROUPED_GEMM", "auto", "sm_89", with(func(o *backendOptions) { o.attnWG, o.groupedWG = false, "" }), ""},
		{"grouped typo", "HALO_CUDA_GROUPED_GEMM", "wg-n512", "sm_90", backendOptions{}, "HALO_CUDA_GROUPED_GEMM"},
		{"moe kernels typo", "HALO_CUDA_MOE_KERNELS", "yes", "sm_90", backendOptions{}, "HALO_CUDA_MOE_KERNELS"},
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
			if err != nil || !reflect.DeepEqual(got, c.want) {
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
	t.Setenv("HALO_CUDA_NVRTC_LOG", "")
	var log strings.Builder
	printNVRTCLog(&log, "a.cu", "sm_90", "ptxas info: 40 registers")
	if log.Len() != 0 {
		t.Errorf("without HALO_CUDA_NVRTC_LOG the log was printed: %q", log.String())
	}
	t.Setenv("HALO_CUDA_NVRTC_LOG", "1")
	printNVRTCLog(&log, "a.cu", "sm_90", "ptxas info: 40 registers")
	if got := log.String(); !strings.Contains(got, "nvrtc a.cu (sm_90)") || !strings.Contains(got, "40 registers") {
		t.Errorf("HALO_CUDA_NVRTC_LOG=1: printed %q, want the file, architecture and log", got)
	}
	if q := newCmdQueue("test", func() bool { return false }); !q.async {
		t.Error("the command queue is synchronous without HALO_CUDA_SYNC_OPS")
	}
	t.Setenv("HALO_CUDA_SYNC_OPS", "1")
	if q := newCmdQueue("test", func() bool { return false }); q.async {
		t.Error("HALO_CUDA_SYNC_OPS=1: the command queue still posts asynchronously")
	}
	// Each library's override, set in the process environment, is the only candidate tried.
	for _, c := range []struct {
		spec libSpec
		sw   *switches.Switch
	}{{specDriver, swLibCUDA}, {specNVRTC, swLibNVRTC}, {specCublasLt, swLibCublasLt}} {
		path := filepath.Join(dir, "lib-"+c.sw.Name+".so")
		t.Setenv(c.sw.Name, path)
		got, override := libCandidates(c.spec, osSearchEnv())
		if !override || len(got) != 1 || got[0] != path {
			t.Errorf("%s=%s: %s candidates %v (override %v), want that path alone", c.sw.Name, path, c.spec.What, got, override)
		}
	}
}

// TestGemmTuneSwitches shows the GEMM tuning switches, set in the process environment,
// reaching the configuration a device's first GEMM reads, and a bad value refused by name.
func TestGemmTuneSwitches(t *testing.T) {
	t.Setenv(envGemmCandidates, "")
	t.Setenv(envGemmTuneMinFLOPs, "")
	if c, err := loadGemmTuneConfig(); err != nil || c != defaultGemmTuneConfig() {
		t.Fatalf("unset: %+v, %v; want the defaults %+v", c, err, defaultGemmTuneConfig())
	}
	t.Setenv(envGemmCandidates, "3")
	t.Setenv(envGemmTuneMinFLOPs, "2e9")
	c, err := loadGemmTuneConfig()
	if err != nil || c.Candidates != 3 || c.MinFLOPs != 2e9 {
		t.Fatalf("%s=3 %s=2e9: %+v, %v", envGemmCandidates, envGemmTuneMinFLOPs, c, err)
	}
	t.Setenv(envGemmCandidates, "many")
	if _, err := loadGemmTuneConfig(); err == nil || !strings.Contains(err.Error(), envGemmCandidates) {
		t.Fatalf("%s=many: err = %v, want one naming the switch", envGemmCandidates, err)
	}
}

// TestOptionalMoEKernels: the MoE routing ops are offered only with moeKernels (the grouped
// GEMM always), and then every one engine/nn's device path needs is there.
func TestOptionalMoEKernels(t *testing.T) {
	b := &Backend{}
	o := b.Optional()
	if o.GroupedGEMM == nil || o.AddRMSNorm == nil || o.AdamW == nil || o.Timer == nil {
		t.Fatal("the always-offered capabilities are missing")
	}
	if o.MoERoute != nil || o.MoEPermute != nil || o.MoECombine != nil || o.SwiGLUPacked != nil || o.GeGLUPacked != nil {
		t.Fatal("MoE routing kernels offered with moeKernels off (HALO_CUDA_MOE_KERNELS=off)")
	}
	b.moeKernels = true
	o = b.Optional()
	if o.MoERoute == nil || o.MoERouteBackward == nil || o.MoEPermute == nil || o.MoEPermuteBackward == nil ||
		o.MoECombine == nil || o.MoECombineBackward == nil || o.SwiGLUPacked == nil || o.SwiGLUPackedBackward == nil ||
		o.GeGLUPacked == nil || o.GeGLUPackedBackward == nil {
		t.Fatalf("with moeKernels some MoE ops are missing: %+v", o)
	}
}
