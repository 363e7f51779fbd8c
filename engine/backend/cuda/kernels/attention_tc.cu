// attention_tc.cu: the tensor-core variant of attention.cu's kernels (forward, dQ, dK/dV) for bf16
// tensors with head dim 64 or 128, with exactly the contract stated in attention.cu:
//   out = softmax(scale * q k^T) v (=), lse (=), dq = scale * dS k (=),
//   dk = scale * dS^T q (=), dv = P^T dout (=), causal within packed documents, GQA, window.
// No [N, N] matrix is stored. Each warp owns 16 rows (queries; keys in attn_bwd_dkv_mma) and
// computes with mma.sync m16n8k16 (bf16 in, fp32 accumulate); the other operand streams through
// shared memory in tiles, row-major for score products and transposed for the products that
// contract over the tile. Probabilities and dS are rounded to bf16 before their product, as flash
// attention does. dK and dV sum the query heads of their group in one warp: no atomics, so results
// are deterministic.

__device__ __forceinline__ int find_doc(const int* cu, int D, long long i) {
    int lo = 0, hi = D - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (cu[mid] <= i) lo = mid; else hi = mid - 1;
    }
    return lo;
}

#define MMA_WARPS 4

struct __attribute__((aligned(16))) vec16 {
    unsigned x, y, z, w;
};
#define MMA_ROWS (16 * MMA_WARPS)

__device__ __forceinline__ void mma_bf16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    return (unsigned)f2bf(lo) | ((unsigned)f2bf(hi) << 16);
}

// load_afrag loads the A fragments (16 rows x HD) of rows r0 = row0 + lane/4 and r0 + 8 from a
// row-major bf16 matrix with row stride ld (elements); rows beyond nrows read as zero.
template <int HD>
__device__ __forceinline__ void load_afrag(unsigned (*a)[4], const bf16* base, long long row0, long long nrows, long long ld, int lane) {
    long long r0 = row0 + (lane >> 2), r1 = r0 + 8;
    int c = (lane & 3) * 2;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const unsigned* p0 = (const unsigned*)(base + r0 * ld + kk * 16 + c);
        const unsigned* p1 = (const unsigned*)(base + r1 * ld + kk * 16 + c);
        bool v0 = r0 < nrows, v1 = r1 < nrows;
        a[kk][0] = v0 ? p0[0] : 0u;
        a[kk][1] = v1 ? p1[0] : 0u;
        a[kk][2] = v0 ? p0[4] : 0u;
        a[kk][3] = v1 ? p1[4] : 0u;
    }
}

// stage copies rows [row0, row0 + TILE_) of a global bf16 matrix (row stride ld, column offset
// col0, HD columns) into shared memory, row-major (stride HD + 8) and, when tr is not null,
// transposed (tr[d * (TILE_ + 8) + r]). Rows past last are zero.
template <int HD, int TILE_>
__device__ __forceinline__ void stage(bf16* rowm, bf16* tr, const bf16* g, long long row0, long long last, long long ld, long long col0) {
    const int VEC = 8;  // 16-byte loads
    for (int e = threadIdx.x; e < TILE_ * HD / VEC; e += blockDim.x) {
        int r = e / (HD / VEC), c = (e % (HD / VEC)) * VEC;
        long long row = row0 + r;
        vec16 v = {0u, 0u, 0u, 0u};
        if (row <= last) v = *(const vec16*)(g + row * ld + col0 + c);
        *(vec16*)(rowm + r * (HD + 8) + c) = v;
        if (tr) {
            const bf16* s = (const bf16*)&v;
#pragma unroll
            for (int k = 0; k < VEC; k++) tr[(c + k) * (TILE_ + 8) + r] = s[k];
        }
    }
}

// scores: S (16 x TILE_) = A (16 x HD, fragments) . B^T with B row-major in shared (stride HD + 8).
template <int HD, int TILE_>
__device__ __forceinline__ void scores(float (*s)[4], unsigned (*a)[4], const bf16* b, int lane) {
#pragma unroll
    for (int nt = 0; nt < TILE_ / 8; nt++) {
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
        const bf16* row = b + (nt * 8 + (lane >> 2)) * (HD + 8) + (lane & 3) * 2;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            unsigned b0 = *(const unsigned*)(row + kk * 16);
            unsigned b1 = *(const unsigned*)(row + kk * 16 + 8);
            mma_bf16(s[nt], a[kk], b0, b1);
        }
    }
}

