package cuda

import (
	"testing"
)

// TestNVRTCCompilesEveryArch compiles every kernel file with NVRTC for every architecture it is
// built for (sm_80 = A100, sm_86 = RTX 3090, sm_89 = RTX 4090, sm_90 and sm_90a = Hopper) as
// CUBIN, so that ptxas runs for each and inline PTX an architecture lacks, or a register or
// shared-memory overflow, fails here; and as PTX for compute_86, the form HALO_CUDA_ARCH=sm_86
// loads. It needs NVRTC only, not a device of each architecture. Files and architectures
// compile in parallel.
func TestNVRTCCompilesEveryArch(t *testing.T) {
	l := loadLibraries()
	if l.nvrtc == nil || l.nvrtc.info.Err != "" {
		t.Skipf("needs NVRTC: %v", l.opsErr)
	}
	for _, f := range KernelFiles() {
		src, err := kernelSource(f)
		if err != nil {
			t.Fatal(err)
		}
		var targets []string
		for _, a := range kernelArchs {
			if target, ok := kernelTarget(f, a); ok {
				targets = append(targets, target)
			}
		}
		if _, ok := kernelTarget(f, "sm_86"); ok {
			targets = append(targets, ptxTarget("sm_86"))
		}
		for _, tg := range targets {
			t.Run(f+"/"+tg, func(t *testing.T) {
				t.Parallel()
				if _, err := l.nvrtc.compile(f, src, tg, kernelOpts()); err != nil {
					t.Errorf("%s for %s: %v", f, tg, err)
				}
			})
		}
	}
}

// TestGPUEmulatedArch runs when HALO_CUDA_ARCH names an architecture older than the device's:
// the backend then builds its kernels as PTX for it (PrepareKernels loads every file), leaves
// out the Hopper-only file and selects the mma.sync attention. Run the GPU suite under the same
// setting to test the non-Hopper code paths (scripts/gpu/consumer-arch.sh).
func TestGPUEmulatedArch(t *testing.T) {
	g := gpu(t)
	forced := swArch.Value()
	if forced == "" || forced == g.d.info.Arch {
		t.Skipf("HALO_CUDA_ARCH names no architecture older than this device's %s", g.d.info.Arch)
	}
	if g.d.info.KernelArch != forced || !g.d.emulated {
		t.Fatalf("HALO_CUDA_ARCH=%s: the device builds for %s (emulated %v)", forced, g.d.info.KernelArch, g.d.emulated)
	}
	if g.attnWG {
		t.Fatal("the Hopper warpgroup attention is selected under an emulated older architecture")
	}
	if _, err := g.d.PrepareKernels(); err != nil {
		t.Fatalf("kernels as PTX for %s: %v", forced, err)
	}
	if err := g.d.Do(func() error {
		if _, ok := g.d.modules[wgKernelFile]; ok {
			t.Errorf("%s was loaded under HALO_CUDA_ARCH=%s", wgKernelFile, forced)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("device %s runs the kernels built for %s", g.d.info.Arch, forced)
}
