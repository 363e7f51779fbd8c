// attention_tc.cu: the entry points of the tensor-core attention kernels, instantiated from
// attention_mma.cuh (prepended by kernels.go), which holds their description and code. Contract
// as in attention.cu: out (=), lse (=), dq = scale * dS k (=), dk = scale * dS^T q (=),
// dv = P^T dout (=).

// Forward entry points: attn_fwd_mma_<HD>_w<W>_m<MT>_k<BK>: W warps (32 * W threads), each with
// MT m-tiles of 16 queries, key tiles of BK; dynamic shared memory 2 * 2 * BK * (HD + 8) * 2
// bytes, plus 16 * W * MT * (HD + 8) * 2 when MT > 1. MINB is the blocks per SM the register
// budget must allow.
#define FWD_MMA(HD, W, MT, BK, MINB)                                                                             \
    extern "C" __global__ void __launch_bounds__(32 * W, MINB) attn_fwd_mma_##HD##_w##W##_m##MT##_k##BK(         \
        bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const int* cu_q, const int* cu_k,    \
        int D, long long N, int NH, int NKV, float scale, int window) {                                          \
        attn_fwd_mma_impl<HD, W, MT, BK>(out, lse, q, k, v, cu_q, cu_k, D, N, NH, NKV, scale, window);           \
    }
FWD_MMA(64, 4, 1, 64, 2)
FWD_MMA(64, 4, 2, 64, 1)
FWD_MMA(128, 4, 1, 64, 2)
FWD_MMA(128, 4, 2, 32, 1)

// Backward entry points, W warps (32 * W threads) covering 16 * W rows per block:
// attn_bwd_dq_mma_<HD>_w<W>_k<BK> (K and V tiles of BK keys, dynamic shared memory
// 2 * 2 * BK * (HD + 8) * 2 bytes) and attn_bwd_dkv_mma_<HD>_w<W>_q<BQ> (Q and dO tiles of BQ
// queries, 2 * 16 * W * (HD + 8) * 2 + 2 * 2 * BQ * (HD + 8) * 2 + 4 * BQ * 4 bytes).
#define BWD_DQ(HD, W, BK, MINB)                                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * W, MINB) attn_bwd_dq_mma_##HD##_w##W##_k##BK(              \
        bf16* dq, const bf16* q, const bf16* k, const bf16* v, const bf16* dout, const float* lse,               \
        const float* dvec, const int* cu, int D, long long N, int NH, int NKV, float scale, int window) {         \
        attn_bwd_dq_mma_impl<HD, W, BK>(dq, q, k, v, dout, lse, dvec, cu, D, N, NH, NKV, scale, window);         \
    }
#define BWD_DKV(HD, W, BQ)                                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * W, 1) attn_bwd_dkv_mma_##HD##_w##W##_q##BQ(                 \
        bf16* dk, bf16* dv, const bf16* q, const bf16* k, const bf16* v, const bf16* dout, const float* lse,      \
        const float* dvec, const int* cu, int D, long long N, int NH, int NKV, float scale, int window) {         \
        attn_bwd_dkv_mma_impl<HD, W, BQ, false>(dk, dv, nullptr, q, k, v, dout, lse, dvec, cu, D, N, NH, NKV, scale, window);    \
    }
BWD_DQ(64, 4, 32, 2)
BWD_DQ(64, 8, 64, 1)
BWD_DQ(128, 4, 32, 2)
BWD_DKV(64, 4, 64)
BWD_DKV(64, 8, 64)
BWD_DKV(128, 4, 32)