// accumulate: O (16 x HD) += P (16 x TILE_, accumulator layout, rounded to bf16) . B with B given
// transposed in shared (bt[d * (TILE_ + 8) + k]).
template <int HD, int TILE_>
__device__ __forceinline__ void accumulate(float (*o)[4], float (*p)[4], const bf16* bt, int lane) {
#pragma unroll
    for (int j = 0; j < TILE_ / 16; j++) {
        unsigned a[4];
        a[0] = pack_bf16(p[2 * j][0], p[2 * j][1]);
        a[1] = pack_bf16(p[2 * j][2], p[2 * j][3]);
        a[2] = pack_bf16(p[2 * j + 1][0], p[2 * j + 1][1]);
        a[3] = pack_bf16(p[2 * j + 1][2], p[2 * j + 1][3]);
#pragma unroll
        for (int nt = 0; nt < HD / 8; nt++) {
            const bf16* col = bt + (nt * 8 + (lane >> 2)) * (TILE_ + 8) + j * 16 + (lane & 3) * 2;
            mma_bf16(o[nt], a, *(const unsigned*)col, *(const unsigned*)(col + 8));
        }
    }
}

// row_range gives the visible key range [lo, hi] (absolute rows) of query row i, or an empty
// range for rows past n.
__device__ __forceinline__ void query_range(const int* cu_q, const int* cu_k, int D, long long n, long long i, int window, int* lo, int* hi) {
    *lo = 0x7fffffff;
    *hi = -1;
    if (i >= n) return;
    int d = find_doc(cu_q, D, i);
    int lenQ = cu_q[d + 1] - cu_q[d], lenK = cu_k[d + 1] - cu_k[d];
    int kpos = (int)(i - cu_q[d]) + lenK - lenQ;
    if (kpos < 0 || lenK <= 0) return;
    int jlo = window > 0 ? max(0, kpos - window + 1) : 0;
    *lo = cu_k[d] + jlo;
    *hi = cu_k[d] + min(kpos, lenK - 1);
}

// key_range gives the queries [lo, hi] that see key row j (self-attention boundaries only).
__device__ __forceinline__ void key_range(const int* cu, int D, long long n, long long j, int window, int* lo, int* hi) {
    *lo = 0x7fffffff;
    *hi = -1;
    if (j >= n) return;
    int d = find_doc(cu, D, j);
    int len = cu[d + 1] - cu[d];
    int jk = (int)(j - cu[d]);
    int last = len - 1;
    if (window > 0) last = min(last, jk + window - 1);
    *lo = (int)j;
    *hi = cu[d] + last;
}

__device__ __forceinline__ void block_span(int lo, int hi, int* blo, int* bhi) {
    __shared__ int s_lo, s_hi;
    if (threadIdx.x == 0) { s_lo = 0x7fffffff; s_hi = -1; }
    __syncthreads();
    atomicMin(&s_lo, lo);
    atomicMax(&s_hi, hi);
    __syncthreads();
    *blo = s_lo;
    *bhi = s_hi;
}

#define NEG_INF __int_as_float(0xff800000)

template <int HD>
__device__ void attn_fwd_mma_impl(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                  const int* cu_q, const int* cu_k, int D, long long N, int NH, int NKV,
                                  float scale, int window) {
    const int TILE_ = 64;
    extern __shared__ __attribute__((aligned(16))) unsigned char smem[];
    bf16* Ks = (bf16*)smem;                   // [TILE_][HD + 8]
    bf16* Vt = Ks + TILE_ * (HD + 8);         // [HD][TILE_ + 8]
    bf16* Vs = Vt + HD * (TILE_ + 8);         // [TILE_][HD + 8] (staging for the transpose)
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int h = blockIdx.y, g = h / (NH / NKV);
    long long row0 = (long long)blockIdx.x * MMA_ROWS + warp * 16;
    long long i0 = row0 + (lane >> 2), i1 = i0 + 8;
    int lo0, hi0, lo1, hi1;
    query_range(cu_q, cu_k, D, N, i0, window, &lo0, &hi0);
    query_range(cu_q, cu_k, D, N, i1, window, &lo1, &hi1);
    int blo, bhi;
    block_span(min(lo0, lo1), max(hi0, hi1), &blo, &bhi);
    int wlo = min(lo0, lo1), whi = max(hi0, hi1);
    for (int o = 1; o < 32; o <<= 1) {
        wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
        whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, o));
    }
    unsigned qa[HD / 16][4];
    load_afrag<HD>(qa, q + (long long)h * HD, row0, N, (long long)NH * HD, lane);
    float o[HD / 8][4];
