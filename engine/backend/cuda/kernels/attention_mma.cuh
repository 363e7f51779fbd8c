// attention_mma.cuh: the device code of the tensor-core attention kernels (attention_tc.cu
// instantiates them; attention_fused.cu instantiates the backward that also accumulates dQ).
// Prepended, after common.cuh, to the files that include it (kernels.go).
//
// attention_tc.cu: the tensor-core variant of attention.cu's kernels (forward, dQ, dK/dV) for bf16
// tensors with head dim 64 or 128, with exactly the contract stated in attention.cu:
//   out = softmax(scale * q k^T) v (=), lse (=), dq = scale * dS k (=),
//   dk = scale * dS^T q (=), dv = P^T dout (=), causal within packed documents, GQA, window.
//
// The kernels follow the flash-attention scheme: no [N, N] matrix is stored; a block of W warps
// owns 16 * W rows (queries, or keys in attn_bwd_dkv_mma; twice that in a forward with two m-tiles
// per warp), each warp 16 of them, and streams the other side through shared memory in tiles:
// more rows per block means each tile crosses L2 for more queries. Tiles are copied with cp.async into two buffers, so the
// copy of tile t+1 overlaps the arithmetic on tile t. Products use mma.sync m16n8k16 (bf16 in, fp32
// accumulate); operands come out of shared memory with ldmatrix (.trans for the products that
// contract over the tile's rows), out of a row stride of HD + 8 elements so that the eight row
// addresses of one ldmatrix fall in distinct banks. Softmax runs in the base-2 domain (ex2 of
// scores times scale * log2 e, one FFMA and one special-function op per probability). Masks are applied only to tiles that cross a row's
// visible range. Probabilities and dS are rounded to bf16 before their product, as flash
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

#define NEG_INF __int_as_float(0xff800000)
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

__device__ __forceinline__ void mma_bf16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// pack_bf16 rounds two floats to bf16 (nearest even, as f2bf) in one instruction: lo in the low
// half.
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// ex2 is 2^x on the special-function unit (ex2(-inf) = 0); its error (2 ulp) is far below the
// bf16 rounding the probabilities get before their products.
__device__ __forceinline__ float ex2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }\n" : "=r"(a) : "l"(p));
    return a;
}

