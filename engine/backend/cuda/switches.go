package cuda

import (
	"fmt"

	"github.com/halo-shell/halo-shell/internal/switches"
)

// Names of the GEMM tuning switches, which their parser and its tests also use.
const (
	envGemmCandidates   = "HALO_CUDA_GEMM_CANDIDATES"
	envGemmTuneMinFLOPs = "HALO_CUDA_GEMM_TUNE_MIN_FLOPS"
)

// The CUDA backend's environment switches (listed with the others in SWITCHES.md). Tuning
// switches are read when a Backend is made (New) or a kernel cache is opened; each selects an
// implementation that computes the same result within the tolerance its tests state.
var (
	swAttention = switches.Register(switches.Switch{Name: "HALO_CUDA_ATTENTION", Kind: switches.Tuning,
		Default: "auto", Values: []string{"auto", "mma", "simt"},
		Doc: "Attention kernels: auto picks the Hopper warpgroup kernels on sm_90 and the mma.sync tensor-core kernels elsewhere (bf16, head dim 64 or 128); mma keeps mma.sync on sm_90; simt uses the scalar kernels everywhere."})
	swAttnBackward = switches.Register(switches.Switch{Name: "HALO_CUDA_ATTN_BWD", Kind: switches.Tuning,
		Default: "split", Values: []string{"split", "fused"},
		Doc: "Tensor-core attention backward: split runs a dQ and a dK/dV kernel; fused runs one pass that adds dQ atomically (not bit-reproducible from run to run)."})
	swEmpty = switches.Register(switches.Switch{Name: "HALO_CUDA_EMPTY", Kind: switches.Tuning,
		Default: "uncleared", Values: []string{"uncleared", "cleared"},
		Doc: "Empty (scratch that is written before it is read) skips the zero fill; cleared makes it zero-fill like Alloc."})
	swSplitK = switches.Register(switches.Switch{Name: "HALO_CUDA_GEMM_SPLITK", Kind: switches.Tuning,
		Default: "on", Values: []string{"on", "off"},
		Doc: "Split-K weight-gradient GEMMs where they are faster; off turns them off."})
	swGemmBeta = switches.Register(switches.Switch{Name: "HALO_CUDA_GEMM_BETA", Kind: switches.Tuning,
		Default: "direct", Values: []string{"direct", "fold"},
		Doc: "Accumulating GEMMs into bf16: direct lets cuBLASLt add Beta·C (the product is rounded to bf16 before the sum, as autograd adds bf16 gradients); fold adds an fp32 product and rounds once."})
	swGemmCandidates = switches.Register(switches.Switch{Name: envGemmCandidates, Kind: switches.Tuning,
		Default: "8",
		Doc:     "cuBLASLt algorithms timed per tuned GEMM shape, 1 to 64; 1 takes the heuristic's first choice everywhere."})
	swGemmTuneMinFLOPs = switches.Register(switches.Switch{Name: envGemmTuneMinFLOPs, Kind: switches.Tuning,
		Default: "1e12",
		Doc:     "GEMMs of at least this many floating-point operations are tuned (timed across candidates) on first use; smaller ones take the heuristic's choice."})
	swMoEKernels = switches.Register(switches.Switch{Name: "HALO_CUDA_MOE_KERNELS", Kind: switches.Tuning,
		Default: "on", Values: []string{"off", "on"},
		Doc: "on offers the mixture-of-experts routing, permutation, combine and packed SwiGLU and GeGLU kernels (kernels/moe.cu), so MoE blocks (Gemma 4's beside the MLP too) run on the device path with grouped expert GEMMs; off falls back to the routed composition (host routing, one GEMM per expert), for comparison and diagnosis."})
	swGrouped = switches.Register(switches.Switch{Name: "HALO_CUDA_GROUPED_GEMM", Kind: switches.Tuning,
		Default: "auto", Values: []string{"auto", "mma", "wg", "wg-n128", "wg-n256", "wg-n128x2", "wg-tma", "wg-p", "wg-p256", "cublas"},
		Doc: "Which tensor-core kernels run the grouped expert GEMMs of bf16 operands: auto the Hopper warpgroup-MMA ones (kernels/grouped_gemm_wg.cu; the variant of each product kind in grouped_gemm.go's groupedWGAuto: wg-n256 for the forward, wg-n128x2 for both gradients) on sm_90 and the mma.sync ones (kernels/grouped_gemm.cu) elsewhere; mma the mma.sync ones everywhere; wg, wg-n128, wg-n256 and wg-n128x2 one warpgroup-MMA variant on sm_90 (mma.sync elsewhere): wg 128 x 128 tiles, each step's products finished before the next; the others keep a step's products in flight, with 128-column tiles in 5 stages, 256-column tiles in 4, or 128-column tiles in 3 stages and two CTAs a multiprocessor; wg-tma 256-column tiles whose operands a loading warpgroup copies with the tensor memory accelerator; wg-p wg-n128x2's forward and input grad with a persistent weight gradient (two CTAs a multiprocessor walking every group's 128 x 128 tiles, the copies of a tile's first steps overlapping the previous tile's last products and store); wg-p256 wg-n256's forward and input grad with a persistent weight gradient of 128 x 256 tiles, one CTA a multiprocessor; cublas (every arch) reads the groups' row offsets to the host once per call, a synchronisation, and runs one cuBLASLt GEMM per group: for a few large groups (Mixtral's 8 experts of thousands of rows), where a dense GEMM's tiles beat the grouped kernels, at the cost of the host waiting for the routing in every MoE layer."})
	swSyncOps = switches.Register(switches.Switch{Name: "HALO_CUDA_SYNC_OPS", Kind: switches.Debug,
		Values: []string{"1"},
		Doc:    "1 makes every backend call wait for the GPU before it returns (errors then point at the op that caused them)."})
	swNVRTCLog = switches.Register(switches.Switch{Name: "HALO_CUDA_NVRTC_LOG", Kind: switches.Debug,
		Doc: "Non-empty prints NVRTC's compilation log of every kernel file to stderr."})
	swPtxasVerbose = switches.Register(switches.Switch{Name: "HALO_CUDA_PTXAS_VERBOSE", Kind: switches.Debug,
		Doc: "Non-empty adds ptxas' register, shared-memory and spill report to the NVRTC log (with HALO_CUDA_NVRTC_LOG)."})
	swCache = switches.Register(switches.Switch{Name: "HALO_CUDA_CACHE", Kind: switches.Path,
		Doc: "Directory of compiled kernels (default: the user cache directory's halo-shell/cuda-kernels)."})
	swLibCUDA = switches.Register(switches.Switch{Name: "HALO_LIBCUDA", Kind: switches.Path,
		Doc: "Path of libcuda.so.1 to load instead of searching LD_LIBRARY_PATH and the standard folders."})
	swLibNVRTC = switches.Register(switches.Switch{Name: "HALO_LIBNVRTC", Kind: switches.Path,
		Doc: "Path of libnvrtc.so to load instead of searching."})
	swLibCublasLt = switches.Register(switches.Switch{Name: "HALO_LIBCUBLASLT", Kind: switches.Path,
		Doc: "Path of libcublasLt.so to load instead of searching."})
)

