package cuda

import (
	"strings"
	"testing"
)

// TestKernelArch covers HALO_CUDA_ARCH's rule: unset or the device's own architecture builds
// native CUBINs; an older one of the kernels' architectures is emulated; a newer one, or one
// the kernels are not written for, is refused with a message naming both.
func TestKernelArch(t *testing.T) {
	for _, c := range []struct {
		device, forced, want string
		emulated             bool
		err                  string
	}{
		{"sm_90", "", "sm_90", false, ""},
		{"sm_86", "", "sm_86", false, ""},
		{"sm_90", "sm_90", "sm_90", false, ""},
		{"sm_90", "sm_86", "sm_86", true, ""},
		{"sm_90", "sm_89", "sm_89", true, ""},
		{"sm_90", "sm_80", "sm_80", true, ""},
		{"sm_89", "sm_86", "sm_86", true, ""},
		{"sm_86", "sm_89", "", false, "newer than the device (sm_86)"},
		{"sm_90", "sm_75", "", false, `HALO_CUDA_ARCH="sm_75" is not one of sm_80, sm_86, sm_89, sm_90`},
		{"sm_90", "86", "", false, "is not one of"},
	} {
		got, emu, err := kernelArch(c.device, c.forced)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("kernelArch(%s, %q) err = %v, want %q", c.device, c.forced, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want || emu != c.emulated {
			t.Errorf("kernelArch(%s, %q) = %s, %v, %v; want %s, %v", c.device, c.forced, got, emu, err, c.want, c.emulated)
		}
	}
}

// TestArchSwitchReachesTheDevice sets HALO_CUDA_ARCH as a run would and checks the value Open
// reads from it, and that a value outside the list is reported by the switch check.
func TestArchSwitchReachesTheDevice(t *testing.T) {
	t.Setenv("HALO_CUDA_ARCH", "sm_86")
	arch, emu, err := kernelArch("sm_90", swArch.Value())
	if err != nil || arch != "sm_86" || !emu {
		t.Fatalf("HALO_CUDA_ARCH=sm_86 on sm_90: %s, %v, %v; want sm_86 emulated", arch, emu, err)
	}
	o, err := optionsFromSwitches(arch)
	if err != nil || o.attnWG || !o.attnMMA {
		t.Fatalf("options for an emulated sm_86: %+v, %v; want mma.sync attention, no warpgroup kernels", o, err)
	}
	if target, ok := kernelTarget(wgKernelFile, arch); ok {
		t.Fatalf("%s is built for %s under HALO_CUDA_ARCH=sm_86", wgKernelFile, target)
	}
	t.Setenv("HALO_CUDA_ARCH", "sm86")
	if err := swArch.Check(); err == nil {
		t.Fatal("HALO_CUDA_ARCH=sm86 passed the switch check")
	}
}

func TestPTXTarget(t *testing.T) {
	for in, want := range map[string]string{"sm_86": "compute_86", "sm_80": "compute_80", "sm_90a": "compute_90a"} {
		if got := ptxTarget(in); got != want {
			t.Errorf("ptxTarget(%s) = %s, want %s", in, got, want)
		}
	}
}

// TestCheckSharedHoldsLaunchesToTheEmulatedArch: on an emulated sm_86 a launch past 99 KiB of
// shared memory is refused with the limit named; at the limit, or without emulation, it passes.
func TestCheckSharedHoldsLaunchesToTheEmulatedArch(t *testing.T) {
	emu := &Device{emulated: true, info: DeviceInfo{Arch: "sm_90", KernelArch: "sm_86"}}
	if err := emu.checkShared("k", 99<<10); err != nil {
		t.Errorf("99 KiB on sm_86: %v", err)
	}
	err := emu.checkShared("k", 99<<10+16)
	if err == nil || !strings.Contains(err.Error(), "sm_86 (HALO_CUDA_ARCH) allows at most 101376") {
		t.Errorf("99 KiB + 16 on an emulated sm_86: %v, want a refusal naming the limit", err)
	}
	native := &Device{info: DeviceInfo{Arch: "sm_90", KernelArch: "sm_90"}}
	if err := native.checkShared("k", 200<<10); err != nil {
		t.Errorf("native sm_90: %v", err)
	}
}

// TestKernelSharedMemoryFitsEveryArch computes the dynamic shared memory of every launch whose
// size depends on a compiled shape (each tensor-core attention variant, the scalar attention
// at the head dims models use, the grouped GEMM, the MoE router at 256 experts) and checks it
// against the smallest limit of the architectures the kernel runs on: 99 KiB (sm_86, sm_89)
// for everything but the Hopper-only warpgroup kernels (attention and grouped GEMM), which
// must fit sm_90's 227 KiB.
func TestKernelSharedMemoryFitsEveryArch(t *testing.T) {
	consumer := archMaxShared["sm_86"]
	check := func(what string, n, limit uint32) {
		if n > limit {
			t.Errorf("%s needs %d bytes of shared memory per block; the limit is %d", what, n, limit)
		}
	}
	for hd, v := range attnVariants {
		for _, f := range v.fwd {
			check((attnTiles{FwdW: f[0], FwdMT: f[1], FwdBK: f[2]}).fwdName(hd), mmaSharedFwd(hd, f[0], f[1], f[2]), consumer)
		}
		for _, q := range v.dq {
			check((attnTiles{DQW: q[0], DQBK: q[1]}).dqName(hd), mmaSharedDQ(hd, q[1]), consumer)
		}
		for _, k := range v.dkv {
			check((attnTiles{DKVW: k[0], DKVBQ: k[1]}).dkvName(hd), mmaSharedDKV(hd, k[0], k[1]), consumer)
		}
		for _, k := range v.fused {
			check((attnTiles{DKVW: k[0], DKVBQ: k[1]}).fusedName(hd), mmaSharedFused(hd, k[0], k[1]), consumer)
		}
	}
	for _, hd := range []int{64, 80, 96, 128, 256} {
		P := hd + 1
		check("attn_fwd (simt)", uint32(4*(2*attnTile*P+attnRows*hd)), consumer)
		check("attn_bwd (simt)", uint32(4*(2*attnTile*P+2*attnRows*hd)), consumer)
	}
	check("grouped GEMM", groupedShared, consumer)
	perWarp := 4 * (2*256 + 8)
	check("moe_route_fwd, 256 experts", uint32(moeWarpsPerBlock(perWarp)*perWarp), consumer)
	for _, k := range wgDefault {
		check(k.Name(), k.Shared(), archMaxShared["sm_90"])
	}
	for name, v := range groupedWGVariants {
		check("grouped GEMM (warpgroup MMA "+name+")", v.shared, archMaxShared["sm_90"])
	}
	// An sm_90 multiprocessor has 228 KiB of shared memory, of which the system reserves 1 KiB
	// per resident block.
	const hopperSharedPerSM = 228 << 10
	if v := groupedWGVariants["wg-n128x2"]; 2*(v.shared+1024) > hopperSharedPerSM {
		t.Errorf("grouped GEMM wg-n128x2: two CTAs of %d bytes (and 1 KiB reserved each) exceed a multiprocessor's %d", v.shared, hopperSharedPerSM)
	}
}