// ldsm4 loads four 8x8 b16 matrices; lane l gives the address of row l%8 of matrix l/8.
__device__ __forceinline__ void ldsm4(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void ldsm4t(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// cp16 copies 16 bytes global -> shared asynchronously; with ok false it writes zeros.
__device__ __forceinline__ void cp16(unsigned dst, const void* src, bool ok) {
    int n = ok ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_wait1() { asm volatile("cp.async.wait_group 1;\n" ::); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }

// load_tile starts copying rows [row0, row0 + ROWS) of a global bf16 matrix (row stride ld,
// column offset col0, HD columns) into shared memory with row stride HD + 8. Rows past last are
// zero.
template <int HD, int ROWS, int W>
__device__ __forceinline__ void load_tile(bf16* sm, const bf16* g, long long row0, long long last, long long ld, long long col0) {
    const int CH = HD / 8, TH = 32 * W;
#pragma unroll
    for (int it = 0; it < (ROWS * CH + TH - 1) / TH; it++) {
        int e = threadIdx.x + it * TH;
        if ((ROWS * CH) % TH != 0 && e >= ROWS * CH) break;
        int r = e / CH, c = (e % CH) * 8;
        long long row = row0 + r;
        bool ok = row <= last;
        cp16(smem_addr(sm + r * (HD + 8) + c), g + (ok ? row : 0) * ld + col0 + c, ok);
    }
}

// load_afrag loads the A fragments (16 rows x HD) of rows r0 = row0 + lane/4 and r0 + 8 from a
// row-major bf16 matrix in global memory with row stride ld; rows beyond nrows read as zero.
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

// Lane offsets for ldmatrix.x4 over a 16 x 16 block of a row-major tile (stride HD + 8):
//   row-operand form (B of a product contracting over columns, e.g. S = Q K^T with K rows):
//     matrices (rows 0-7, cols 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15) -> b0,b1 of n-tile 0, b0,b1 of n-tile 1
//   trans form (B of a product contracting over rows, e.g. O = P V):
//     matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) -> b0,b1 of n-tile 0, b0,b1 of n-tile 1
//   A form (A operand straight from a row-major tile):
//     matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) -> a0, a1, a2, a3
__device__ __forceinline__ int brow_r(int lane) { return ((lane >> 4) << 3) + (lane & 7); }
__device__ __forceinline__ int brow_c(int lane) { return ((lane >> 3) & 1) << 3; }
__device__ __forceinline__ int btr_r(int lane) { return (((lane >> 3) & 1) << 3) + (lane & 7); }
__device__ __forceinline__ int btr_c(int lane) { return (lane >> 4) << 3; }

// scores: S (16 x TILE) = A (16 x HD, register fragments) . B^T, B row-major in shared memory.
template <int HD, int TILE>
__device__ __forceinline__ void scores(float (*s)[4], unsigned (*a)[4], const bf16* b, int lane) {
#pragma unroll
    for (int nt = 0; nt < TILE / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
    unsigned base = smem_addr(b + brow_r(lane) * (HD + 8) + brow_c(lane));
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
        for (int np = 0; np < TILE / 16; np++) {
            unsigned r[4];
            ldsm4(r, base + 2 * (np * 16 * (HD + 8) + kk * 16));
            mma_bf16(s[2 * np], a[kk], r[0], r[1]);
            mma_bf16(s[2 * np + 1], a[kk], r[2], r[3]);
        }
    }
}

// scores_sa is scores with A (16 rows x HD) read from a row-major shared tile too.
template <int HD, int TILE>
__device__ __forceinline__ void scores_sa(float (*s)[4], const bf16* a, const bf16* b, int lane) {
#pragma unroll
    for (int nt = 0; nt < TILE / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
    unsigned abase = smem_addr(a + btr_r(lane) * (HD + 8) + btr_c(lane));
    unsigned base = smem_addr(b + brow_r(lane) * (HD + 8) + brow_c(lane));
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        unsigned af[4];
        ldsm4(af, abase + 2 * kk * 16);
#pragma unroll
        for (int np = 0; np < TILE / 16; np++) {
            unsigned r[4];
            ldsm4(r, base + 2 * (np * 16 * (HD + 8) + kk * 16));
            mma_bf16(s[2 * np], af, r[0], r[1]);
            mma_bf16(s[2 * np + 1], af, r[2], r[3]);
        }
    }
}

// accumulate: O (16 x HD) += P (16 x TILE, accumulator layout, rounded to bf16) . B with B
// (TILE x HD) row-major in shared memory.
template <int HD, int TILE>
__device__ __forceinline__ void accumulate(float (*o)[4], float (*p)[4], const bf16* b, int lane) {
    unsigned base = smem_addr(b + btr_r(lane) * (HD + 8) + btr_c(lane));
#pragma unroll
    for (int j = 0; j < TILE / 16; j++) {
        unsigned a[4];
        a[0] = pack_bf16(p[2 * j][0], p[2 * j][1]);
        a[1] = pack_bf16(p[2 * j][2], p[2 * j][3]);
        a[2] = pack_bf16(p[2 * j + 1][0], p[2 * j + 1][1]);
        a[3] = pack_bf16(p[2 * j + 1][2], p[2 * j + 1][3]);
#pragma unroll
        for (int dp = 0; dp < HD / 16; dp++) {
            unsigned r[4];
            ldsm4t(r, base + 2 * (j * 16 * (HD + 8) + dp * 16));
            mma_bf16(o[2 * dp], a, r[0], r[1]);
            mma_bf16(o[2 * dp + 1], a, r[2], r[3]);
        }
    }
}

// query_range gives the visible key range [lo, hi] (absolute rows) of query row i, or an empty
// range (lo = INT_MAX, hi = -1) for rows past n or rows that see no key.
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

// spans reduces the ranges of a warp's two rows per lane: the block-wide union [blo, bhi], the
// warp-wide union [wlo, whi], and the warp-wide intersection [ilo, ihi] (tiles inside it need no
// mask; empty rows make it empty).
struct spans {
    int blo, bhi, wlo, whi, ilo, ihi;
};

__device__ __forceinline__ spans row_spans(int lo0, int hi0, int lo1, int hi1) {
    __shared__ int s_lo, s_hi;
    spans r;
    if (threadIdx.x == 0) { s_lo = 0x7fffffff; s_hi = -1; }
    __syncthreads();
    atomicMin(&s_lo, min(lo0, lo1));
    atomicMax(&s_hi, max(hi0, hi1));
    __syncthreads();
    r.blo = s_lo;
    r.bhi = s_hi;
    r.wlo = min(lo0, lo1);
    r.whi = max(hi0, hi1);
    r.ilo = max(lo0, lo1);
    r.ihi = min(hi0, hi1);
    for (int o = 1; o < 32; o <<= 1) {
        r.wlo = min(r.wlo, __shfl_xor_sync(0xffffffffu, r.wlo, o));
        r.whi = max(r.whi, __shfl_xor_sync(0xffffffffu, r.whi, o));
        r.ilo = max(r.ilo, __shfl_xor_sync(0xffffffffu, r.ilo, o));
        r.ihi = min(r.ihi, __shfl_xor_sync(0xffffffffu, r.ihi, o));
    }
    return r;
}

// attn_fwd_mma_impl: each warp owns MT m-tiles of 16 query rows (a block 64 * MT rows) and
// walks key tiles of BK rows. With MT = 1 the warp's Q fragments stay in registers; with MT = 2
// Q is staged in shared memory and each K/V fragment read from shared memory feeds two products.
template <int HD, int W, int MT, int BK>
__device__ void attn_fwd_mma_impl(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                  const int* cu_q, const int* cu_k, int D, long long N, int NH, int NKV,
                                  float scale, int window) {
    const int LDS = HD + 8, WR = 16 * MT, BR = W * WR;
    extern __shared__ __attribute__((aligned(16))) unsigned char smem[];
    bf16* Ks = (bf16*)smem;        // [2][BK][LDS]
    bf16* Vs = Ks + 2 * BK * LDS;  // [2][BK][LDS]
    bf16* Qs = Vs + 2 * BK * LDS;  // [BR][LDS] when MT > 1
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int h = blockIdx.y, g = h / (NH / NKV);
    long long qblk = (long long)gridDim.x - 1 - blockIdx.x;  // the longest rows first
    long long wrow0 = qblk * BR + warp * WR;
    long long qld = (long long)NH * HD;
    int lo[MT][2], hi[MT][2];
    int mlo = 0x7fffffff, mhi = -1, xlo = -1, xhi = 0x7fffffff;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            query_range(cu_q, cu_k, D, N, wrow0 + mt * 16 + (lane >> 2) + 8 * r, window, &lo[mt][r], &hi[mt][r]);
            mlo = min(mlo, lo[mt][r]);
            mhi = max(mhi, hi[mt][r]);
            xlo = max(xlo, lo[mt][r]);
            xhi = min(xhi, hi[mt][r]);
        }
    spans sp = row_spans(mlo, mhi, xlo, xhi);
    unsigned qa[MT == 1 ? HD / 16 : 1][4];
    if (MT == 1) {
        load_afrag<HD>((unsigned(*)[4])qa, q + (long long)h * HD, wrow0, N, qld, lane);
    } else {
        load_tile<HD, BR, W>(Qs, q, qblk * BR, N - 1, qld, (long long)h * HD);
    }
    float o[MT][HD / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < HD / 8; nt++) o[mt][nt][0] = o[mt][nt][1] = o[mt][nt][2] = o[mt][nt][3] = 0.f;
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) m[mt][0] = m[mt][1] = NEG_INF, l[mt][0] = l[mt][1] = 0.f;
    const float sl2 = scale * LOG2E;
    long long kld = (long long)NKV * HD, col = (long long)g * HD;
    int ntiles = sp.bhi < sp.blo ? 0 : (sp.bhi - sp.blo) / BK + 1;
    if (ntiles > 0) {
        load_tile<HD, BK, W>(Ks, k, sp.blo, sp.bhi, kld, col);
        load_tile<HD, BK, W>(Vs, v, sp.blo, sp.bhi, kld, col);
    }
    cp_commit();
    unsigned kbase = smem_addr(Ks + brow_r(lane) * LDS + brow_c(lane));
    unsigned vbase = smem_addr(Vs + btr_r(lane) * LDS + btr_c(lane));
    unsigned qbase = smem_addr(Qs + (warp * WR + btr_r(lane)) * LDS + btr_c(lane));
    for (int t = 0; t < ntiles; t++) {
        int j0 = sp.blo + t * BK, buf = t & 1;
        if (t + 1 < ntiles) {
            load_tile<HD, BK, W>(Ks + (buf ^ 1) * BK * LDS, k, j0 + BK, sp.bhi, kld, col);
            load_tile<HD, BK, W>(Vs + (buf ^ 1) * BK * LDS, v, j0 + BK, sp.bhi, kld, col);
        }
        cp_commit();
        cp_wait1();
        __syncthreads();
        if (sp.whi >= j0 && sp.wlo <= j0 + BK - 1) {  // warp-uniform
            float s[MT][BK / 8][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < BK / 8; nt++) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
            unsigned kb = kbase + 2 * buf * BK * LDS;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                unsigned af[MT][4];
                if (MT == 1) {
#pragma unroll
                    for (int i = 0; i < 4; i++) af[0][i] = qa[MT == 1 ? kk : 0][i];
                } else {
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) ldsm4(af[mt], qbase + 2 * (mt * 16 * LDS + kk * 16));
                }
#pragma unroll
                for (int np = 0; np < BK / 16; np++) {
                    unsigned r[4];
                    ldsm4(r, kb + 2 * (np * 16 * LDS + kk * 16));
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma_bf16(s[mt][2 * np], af[mt], r[0], r[1]);
                        mma_bf16(s[mt][2 * np + 1], af[mt], r[2], r[3]);
                    }
                }
            }
            bool full = j0 >= sp.ilo && j0 + BK - 1 <= sp.ihi;
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
                for (int nt = 0; nt < BK / 8; nt++) {
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        int j = j0 + nt * 8 + (lane & 3) * 2 + e;
                        float a = s[mt][nt][e], b = s[mt][nt][2 + e];
                        if (!full) {
                            a = (j >= lo[mt][0] && j <= hi[mt][0]) ? a : NEG_INF;
                            b = (j >= lo[mt][1] && j <= hi[mt][1]) ? b : NEG_INF;
                        }
                        s[mt][nt][e] = a;
                        s[mt][nt][2 + e] = b;
                        mx0 = fmaxf(mx0, a);
                        mx1 = fmaxf(mx1, b);
                    }
                }
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
                // m holds raw (unscaled) row maxima; p = 2^(s * sl2 - m * sl2) is one FFMA and
                // one ex2. Rows that have seen nothing yet keep m = -inf: their base is 0, so
                // ex2(-inf) = 0 and no NaN appears.
                float n0 = fmaxf(m[mt][0], mx0), n1 = fmaxf(m[mt][1], mx1);
                float b0 = n0 == NEG_INF ? 0.f : n0 * sl2, b1 = n1 == NEG_INF ? 0.f : n1 * sl2;
                float c0 = ex2(m[mt][0] * sl2 - b0), c1 = ex2(m[mt][1] * sl2 - b1);
                l[mt][0] *= c0;
                l[mt][1] *= c1;