#pragma unroll
    for (int nt = 0; nt < HD / 8; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;
    long long kld = (long long)NKV * HD;
    for (int j0 = blo; j0 <= bhi; j0 += TILE_) {
        __syncthreads();
        stage<HD, TILE_>(Ks, nullptr, k, j0, bhi, kld, (long long)g * HD);
        stage<HD, TILE_>(Vs, Vt, v, j0, bhi, kld, (long long)g * HD);
        __syncthreads();
        if (whi < j0 || wlo > j0 + TILE_ - 1) continue;  // warp-uniform
        float s[TILE_ / 8][4];
        scores<HD, TILE_>(s, qa, Ks, lane);
        float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
        for (int nt = 0; nt < TILE_ / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int j = j0 + nt * 8 + (lane & 3) * 2 + e;
                s[nt][e] = (j >= lo0 && j <= hi0) ? s[nt][e] * scale : NEG_INF;
                s[nt][2 + e] = (j >= lo1 && j <= hi1) ? s[nt][2 + e] * scale : NEG_INF;
                mx0 = fmaxf(mx0, s[nt][e]);
                mx1 = fmaxf(mx1, s[nt][2 + e]);
            }
        }
        for (int off = 1; off < 4; off <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
        }
        float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        float c0 = (n0 == NEG_INF) ? 1.f : expf(m0 - n0);
        float c1 = (n1 == NEG_INF) ? 1.f : expf(m1 - n1);
        l0 *= c0;
        l1 *= c1;
#pragma unroll
        for (int nt = 0; nt < TILE_ / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                s[nt][e] = (n0 == NEG_INF) ? 0.f : expf(s[nt][e] - n0);
                s[nt][2 + e] = (n1 == NEG_INF) ? 0.f : expf(s[nt][2 + e] - n1);
                l0 += s[nt][e];
                l1 += s[nt][2 + e];
            }
        }
        m0 = n0;
        m1 = n1;
#pragma unroll
        for (int nt = 0; nt < HD / 8; nt++) {
            o[nt][0] *= c0; o[nt][1] *= c0;
            o[nt][2] *= c1; o[nt][3] *= c1;
        }
        accumulate<HD, TILE_>(o, s, Vt, lane);
    }
    for (int off = 1; off < 4; off <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, off);
        l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }
    float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
    long long ld = (long long)NH * HD;
#pragma unroll
    for (int nt = 0; nt < HD / 8; nt++) {
        int c = h * HD + nt * 8 + (lane & 3) * 2;
        if (i0 < N) *(unsigned*)(out + i0 * ld + c) = pack_bf16(o[nt][0] * inv0, o[nt][1] * inv0);
        if (i1 < N) *(unsigned*)(out + i1 * ld + c) = pack_bf16(o[nt][2] * inv1, o[nt][3] * inv1);
    }
    if (lse && (lane & 3) == 0) {
        if (i0 < N) lse[i0 * NH + h] = l0 > 0.f ? m0 + logf(l0) : NEG_INF;
        if (i1 < N) lse[i1 * NH + h] = l1 > 0.f ? m1 + logf(l1) : NEG_INF;
    }
}

#define FWD_MMA(HD)                                                                                              \
    extern "C" __global__ void __launch_bounds__(128) attn_fwd_mma_##HD(                                          \
        bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const int* cu_q, const int* cu_k,    \
        int D, long long N, int NH, int NKV, float scale, int window) {                                          \
        attn_fwd_mma_impl<HD>(out, lse, q, k, v, cu_q, cu_k, D, N, NH, NKV, scale, window);                      \
    }
FWD_MMA(64)
FWD_MMA(128)