// optionsFromSwitches is defaultBackendOptions(arch) with the tuning switches' choices, for a
// device of architecture arch ("sm_90"). A value outside a switch's list is an error, not a
// silent default.
func optionsFromSwitches(arch string) (backendOptions, error) {
	for _, s := range []*switches.Switch{swAttention, swAttnBackward, swEmpty, swSplitK, swGemmBeta, swMoEKernels, swGrouped} {
		if err := s.Check(); err != nil {
			return backendOptions{}, fmt.Errorf("cuda: %w", err)
		}
	}
	o := defaultBackendOptions(arch)
	mode := swAttention.Value()
	o.attnMMA = mode != "simt"
	o.attnWG = mode == "auto" && wgArch(arch)
	o.attnFused = swAttnBackward.Is("fused")
	o.emptyUncleared = !swEmpty.Is("cleared")
	o.noSplitK = swSplitK.Is("off")
	o.gemmFoldBeta = swGemmBeta.Is("fold")
	o.moeKernels = !swMoEKernels.Is("off")
	switch v := swGrouped.Value(); {
	case v == groupedCublas:
		o.groupedWG = v // every arch: cuBLASLt runs everywhere
	case v == "mma" || !wgArch(arch):
		o.groupedWG = ""
	case v != "auto":
		o.groupedWG = v
	}
	return o, nil
}