#pragma unroll
                for (int nt = 0; nt < BK / 8; nt++) {
                    s[mt][nt][0] = ex2(fmaf(s[mt][nt][0], sl2, -b0));
                    s[mt][nt][1] = ex2(fmaf(s[mt][nt][1], sl2, -b0));
                    s[mt][nt][2] = ex2(fmaf(s[mt][nt][2], sl2, -b1));
                    s[mt][nt][3] = ex2(fmaf(s[mt][nt][3], sl2, -b1));
                    l[mt][0] += s[mt][nt][0] + s[mt][nt][1];
                    l[mt][1] += s[mt][nt][2] + s[mt][nt][3];
                }
                m[mt][0] = n0;
                m[mt][1] = n1;
                if (__any_sync(0xffffffffu, c0 != 1.f || c1 != 1.f)) {  // no row's max moved: skip
#pragma unroll
                    for (int nt = 0; nt < HD / 8; nt++) {
                        o[mt][nt][0] *= c0; o[mt][nt][1] *= c0;
                        o[mt][nt][2] *= c1; o[mt][nt][3] *= c1;
                    }
                }
            }
            unsigned vb = vbase + 2 * buf * BK * LDS;
#pragma unroll
            for (int j = 0; j < BK / 16; j++) {
                unsigned a[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    a[mt][0] = pack_bf16(s[mt][2 * j][0], s[mt][2 * j][1]);
                    a[mt][1] = pack_bf16(s[mt][2 * j][2], s[mt][2 * j][3]);
                    a[mt][2] = pack_bf16(s[mt][2 * j + 1][0], s[mt][2 * j + 1][1]);
                    a[mt][3] = pack_bf16(s[mt][2 * j + 1][2], s[mt][2 * j + 1][3]);
                }
#pragma unroll
                for (int dp = 0; dp < HD / 16; dp++) {
                    unsigned r[4];
                    ldsm4t(r, vb + 2 * (j * 16 * LDS + dp * 16));
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma_bf16(o[mt][2 * dp], a[mt], r[0], r[1]);
                        mma_bf16(o[mt][2 * dp + 1], a[mt], r[2], r[3]);
                    }
                }
            }
        }
        __syncthreads();
    }
    cp_wait_all();
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        float l0 = l[mt][0], l1 = l[mt][1];
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
        long long i0 = wrow0 + mt * 16 + (lane >> 2), i1 = i0 + 8;
