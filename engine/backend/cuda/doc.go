// Package cuda runs halo-shell's tensor operations on NVIDIA GPUs from a pure-Go binary
// (CGO_ENABLED=0).
//
// The CUDA driver (libcuda.so.1), NVRTC (libnvrtc.so.13) and cuBLASLt (libcublasLt.so.13) are
// loaded at run time with purego; nothing about CUDA is needed at build time, and the same binary
// runs, and says why it cannot use a GPU, on machines without one. Kernels are CUDA C under
// kernels/*.cu, embedded in the binary, compiled by NVRTC for the detected architecture on first
// use and cached on disk (see KernelCacheDir). GEMMs go through cuBLASLt with bf16 inputs and fp32
// accumulation; the algorithm is chosen once per shape and cached.
//
// Each Device is driven by one goroutine locked to its OS thread, on which the device's context is
// current; every driver call for that device runs there (Device.Do). Memory comes from a caching
// allocator with size classes whose statistics (allocated, reserved, peak) are exposed by
// Device.MemStats.
//
// What it is not: it does not decide whether to use the GPU (callers ask Available and fall back
// to the CPU backend, which is the numerical oracle these kernels are tested against), and it does
// not hold collectives (NCCL lives in engine/comm).
//
// Library discovery, per library: the environment variable (HALO_LIBCUDA, HALO_LIBNVRTC,
// HALO_LIBCUBLASLT) naming a file, else the directories of LD_LIBRARY_PATH, else the standard
// places (/usr/local/cuda/lib64, /usr/lib/x86_64-linux-gnu, the nvidia/*/lib folders of a Python
// site-packages holding PyTorch), else the dynamic loader's own search by soname.
package cuda
