// emu.h: the CUDA built-ins that kernels/attention.cu, shortconv.cu, gated_delta.cu,
// gated_delta_stages.cu and moe.cu use, for running their kernels as host C++
// (TestAttentionKernelsOnHost, TestShortConvKernelsOnHost, TestGatedDeltaKernelsOnHost,
// TestGatedDeltaStagesKernelsOnHost, TestMoEKernelsOnHost). A block's threads are fibers on one OS thread;
// __syncthreads and each warp shuffle are barriers at which a fiber yields until every
// participant has arrived, so a barrier reached by only some of its threads never completes
// (the run hangs and the test's timeout reports it). The test prepends
// this header to the kernel source, with its dynamic shared memory read from emu_smem and its
// static shared arrays made function statics (one block runs at a time).
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#define __device__
#define __global__
#define __forceinline__ inline

struct emu_dim3 {
    unsigned x, y, z;
};
extern emu_dim3 threadIdx, blockIdx, blockDim;
extern float* emu_smem;

struct emu_barrier {
    int expected, count;
    long gen;
};
void emu_yield();
inline void emu_arrive(emu_barrier& b) {
    long g = b.gen;
    if (++b.count == b.expected) {
        b.count = 0;
        b.gen++;
        return;
    }
    while (b.gen == g) emu_yield();
}
extern emu_barrier emu_block, emu_warp[32];
extern float emu_slot[2][32][32];

inline void __syncthreads() { emu_arrive(emu_block); }
// A shuffle writes the lane's value into the warp's slots of this exchange's parity and reads
// its source lane's after the warp barrier; consecutive exchanges alternate slots, so a lane
// that runs ahead cannot overwrite a value another lane has yet to read.
inline float emu_shfl(float v, int src, bool xor_lane) {
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    int p = (int)(emu_warp[w].gen & 1);
    emu_slot[p][w][l] = v;
    emu_arrive(emu_warp[w]);
    return emu_slot[p][w][xor_lane ? (l ^ src) : (src & 31)];
}
inline float __shfl_sync(unsigned, float v, int src) { return emu_shfl(v, src, false); }
inline float __shfl_xor_sync(unsigned, float v, int mask) { return emu_shfl(v, mask, true); }
// The int shuffle moves the bits through the same slots (never through float arithmetic).
inline int emu_shfl_int(int v, int src, bool xor_lane) {
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    int p = (int)(emu_warp[w].gen & 1);
    memcpy(&emu_slot[p][w][l], &v, 4);
    emu_arrive(emu_warp[w]);
    int r;
    memcpy(&r, &emu_slot[p][w][xor_lane ? (l ^ src) : (src & 31)], 4);
    return r;
}
inline int __shfl_sync(unsigned, int v, int src) { return emu_shfl_int(v, src, false); }
inline int __shfl_xor_sync(unsigned, int v, int mask) { return emu_shfl_int(v, mask, true); }
// __syncwarp is a barrier of the calling thread's warp (all 32 lanes take part).
inline void __syncwarp(unsigned = 0xffffffffu) { emu_arrive(emu_warp[threadIdx.x >> 5]); }
inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
// __fmul_rn is a product rounded once, which keeps nvcc from contracting it into a multiply-add.
inline float __fmul_rn(float a, float b) { return a * b; }
// atomicAdd: the host runs one thread at a time, so a plain addition is atomic.
inline float atomicAdd(float* p, float v) {
    float old = *p;
    *p = old + v;
    return old;
}
// atomicMin: as atomicAdd, one thread at a time.
inline int atomicMin(int* p, int v) {
    int old = *p;
    if (v < old) *p = v;
    return old;
}
inline int atomicAdd(int* p, int v) {
    int old = *p;
    *p = old + v;
    return old;
}
using std::max;
using std::min;
