// attention_fused.cu: the tensor-core attention backward in one pass over the keys
// (attention_mma.cuh, prepended by kernels.go, holds the code). A block of W warps owns 16 * W keys
// and walks the query tiles that see them, as attn_bwd_dkv_mma does, and also adds its share of
// dQ = scale * dS K to an fp32 accumulator with atomic adds; attn_dq_from_acc then rounds the
// accumulator into dq. S and dP are computed once per (query, key) pair instead of once in each
// of the dQ and dK/dV kernels. The atomic adds of different key blocks land in any order, so dq
// is not bit-for-bit reproducible from run to run (dk and dv are). On an H200 it is slower than
// the two-kernel backward (testdata/README.md, gpu-run9): 16 * W keys per block make every dQ
// element take N / (16 * W) atomic adds. Off unless HALO_CUDA_ATTN_BWD=fused. Contract: dk (=),
// dv (=) as in attention.cu, dqacc (+=, unscaled), then dq = scale * dqacc (=).
//
// Entry points: attn_bwd_fused_mma_<HD>_w<W>_q<BQ>(dk, dv, dqacc, ...) with the arguments of
// attn_bwd_dkv_mma and dqacc [N, NH, HD] fp32, zeroed before the launch; dynamic shared memory
// that of attn_bwd_dkv_mma plus 16 * W * (BQ + 8) * 2 bytes.
#define BWD_FUSED(HD, W, BQ)                                                                                     \
    extern "C" __global__ void __launch_bounds__(32 * W, 1) attn_bwd_fused_mma_##HD##_w##W##_q##BQ(              \
        bf16* dk, bf16* dv, float* dqacc, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,         \
        const float* lse, const float* dvec, const int* cu, int D, long long N, int NH, int NKV, float scale,   \
        int window) {                                                                                            \
        attn_bwd_dkv_mma_impl<HD, W, BQ, true>(dk, dv, dqacc, q, k, v, dout, lse, dvec, cu, D, N, NH, NKV, scale, \
                                               window);                                                          \
    }
BWD_FUSED(64, 4, 64)
BWD_FUSED(128, 4, 32)

// dq = bf16(scale * acc), n elements.
extern "C" __global__ void attn_dq_from_acc(bf16* dq, const float* acc, float scale, long long n) {
    GRID_STRIDE(i, n) dq[i] = f2bf(acc[i] * scale);
}