#pragma unroll
        for (int nt = 0; nt < HD / 8; nt++) {
            int c = h * HD + nt * 8 + (lane & 3) * 2;
            if (i0 < N) *(unsigned*)(out + i0 * qld + c) = pack_bf16(o[mt][nt][0] * inv0, o[mt][nt][1] * inv0);
            if (i1 < N) *(unsigned*)(out + i1 * qld + c) = pack_bf16(o[mt][nt][2] * inv1, o[mt][nt][3] * inv1);
        }
        if (lse && (lane & 3) == 0) {
            if (i0 < N) lse[i0 * NH + h] = l0 > 0.f ? (m[mt][0] * sl2 + log2f(l0)) * LN2 : NEG_INF;
            if (i1 < N) lse[i1 * NH + h] = l1 > 0.f ? (m[mt][1] * sl2 + log2f(l1)) * LN2 : NEG_INF;
        }
    }
}


template <int HD, int W, int BK>
__device__ void attn_bwd_dq_mma_impl(bf16* dq, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                                     const float* lse, const float* dvec, const int* cu, int D, long long N,
                                     int NH, int NKV, float scale, int window) {
    const int LDS = HD + 8;
    extern __shared__ __attribute__((aligned(16))) unsigned char smem[];
    bf16* Ks = (bf16*)smem;        // [2][BK][LDS]
    bf16* Vs = Ks + 2 * BK * LDS;  // [2][BK][LDS]
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int h = blockIdx.y, g = h / (NH / NKV);
    long long qblk = (long long)gridDim.x - 1 - blockIdx.x;
    long long row0 = qblk * (16 * W) + warp * 16;
    long long i0 = row0 + (lane >> 2), i1 = i0 + 8;
    int lo0, hi0, lo1, hi1;
    query_range(cu, cu, D, N, i0, window, &lo0, &hi0);
    query_range(cu, cu, D, N, i1, window, &lo1, &hi1);
    spans sp = row_spans(lo0, hi0, lo1, hi1);
    long long qld = (long long)NH * HD;
    unsigned qa[HD / 16][4], da[HD / 16][4];
    load_afrag<HD>(qa, q + (long long)h * HD, row0, N, qld, lane);
    load_afrag<HD>(da, dout + (long long)h * HD, row0, N, qld, lane);
    const float sl2 = scale * LOG2E;
    float L0 = i0 < N ? lse[i0 * NH + h] * LOG2E : 0.f, L1 = i1 < N ? lse[i1 * NH + h] * LOG2E : 0.f;
    float D0 = i0 < N ? dvec[i0 * NH + h] : 0.f, D1 = i1 < N ? dvec[i1 * NH + h] : 0.f;
    float acc[HD / 8][4];
#pragma unroll
    for (int nt = 0; nt < HD / 8; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    long long kld = (long long)NKV * HD, col = (long long)g * HD;
    int ntiles = sp.bhi < sp.blo ? 0 : (sp.bhi - sp.blo) / BK + 1;
    if (ntiles > 0) {
        load_tile<HD, BK, W>(Ks, k, sp.blo, sp.bhi, kld, col);
        load_tile<HD, BK, W>(Vs, v, sp.blo, sp.bhi, kld, col);
    }
    cp_commit();
    for (int t = 0; t < ntiles; t++) {
        int j0 = sp.blo + t * BK, buf = t & 1;
        if (t + 1 < ntiles) {
            load_tile<HD, BK, W>(Ks + (buf ^ 1) * BK * LDS, k, j0 + BK, sp.bhi, kld, col);
            load_tile<HD, BK, W>(Vs + (buf ^ 1) * BK * LDS, v, j0 + BK, sp.bhi, kld, col);
        }
        cp_commit();
        cp_wait1();
        __syncthreads();
        if (sp.whi >= j0 && sp.wlo <= j0 + BK - 1) {
            float s[BK / 8][4], dp[BK / 8][4];
            scores<HD, BK>(s, qa, Ks + buf * BK * LDS, lane);
            scores<HD, BK>(dp, da, Vs + buf * BK * LDS, lane);
            bool full = j0 >= sp.ilo && j0 + BK - 1 <= sp.ihi;
#pragma unroll
            for (int nt = 0; nt < BK / 8; nt++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int j = j0 + nt * 8 + (lane & 3) * 2 + e;
                    float p0 = ex2(fmaf(s[nt][e], sl2, -L0));
                    float p1 = ex2(fmaf(s[nt][2 + e], sl2, -L1));
                    if (!full) {
                        p0 = (j >= lo0 && j <= hi0) ? p0 : 0.f;
                        p1 = (j >= lo1 && j <= hi1) ? p1 : 0.f;
                    }
                    s[nt][e] = p0 * (dp[nt][e] - D0);
                    s[nt][2 + e] = p1 * (dp[nt][2 + e] - D1);
                }
            }
            accumulate<HD, BK>(acc, s, Ks + buf * BK * LDS, lane);
        }
        __syncthreads();
    }
#pragma unroll
    for (int nt = 0; nt < HD / 8; nt++) {
        int c = h * HD + nt * 8 + (lane & 3) * 2;
        if (i0 < N) *(unsigned*)(dq + i0 * qld + c) = pack_bf16(acc[nt][0] * scale, acc[nt][1] * scale);
        if (i1 < N) *(unsigned*)(dq + i1 * qld + c) = pack_bf16(acc[nt][2] * scale, acc[nt][3] * scale);
    }
}

