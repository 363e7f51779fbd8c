package cuda

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/halo-shell/halo-shell/internal/switches"
)

// Kernel architectures. The kernels are built for the device's own architecture (DeviceInfo.Arch)
// unless HALO_CUDA_ARCH names an older one: then every choice that depends on the architecture
// is made as on a device of that architecture, so that the code paths of an A100 (sm_80) or a
// consumer card (RTX 3090 = sm_86, RTX 4090 = sm_89) run, and can be tested and timed, on a
// Hopper GPU:
//
//   - the kernel files are compiled by NVRTC as PTX for that architecture (compute_86, say)
//     and turned into machine code for the device by the driver, since an sm_86 CUBIN does not
//     load on an sm_90 device; the source sees __CUDA_ARCH__ of the emulated architecture;
//   - files built only for Hopper (attention_wg.cu) are not built, and the attention falls back
//     to the mma.sync kernels as it does on those devices;
//   - a kernel launch asking for more dynamic shared memory per block than that architecture
//     allows (99 KiB on sm_86 and sm_89) fails with an error that names the limit, as it would
//     on the real card.
//
// What it cannot emulate: cuBLASLt picks its GEMM kernels for the real device, and the
// emulated run has the H200's bandwidth, caches and multiprocessor count.

var swArch = switches.Register(switches.Switch{Name: "HALO_CUDA_ARCH", Kind: switches.Testing,
	Values: []string{"sm_80", "sm_86", "sm_89", "sm_90"},
	Doc:    "Builds and selects the CUDA kernels as for this older architecture (sm_80 = A100, sm_86 = RTX 3090, sm_89 = RTX 4090): PTX for it, JIT-compiled by the driver, no Hopper-only kernels, and its shared-memory limit per block enforced at launch; unset uses the device's own. For testing the non-Hopper code paths on an H100/H200."})

// kernelArchs are the architectures the kernels are written for, oldest first (the values
// HALO_CUDA_ARCH accepts).
var kernelArchs = swArch.Values

// archMaxShared is the most dynamic shared memory one block may opt into on each architecture
// (cudaDevAttrMaxSharedMemoryPerBlockOptin), in bytes.
var archMaxShared = map[string]uint32{
	"sm_80": 163 << 10,
	"sm_86": 99 << 10,
	"sm_89": 99 << 10,
	"sm_90": 227 << 10,
}

// archNumber is the number of "sm_86" (86), or 0 when arch is not of that form.
func archNumber(arch string) int {
	n, err := strconv.Atoi(strings.TrimPrefix(arch, "sm_"))
	if err != nil || !strings.HasPrefix(arch, "sm_") {
		return 0
	}
	return n
}

// kernelArch is the architecture the kernels are built for on a device of arch, given the value
// of HALO_CUDA_ARCH (forced, "" when unset), and whether that differs from the device's own
// (emulated: compile PTX and enforce the architecture's limits). Forcing a newer architecture
// than the device's, or one the kernels are not written for, is an error.
func kernelArch(device, forced string) (arch string, emulated bool, err error) {
	if forced == "" || forced == device {
		return device, false, nil
	}
	if !slices.Contains(kernelArchs, forced) {
		return "", false, fmt.Errorf("cuda: HALO_CUDA_ARCH=%q is not one of %s", forced, strings.Join(kernelArchs, ", "))
	}
	if archNumber(forced) > archNumber(device) {
		return "", false, fmt.Errorf("cuda: HALO_CUDA_ARCH=%s is newer than the device (%s): code for %s does not run there; unset it or name %s or older", forced, device, forced, device)
	}
	return forced, true, nil
}

// ptxTarget is NVRTC's virtual architecture for arch ("sm_86" -> "compute_86", "sm_90a" ->
// "compute_90a"): compiling for it yields PTX that the driver compiles for any newer device.
func ptxTarget(arch string) string { return "compute_" + strings.TrimPrefix(arch, "sm_") }

// checkShared refuses a launch asking for more dynamic shared memory per block than the kernel
// architecture allows, when that architecture is emulated (on the real device the driver
// refuses it by itself).
func (d *Device) checkShared(name string, shared uint32) error {
	if !d.emulated {
		return nil
	}
	if lim, ok := archMaxShared[d.info.KernelArch]; ok && shared > lim {
		return fmt.Errorf("cuda: kernel %s asks for %d bytes of shared memory per block; %s (HALO_CUDA_ARCH) allows at most %d", name, shared, d.info.KernelArch, lim)
	}
	return nil
}