template <int HD>
__device__ void attn_bwd_dq_mma_impl(bf16* dq, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                                     const float* lse, const float* dvec, const int* cu, int D, long long N,
                                     int NH, int NKV, float scale, int window) {
    const int TILE_ = 32;
    extern __shared__ __attribute__((aligned(16))) unsigned char smem[];
    bf16* Ks = (bf16*)smem;                   // [TILE_][HD + 8]
    bf16* Vs = Ks + TILE_ * (HD + 8);         // [TILE_][HD + 8]
    bf16* Kt = Vs + TILE_ * (HD + 8);         // [HD][TILE_ + 8]
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int h = blockIdx.y, g = h / (NH / NKV);
    long long row0 = (long long)blockIdx.x * MMA_ROWS + warp * 16;
    long long i0 = row0 + (lane >> 2), i1 = i0 + 8;
    int lo0, hi0, lo1, hi1;
    query_range(cu, cu, D, N, i0, window, &lo0, &hi0);
    query_range(cu, cu, D, N, i1, window, &lo1, &hi1);
    int blo, bhi;
    block_span(min(lo0, lo1), max(hi0, hi1), &blo, &bhi);
    int wlo = min(lo0, lo1), whi = max(hi0, hi1);
    for (int o = 1; o < 32; o <<= 1) {
        wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
        whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, o));
    }
    long long qld = (long long)NH * HD;
    unsigned qa[HD / 16][4], da[HD / 16][4];
    load_afrag<HD>(qa, q + (long long)h * HD, row0, N, qld, lane);
    load_afrag<HD>(da, dout + (long long)h * HD, row0, N, qld, lane);
    float L0 = i0 < N ? lse[i0 * NH + h] : 0.f, L1 = i1 < N ? lse[i1 * NH + h] : 0.f;
    float D0 = i0 < N ? dvec[i0 * NH + h] : 0.f, D1 = i1 < N ? dvec[i1 * NH + h] : 0.f;
    float acc[HD / 8][4];
#pragma unroll
    for (int nt = 0; nt < HD / 8; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    long long kld = (long long)NKV * HD;
    for (int j0 = blo; j0 <= bhi; j0 += TILE_) {
        __syncthreads();
        stage<HD, TILE_>(Ks, Kt, k, j0, bhi, kld, (long long)g * HD);
        stage<HD, TILE_>(Vs, nullptr, v, j0, bhi, kld, (long long)g * HD);
        __syncthreads();
        if (whi < j0 || wlo > j0 + TILE_ - 1) continue;
        float s[TILE_ / 8][4], dp[TILE_ / 8][4];
        scores<HD, TILE_>(s, qa, Ks, lane);
        scores<HD, TILE_>(dp, da, Vs, lane);
#pragma unroll
        for (int nt = 0; nt < TILE_ / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int j = j0 + nt * 8 + (lane & 3) * 2 + e;
                float p0 = (j >= lo0 && j <= hi0) ? expf(s[nt][e] * scale - L0) : 0.f;
                float p1 = (j >= lo1 && j <= hi1) ? expf(s[nt][2 + e] * scale - L1) : 0.f;
                s[nt][e] = p0 * (dp[nt][e] - D0);
                s[nt][2 + e] = p1 * (dp[nt][2 + e] - D1);
            }
        }
        accumulate<HD, TILE_>(acc, s, Kt, lane);
    }
#pragma unroll
    for (int nt = 0; nt < HD / 8; nt++) {
        int c = h * HD + nt * 8 + (lane & 3) * 2;
        if (i0 < N) *(unsigned*)(dq + i0 * qld + c) = pack_bf16(acc[nt][0] * scale, acc[nt][1] * scale);
        if (i1 < N) *(unsigned*)(dq + i1 * qld + c) = pack_bf16(acc[nt][2] * scale, acc[nt][3] * scale);
    }
}

template <int HD>
__device__ void attn_bwd_dkv_mma_impl(bf16* dk, bf16* dv, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                                      const float* lse, const float* dvec, const int* cu, int D, long long N,
                                      int NH, int NKV, float scale, int window) {
    const int TILE_ = 32;
    extern __shared__ __attribute__((aligned(16))) unsigned char smem[];
    bf16* Qs = (bf16*)smem;                   // [TILE_][HD + 8]
    bf16* dOs = Qs + TILE_ * (HD + 8);        // [TILE_][HD + 8]
    bf16* Qt = dOs + TILE_ * (HD + 8);        // [HD][TILE_ + 8]
    bf16* dOt = Qt + HD * (TILE_ + 8);        // [HD][TILE_ + 8]
    __shared__ float s_lse[TILE_], s_d[TILE_];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = blockIdx.y, G = NH / NKV;
    long long row0 = (long long)blockIdx.x * MMA_ROWS + warp * 16;
    long long j0k = row0 + (lane >> 2), j1k = j0k + 8;
    int lo0, hi0, lo1, hi1;
    key_range(cu, D, N, j0k, window, &lo0, &hi0);
    key_range(cu, D, N, j1k, window, &lo1, &hi1);
    int blo, bhi;
    block_span(min(lo0, lo1), max(hi0, hi1), &blo, &bhi);
    int wlo = min(lo0, lo1), whi = max(hi0, hi1);
    for (int o = 1; o < 32; o <<= 1) {
        wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
        whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, o));
    }
    long long kld = (long long)NKV * HD, qld = (long long)NH * HD;
    unsigned ka[HD / 16][4], va[HD / 16][4];
    load_afrag<HD>(ka, k + (long long)g * HD, row0, N, kld, lane);
    load_afrag<HD>(va, v + (long long)g * HD, row0, N, kld, lane);
    float dka[HD / 8][4], dva[HD / 8][4];