// dq_tile adds one (query tile, key block) pair's share of dQ to the fp32 accumulator dqacc
// [N, NH, HD]: dQ[BQ x HD] += dS^T (BQ x 16W, from the block's dS tile dss [16W][BQ + 8] in
// shared memory) . K (16W x HD, the block's keys in shared memory). Warp w takes the HD / W
// columns [w * HD / W, (w + 1) * HD / W). Queries past bhi (no key of the block sees them) or
// past N add nothing. Unscaled: the conversion to bf16 multiplies by the softmax scale.
template <int HD, int W, int BQ>
__device__ __forceinline__ void dq_tile(float* dqacc, const bf16* dss, const bf16* ks, long long i0, int hn, int bhi,
                                        long long N, int NH, int lane, int warp) {
    const int LDS = HD + 8, LDQ = BQ + 8, NC = HD / W;
    float acc[BQ / 16][NC / 8][4];
#pragma unroll
    for (int mt = 0; mt < BQ / 16; mt++)
#pragma unroll
        for (int nt = 0; nt < NC / 8; nt++) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
    // A = dS^T from dS stored key-major: ldmatrix.trans of (keys, queries) blocks in the order
    // (0-7, 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15) gives a0..a3. B = K rows as in accumulate.
    unsigned abase = smem_addr(dss + brow_r(lane) * LDQ + brow_c(lane));
    unsigned bbase = smem_addr(ks + btr_r(lane) * LDS + btr_c(lane) + warp * NC);
#pragma unroll
    for (int kk = 0; kk < W; kk++) {
#pragma unroll
        for (int mt = 0; mt < BQ / 16; mt++) {
            unsigned a[4];
            ldsm4t(a, abase + 2 * (kk * 16 * LDQ + mt * 16));
#pragma unroll
            for (int np = 0; np < NC / 16; np++) {
                unsigned r[4];
                ldsm4t(r, bbase + 2 * (kk * 16 * LDS + np * 16));
                mma_bf16(acc[mt][2 * np], a, r[0], r[1]);
                mma_bf16(acc[mt][2 * np + 1], a, r[2], r[3]);
            }
        }
    }
#pragma unroll
    for (int mt = 0; mt < BQ / 16; mt++) {
        long long ia = i0 + mt * 16 + (lane >> 2), ib = ia + 8;
#pragma unroll
        for (int nt = 0; nt < NC / 8; nt++) {
            int c = warp * NC + nt * 8 + (lane & 3) * 2;
            if (ia <= bhi && ia < N) {
                float* p = dqacc + (ia * NH + hn) * HD + c;
                atomicAdd(p, acc[mt][nt][0]);
                atomicAdd(p + 1, acc[mt][nt][1]);
            }
            if (ib <= bhi && ib < N) {
                float* p = dqacc + (ib * NH + hn) * HD + c;
                atomicAdd(p, acc[mt][nt][2]);
                atomicAdd(p + 1, acc[mt][nt][3]);
            }
        }
    }
}

