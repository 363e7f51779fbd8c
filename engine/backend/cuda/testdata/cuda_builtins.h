// cuda_builtins.h: declarations of the CUDA built-ins the kernels use, so that clang can check
// kernels/*.cu as CUDA C++ (-fsyntax-only, no CUDA headers installed) the way NVRTC compiles
// them: with common.cuh and the file's headers prepended (kernelSource). Used by
// TestKernelsParseAsCUDA; declarations only, nothing here is compiled into the kernels.
#include <__clang_cuda_builtin_vars.h>
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __host__ __attribute__((host))
#define __forceinline__ __attribute__((always_inline))
#define __launch_bounds__(...) __attribute__((launch_bounds(__VA_ARGS__)))
// NVRTC marks by-value kernel parameters whose address is taken (TMA descriptors) with it.
#define __grid_constant__
__device__ float __uint_as_float(unsigned int);
__device__ unsigned int __float_as_uint(float);
__device__ float __int_as_float(int);
__device__ int __float_as_int(float);
__device__ float __shfl_xor_sync(unsigned, float, int);
__device__ int __shfl_xor_sync(unsigned, int, int);
__device__ unsigned __shfl_xor_sync(unsigned, unsigned, int);
__device__ float __shfl_sync(unsigned, float, int);
__device__ int __shfl_sync(unsigned, int, int);
__device__ int __shfl_up_sync(unsigned, int, unsigned int);
__device__ int __ffs(int);
__device__ void __syncthreads();
__device__ void __syncwarp(unsigned = 0xffffffffu);
__device__ float fmaxf(float, float);
__device__ float fminf(float, float);
__device__ float fmaf(float, float, float);
__device__ float expf(float);
__device__ float exp2f(float);
__device__ float logf(float);
__device__ float log1pf(float);
__device__ float sqrtf(float);
__device__ float rsqrtf(float);
__device__ float __expf(float);
__device__ float __logf(float);
__device__ float __fmul_rn(float, float);
__device__ float __fadd_rn(float, float);
__device__ float __fsub_rn(float, float);
__device__ float __fdiv_rn(float, float);
__device__ float __fsqrt_rn(float);
__device__ float atomicAdd(float*, float);
__device__ unsigned long long atomicAdd(unsigned long long*, unsigned long long);
__device__ int atomicMin(int*, int);
__device__ unsigned int atomicMin(unsigned int*, unsigned int);
__device__ double atomicAdd(double*, double);
__device__ int min(int, int);
__device__ int max(int, int);
__device__ long long min(long long, long long);
__device__ long long max(long long, long long);
__device__ float tanhf(float);
__device__ float fabsf(float);
__device__ float sinf(float);
__device__ float cosf(float);
__device__ void __sincosf(float, float*, float*);
__device__ unsigned __cvta_generic_to_shared(const void*);
__device__ int atomicMax(int*, int);
__device__ unsigned int atomicMax(unsigned int*, unsigned int);
__device__ int __any_sync(unsigned, int);
__device__ int __all_sync(unsigned, int);
__device__ unsigned __ballot_sync(unsigned, int);
__device__ float log2f(float);
__device__ float powf(float, float);
__device__ double sqrt(double);
__device__ float floorf(float);
__device__ float ceilf(float);
__device__ int __popc(unsigned);
__device__ float __frcp_rn(float);
__device__ float __fsqrt_rn(float);
__device__ float truncf(float);
__device__ float roundf(float);
__device__ double pow(double,double);
__device__ float __powf(float,float);
__device__ float atan2f(float,float);
__device__ void __sincosf(float, float*, float*);
__device__ void sincosf(float, float*, float*);
__device__ float fmodf(float,float);
__device__ unsigned long long atomicCAS(unsigned long long*, unsigned long long, unsigned long long);
__device__ int atomicCAS(int*, int, int);
__device__ unsigned int atomicAdd(unsigned int*, unsigned int);
__device__ int atomicAdd(int*, int);
__device__ double __shfl_xor_sync(unsigned, double, int);