#pragma unroll
    for (int nt = 0; nt < HD / 8; nt++) {
        dka[nt][0] = dka[nt][1] = dka[nt][2] = dka[nt][3] = 0.f;
        dva[nt][0] = dva[nt][1] = dva[nt][2] = dva[nt][3] = 0.f;
    }
    for (int h = g * G; h < (g + 1) * G; h++) {
        for (int i0 = blo; i0 <= bhi; i0 += TILE_) {
            __syncthreads();
            stage<HD, TILE_>(Qs, Qt, q, i0, bhi, qld, (long long)h * HD);
            stage<HD, TILE_>(dOs, dOt, dout, i0, bhi, qld, (long long)h * HD);
            if (threadIdx.x < TILE_) {
                long long i = i0 + threadIdx.x;
                s_lse[threadIdx.x] = i <= bhi ? lse[i * NH + h] : 0.f;
                s_d[threadIdx.x] = i <= bhi ? dvec[i * NH + h] : 0.f;
            }
            __syncthreads();
            if (whi < i0 || wlo > i0 + TILE_ - 1) continue;
            float s[TILE_ / 8][4], dp[TILE_ / 8][4];
            scores<HD, TILE_>(s, ka, Qs, lane);
            scores<HD, TILE_>(dp, va, dOs, lane);
#pragma unroll
            for (int nt = 0; nt < TILE_ / 8; nt++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int c = nt * 8 + (lane & 3) * 2 + e;
                    int i = i0 + c;
                    float p0 = (i >= lo0 && i <= hi0) ? expf(s[nt][e] * scale - s_lse[c]) : 0.f;
                    float p1 = (i >= lo1 && i <= hi1) ? expf(s[nt][2 + e] * scale - s_lse[c]) : 0.f;
                    dp[nt][e] = p0 * (dp[nt][e] - s_d[c]);
                    dp[nt][2 + e] = p1 * (dp[nt][2 + e] - s_d[c]);
                    s[nt][e] = p0;
                    s[nt][2 + e] = p1;
                }
            }
            accumulate<HD, TILE_>(dva, s, dOt, lane);
            accumulate<HD, TILE_>(dka, dp, Qt, lane);
        }
    }
#pragma unroll
    for (int nt = 0; nt < HD / 8; nt++) {
        int c = g * HD + nt * 8 + (lane & 3) * 2;
        if (j0k < N) {
            *(unsigned*)(dk + j0k * kld + c) = pack_bf16(dka[nt][0] * scale, dka[nt][1] * scale);
            *(unsigned*)(dv + j0k * kld + c) = pack_bf16(dva[nt][0], dva[nt][1]);
        }
        if (j1k < N) {
            *(unsigned*)(dk + j1k * kld + c) = pack_bf16(dka[nt][2] * scale, dka[nt][3] * scale);
            *(unsigned*)(dv + j1k * kld + c) = pack_bf16(dva[nt][2], dva[nt][3]);
        }
    }
}

#define BWD_MMA(HD)                                                                                               \
    extern "C" __global__ void __launch_bounds__(128) attn_bwd_dq_mma_##HD(                                        \
        bf16* dq, const bf16* q, const bf16* k, const bf16* v, const bf16* dout, const float* lse,               \
        const float* dvec, const int* cu, int D, long long N, int NH, int NKV, float scale, int window) {         \
        attn_bwd_dq_mma_impl<HD>(dq, q, k, v, dout, lse, dvec, cu, D, N, NH, NKV, scale, window);                \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(128) attn_bwd_dkv_mma_##HD(                                       \
        bf16* dk, bf16* dv, const bf16* q, const bf16* k, const bf16* v, const bf16* dout, const float* lse,      \
        const float* dvec, const int* cu, int D, long long N, int NH, int NKV, float scale, int window) {         \
        attn_bwd_dkv_mma_impl<HD>(dk, dv, q, k, v, dout, lse, dvec, cu, D, N, NH, NKV, scale, window);           \
    }
BWD_MMA(64)
BWD_MMA(128)
