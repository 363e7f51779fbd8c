// Package cuda runs halo-shell's backend contract (engine/backend) on NVIDIA GPUs from a pure-Go
// binary (CGO_ENABLED=0).
//
// The CUDA driver (libcuda.so.1), NVRTC (libnvrtc.so.13) and cuBLASLt (libcublasLt.so.13) are
// loaded at run time with purego; nothing about CUDA is needed at build time, and the same binary
// runs, and says why it cannot use a GPU, on machines without one (Available, Diagnose). Importing
// the package registers the "cuda" device with engine/backend, so backend.Open("cuda:1") and
// device: auto find it.
//
// Kernels are CUDA C under kernels/*.cu, one op family per file with its gradient contract in the
// header, embedded in the binary, compiled by NVRTC for the detected architecture (sm_80 and newer)
// on first use and cached on disk (KernelCacheDir) under a key of source hash, architecture and
// NVRTC version. They store bf16 or fp32 and compute in fp32; bf16 values are handled as raw bits,
// so NVRTC needs no CUDA headers. Each family's host launchers sit in the Go file of the same name
// (rmsnorm.go launches kernels/rmsnorm.cu; linear.go the GEMMs, attention.go the attention
// files), and check their tensor arguments through one builder (args.go). GEMMs go through
// cuBLASLt (bf16 or fp32 operands, fp32 accumulation, split-K only in fp32); the algorithm is
// chosen once per shape and alignment: for GEMMs of 1e12 FLOPs or more (the LM head's) the
// fastest of the heuristic's first 8 candidates, timed on the shape's first call (which waits
// once), elsewhere the heuristic's first choice
// (HALO_CUDA_GEMM_CANDIDATES and HALO_CUDA_GEMM_TUNE_MIN_FLOPS change both, gemm_tune.go).
// Weight gradients whose output is too small to fill the GPU run split over K (gemmSplitK). A
// GEMM that accumulates into bf16 lets cuBLASLt add Beta·C, which rounds the product to bf16
// before the sum, as autograd does when it adds separately rounded bf16 gradients;
// HALO_CUDA_GEMM_BETA=fold computes the product in fp32 and adds it with one rounding.
// Attention has three implementations of one contract: on Hopper (sm_90), warpgroup-MMA kernels
// (attention_wg.cu, compiled for sm_90a: wgmma with both operands in 128-byte-swizzled shared
// tiles or the probabilities in registers, bf16 with head dim 64 or 128, the kernel per head dim
// chosen from measurements); elsewhere, or with HALO_CUDA_ATTENTION=mma, flash-style mma.sync
// kernels (attention_tc.cu: m16n8k16 with ldmatrix and cp.async, same dtypes and head dims, tile
// shapes chosen per head dim from measurements); and SIMT kernels (attention.cu: any head dim up
// to 512, fp32 or bf16; above 256 a form that stages tiles 64 head dims at a time, so that shared
// memory stays under 48 KiB), which HALO_CUDA_ATTENTION=simt forces. A file that cannot be built on the
// device falls back to the next, with the reason logged once.
//
// HALO_CUDA_ARCH=sm_80, sm_86 or sm_89 builds and selects the kernels as for that older
// architecture on a newer device (arch.go): PTX for it, JIT-compiled by the driver, no Hopper-only
// kernels, and its shared-memory limit per block enforced at launch, so that the code paths of
// an A100 or an RTX 3090/4090 are tested and timed on an H200 (scripts/gpu/consumer-arch.sh).
//
// The backend implements engine/backend's DeviceTimer with CUDA events, so engine/profile can time
// each op on the GPU without making it wait (bench-train's profiled step).
//
// Alloc zero-fills with a posted memset; Empty (for outputs an op writes in full) skips that pass
// over memory (HALO_CUDA_EMPTY=cleared makes it zero-fill too). TestGPUEmptyUnclearedMatchesAlloc
// checks that training gives the same bits both ways.
//
// Each Device is driven by one goroutine locked to its OS thread, on which the device's primary
// context is current; every driver call for that device runs there. Calls that return something
// to the caller wait for it (Device.Do: allocations that miss the cache, uploads, downloads);
// kernel launches, GEMMs and frees are posted (Device.Post) and the caller goes on building the
// next op while the device goroutine launches this one, with an error reported by the next call
// (HALO_CUDA_SYNC_OPS=1 makes every call wait, for debugging). Allocations served from the
// caching allocator's free lists need no trip to the device goroutine at all. Work is enqueued on
// one stream per device and runs asynchronously; only Download, Sync and SumSquares wait for it.
// Index tensors uploaded from the host keep a host summary (and, when small, a copy) until
// something writes them, so Embedding, CrossEntropy and attention check ids, targets and
// document boundaries without waiting; for indices made on the device they fall back to a device
// flag that is read back. Within a training step the host therefore enqueues ahead of the GPU; the step
// ends with one wait (the loss is read back); there are no CUDA graphs, posting is what keeps
// launch overhead off the GPU's path (TestGPUPostingTakesLaunchesOffTheCallersPath measures it). Memory comes from a caching allocator with size
// classes whose statistics (allocated, reserved, peak) Backend.MemStats reports.
//
// What it is not: it does not decide whether to use the GPU (callers ask Available or use device:
// auto, which falls back to the CPU backend, the numerical oracle these kernels are tested
// against), and it holds no collectives (NCCL lives in engine/comm).
//
// Library discovery, per library: the environment variable (HALO_LIBCUDA, HALO_LIBNVRTC,
// HALO_LIBCUBLASLT) naming a file, else the directories of LD_LIBRARY_PATH, else the standard
// places (/usr/local/cuda/lib64, /usr/local/nvidia/lib64, /usr/lib/x86_64-linux-gnu, the
// nvidia/*/lib folders of a Python site-packages holding PyTorch), else the dynamic loader's own
// search by soname. HALO_CUDA_CACHE moves the kernel cache; HALO_CUDA_NVRTC_LOG=1 prints NVRTC's
// log and HALO_CUDA_PTXAS_VERBOSE=1 adds ptxas' register and spill report to it.
package cuda
