// common.cuh: definitions shared by every kernels/*.cu file. NVRTC compiles each file with this
// header prepended and no include paths, so nothing here needs CUDA's headers.
//
// Storage type: bf16 is kept as its 16 raw bits (unsigned short); arithmetic is fp32.
// Dimension letters used in shape comments: N rows (tokens), C channels, V vocabulary, H query
// heads, KV key/value heads, D head dimension, F MLP hidden size, T sequence length.

typedef unsigned short bf16;

__device__ __forceinline__ float bf2f(bf16 v) { return __uint_as_float(((unsigned int)v) << 16); }

// f2bf rounds to nearest even; NaN stays NaN.
__device__ __forceinline__ bf16 f2bf(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// block_sum returns the sum over the block to every thread. scratch holds 32 floats; blockDim.x
// is a multiple of 32.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0.f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : __int_as_float(0xff800000);
    return warp_max(v);
}

// Float tensors arrive as (pointer, dtype code) pairs; the codes are engine/tensor's DType values.
#define DT_F32 1
#define DT_BF16 2

__device__ __forceinline__ float ldf(const void* p, int dt, long long i) {
    return dt == DT_F32 ? ((const float*)p)[i] : bf2f(((const bf16*)p)[i]);
}

__device__ __forceinline__ void stf(void* p, int dt, long long i, float v) {
    if (dt == DT_F32) ((float*)p)[i] = v;
    else ((bf16*)p)[i] = f2bf(v);
}

#define GRID_STRIDE(i, n) for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)