// attn_bwd_dkv_mma_impl computes dK and dV of a block of 16 * W keys; with FUSED it also adds the
// block's share of dQ to dqacc (dq_tile), so that no separate dQ pass recomputes S and dP: dS of
// each tile goes through shared memory ([16W][BQ + 8] bf16 after the lse and D buffers).
template <int HD, int W, int BQ, bool FUSED>
__device__ void attn_bwd_dkv_mma_impl(bf16* dk, bf16* dv, float* dqacc, const bf16* q, const bf16* k, const bf16* v,
                                      const bf16* dout, const float* lse, const float* dvec, const int* cu, int D,
                                      long long N, int NH, int NKV, float scale, int window) {
    const int LDS = HD + 8;
    extern __shared__ __attribute__((aligned(16))) unsigned char smem[];
    const int BR = 16 * W;
    bf16* Ks = (bf16*)smem;              // [BR][LDS]
    bf16* Vs = Ks + BR * LDS;            // [BR][LDS]
    bf16* Qs = Vs + BR * LDS;            // [2][BQ][LDS]
    bf16* dOs = Qs + 2 * BQ * LDS;       // [2][BQ][LDS]
    float* Ls = (float*)(dOs + 2 * BQ * LDS);  // [2][BQ] lse * log2 e
    float* Ds = Ls + 2 * BQ;             // [2][BQ]
    bf16* dSs = (bf16*)(Ds + 2 * BQ);    // [BR][BQ + 8] with FUSED
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = blockIdx.y, G = NH / NKV;
    long long kblk = blockIdx.x;
    long long krow0 = kblk * BR;
    long long row0 = krow0 + warp * 16;
    long long j0k = row0 + (lane >> 2), j1k = j0k + 8;
    int lo0, hi0, lo1, hi1;
    key_range(cu, D, N, j0k, window, &lo0, &hi0);
    key_range(cu, D, N, j1k, window, &lo1, &hi1);
    spans sp = row_spans(lo0, hi0, lo1, hi1);
    long long kld = (long long)NKV * HD, qld = (long long)NH * HD;
    load_tile<HD, BR, W>(Ks, k, krow0, N - 1, kld, (long long)g * HD);
    load_tile<HD, BR, W>(Vs, v, krow0, N - 1, kld, (long long)g * HD);
    float dka[HD / 8][4], dva[HD / 8][4];
#pragma unroll
    for (int nt = 0; nt < HD / 8; nt++) {
        dka[nt][0] = dka[nt][1] = dka[nt][2] = dka[nt][3] = 0.f;
        dva[nt][0] = dva[nt][1] = dva[nt][2] = dva[nt][3] = 0.f;
    }
    const float sl2 = scale * LOG2E;
    int ntq = sp.bhi < sp.blo ? 0 : (sp.bhi - sp.blo) / BQ + 1;
    int ntiles = ntq * G;
    // Tile t covers query head g*G + t/ntq, queries blo + (t%ntq)*BQ ...
    if (ntiles > 0) {
        long long hc = (long long)(g * G) * HD;
        load_tile<HD, BQ, W>(Qs, q, sp.blo, sp.bhi, qld, hc);
        load_tile<HD, BQ, W>(dOs, dout, sp.blo, sp.bhi, qld, hc);
        if (threadIdx.x < BQ) {
            long long i = sp.blo + threadIdx.x;
            Ls[threadIdx.x] = i <= sp.bhi ? lse[i * NH + g * G] * LOG2E : 0.f;
            Ds[threadIdx.x] = i <= sp.bhi ? dvec[i * NH + g * G] : 0.f;
        }
    }
    cp_commit();
    for (int t = 0; t < ntiles; t++) {
        int buf = t & 1;
        int i0 = sp.blo + (t % ntq) * BQ;
        int hcur = g * G + t / ntq;
        if (t + 1 < ntiles) {
            int hn = g * G + (t + 1) / ntq;
            long long in0 = sp.blo + ((t + 1) % ntq) * BQ;
            load_tile<HD, BQ, W>(Qs + (buf ^ 1) * BQ * LDS, q, in0, sp.bhi, qld, (long long)hn * HD);
            load_tile<HD, BQ, W>(dOs + (buf ^ 1) * BQ * LDS, dout, in0, sp.bhi, qld, (long long)hn * HD);
            if (threadIdx.x < BQ) {
                long long i = in0 + threadIdx.x;
                Ls[(buf ^ 1) * BQ + threadIdx.x] = i <= sp.bhi ? lse[i * NH + hn] * LOG2E : 0.f;
                Ds[(buf ^ 1) * BQ + threadIdx.x] = i <= sp.bhi ? dvec[i * NH + hn] : 0.f;
            }
        }
        cp_commit();
        cp_wait1();
        __syncthreads();
        if (sp.whi >= i0 && sp.wlo <= i0 + BQ - 1) {
            const bf16* Qb = Qs + buf * BQ * LDS;
            const bf16* dOb = dOs + buf * BQ * LDS;
            const float* Lb = Ls + buf * BQ;
            const float* Db = Ds + buf * BQ;
            float s[BQ / 8][4], dp[BQ / 8][4];
            scores_sa<HD, BQ>(s, Ks + warp * 16 * LDS, Qb, lane);
            scores_sa<HD, BQ>(dp, Vs + warp * 16 * LDS, dOb, lane);
            bool full = i0 >= sp.ilo && i0 + BQ - 1 <= sp.ihi;
#pragma unroll
            for (int nt = 0; nt < BQ / 8; nt++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int c = nt * 8 + (lane & 3) * 2 + e;
                    int i = i0 + c;
                    float L = Lb[c], Dv = Db[c];
                    float p0 = ex2(fmaf(s[nt][e], sl2, -L));
                    float p1 = ex2(fmaf(s[nt][2 + e], sl2, -L));
                    if (!full) {
                        p0 = (i >= lo0 && i <= hi0) ? p0 : 0.f;
                        p1 = (i >= lo1 && i <= hi1) ? p1 : 0.f;
                    }
                    dp[nt][e] = p0 * (dp[nt][e] - Dv);
                    dp[nt][2 + e] = p1 * (dp[nt][2 + e] - Dv);
                    s[nt][e] = p0;
                    s[nt][2 + e] = p1;
                }
            }
            accumulate<HD, BQ>(dva, s, dOb, lane);
            accumulate<HD, BQ>(dka, dp, Qb, lane);
            if (FUSED) {
                // This warp's dS rows (its 16 keys) for the block's dQ product, rounded as the
                // dK product rounds them.
                int r0 = warp * 16 + (lane >> 2);
#pragma unroll
                for (int nt = 0; nt < BQ / 8; nt++) {
                    int c = nt * 8 + (lane & 3) * 2;
                    *(unsigned*)(dSs + r0 * (BQ + 8) + c) = pack_bf16(dp[nt][0], dp[nt][1]);
                    *(unsigned*)(dSs + (r0 + 8) * (BQ + 8) + c) = pack_bf16(dp[nt][2], dp[nt][3]);
                }
            }
        } else if (FUSED) {
            int r0 = warp * 16 + (lane >> 2);
#pragma unroll
            for (int nt = 0; nt < BQ / 8; nt++) {
                int c = nt * 8 + (lane & 3) * 2;
                *(unsigned*)(dSs + r0 * (BQ + 8) + c) = 0u;
                *(unsigned*)(dSs + (r0 + 8) * (BQ + 8) + c) = 0u;
            }
        }
        if (FUSED) {
            __syncthreads();
            dq_tile<HD, W, BQ>(dqacc, dSs, Ks, i0, hcur, sp.bhi, N, NH, lane, warp);
        }
        __syncthreads();
    }
    cp_wait_all();
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
