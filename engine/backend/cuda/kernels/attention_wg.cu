// attention_wg.cu: the attention kernels for Hopper (sm_90a), on warpgroup MMAs (wgmma): the
// forward, dQ and dK/dV kernels of attention_tc.cu with the same contract (out (=), lse (=),
// dq = scale * dS k (=), dk = scale * dS^T q (=), dv = P^T dout (=); causal within packed
// documents, GQA, window) for bf16 tensors with head dim 64 or 128. attention_mma.cuh (prepended
// by kernels.go) supplies the row ranges, the base-2 softmax and the copy helpers; kernels.go
// compiles this file only for sm_90, as sm_90a.
//
// A block is one warpgroup (4 warps, 128 threads) that owns 64 rows (queries in the forward and
// dQ kernels, keys in dK/dV), warp w rows [16w, 16w + 16), and streams 64-row tiles of the
// other side through shared memory with cp.async, two buffers deep, so that the copy of tile
// t + 1 overlaps the products on tile t. Every product is one wgmma per 16-deep slice:
//   S = Q K^T and dP = dO V^T (and S^T = K Q^T, dP^T = V dO^T for dK/dV) read both operands
//   from shared memory, contracting over the head dim (K-major);
//   O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q take the probabilities or dS from
//   registers, rounded to bf16 as mma.sync's A fragments (wgmma's register A operand has their
//   layout), and B from the same shared tiles read along their rows (MN-major).
// The fp32 accumulators of a 64 x N wgmma hold, per warp, exactly what mma.sync m16n8's
// accumulators hold for 16 rows: d[4 * j + e] is row lane / 4 (e < 2) or lane / 4 + 8, column
// 8 j + 2 (lane % 4) + e % 2. So the masking and online softmax are those of attention_mma.cuh.
//
// Shared tiles use wgmma.cuh's 128-byte swizzled layout (prepended by kernels.go with its
// descriptor and product helpers), HD columns wide.

#define WG_ROWS 64

// wg_f2: two adjacent floats read in one 8-byte shared load (the lse and D values of a thread's
// two adjacent columns).
struct alignas(8) wg_f2 { float x, y; };

// wg_u4: 16 bytes (eight bf16) read in one load.
struct alignas(16) wg_u4 { unsigned u[4]; };

// wg_load starts copying rows [row0, row0 + R) (rows past last read as zero) of a global bf16
// matrix with row stride ld, columns [col0, col0 + HD), into the swizzled tile at base: the
// forward's form, faster there than wg_copier, while wg_copier is faster in the backward
// kernels (testdata/README.md, gpu-run18).
// Rows, row strides and columns fit in 32 bits (the kernels' row ranges are ints, rows and
// strides are not negative); only the element offset row * ld is formed in 64 bits (one wide
// multiply), so a copy costs a few integer instructions.
template <int HD, int R>
__device__ __forceinline__ void wg_load(unsigned base, const bf16* g, long long row0, long long last, long long ld, long long col0) {
    const int CH = HD / 8;
    const bf16* gc = g + col0;
    int r0 = (int)row0, lst = (int)last, ild = (int)ld;
#pragma unroll
    for (int it = 0; it < R * CH / 128; it++) {
        int e = threadIdx.x + it * 128;
        int r = e / CH, c = e % CH;
        int row = r0 + r;
        bool ok = row <= lst;
        unsigned dst = base + (c >> 3) * (R * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
        cp16(dst, gc + c * 8 + (unsigned long long)(unsigned)(ok ? row : 0) * (unsigned)ild, ok);
    }
}


// wg_copier is one thread's share of copying tiles of R rows x HD bf16 columns into the swizzled
// layout: chunk c = tid % CH of rows tid / CH + it * RPI, it < IT. RPI is a multiple of 8, so the
// swizzle term (row % 8), and with it every chunk's shared offset, is the same in every tile: a
// tile copy costs per chunk a compare, a pointer step and the cp.async. Rows and row strides fit
// in 32 bits (the kernels' row ranges are ints); only row * ld is formed in 64.
template <int HD, int R>
struct wg_copier {
    static constexpr int CH = HD / 8, RPI = 128 / CH, IT = R * CH / 128;
    unsigned soff;  // shared byte offset, within a tile, of the thread's chunk it = 0
    int r;          // its row within the tile
    __device__ __forceinline__ wg_copier() {
        int c = threadIdx.x % CH;
        r = threadIdx.x / CH;
        soff = (c >> 3) * (R * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
    }
    // load starts copying rows [row0, row0 + R) of g (row stride ld, g pointing at the tile's
    // first column) into the tile at base; rows past last read as zero.
    __device__ __forceinline__ void load(unsigned base, const bf16* g, int row0, int last, int ld) const {
        int row = row0 + r;
        const bf16* p = g + (threadIdx.x % CH) * 8 + (long long)row * ld;
        long long step = (long long)RPI * ld;
#pragma unroll
        for (int it = 0; it < IT; it++) {
            bool ok = row + it * RPI <= last;
            cp16(base + soff + it * (RPI * 128), ok ? p + it * step : g, ok);
        }
    }
};

// cp4 copies 4 bytes global -> shared asynchronously; with ok false it writes zeros.
__device__ __forceinline__ void cp4(unsigned dst, const void* src, bool ok) {
    int n = ok ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}

// wg_query_block maps a block's rank (its grid index over the heads) to its query row block:
// order[rank] when the host gave an order (heaviest first, attention_order.go), else the row
// blocks from the last, the longest rows of a causal document first.
__device__ __forceinline__ long long wg_query_block(const int* order, int rank, long long N) {
    return order ? order[rank] : (N + WG_ROWS - 1) / WG_ROWS - 1 - rank;
}

// wg_rs picks the register-A product for the head dim: d (64 x HD) += A (64 x 16) . B.
template <int HD>
__device__ __forceinline__ void wg_rs(float* d, const unsigned* a, unsigned long long db) {
    if (HD == 64) wg_rs_n64(d, a, db);
    else wg_rs_n128(d, a, db);
}

// wg_pack rounds a 64 x 16J fp32 accumulator s to bf16 A fragments of J 16-column slices.
template <int J = 4>
__device__ __forceinline__ void wg_pack(unsigned (*a)[4], const float* s) {
#pragma unroll
    for (int j = 0; j < J; j++) {
        a[j][0] = pack_bf16(s[8 * j + 0], s[8 * j + 1]);
        a[j][1] = pack_bf16(s[8 * j + 2], s[8 * j + 3]);
        a[j][2] = pack_bf16(s[8 * j + 4], s[8 * j + 5]);
        a[j][3] = pack_bf16(s[8 * j + 6], s[8 * j + 7]);
    }
}

// wg_ss picks the shared-operand product for BK columns: d (64 x BK) (+)= A . B.
template <int BK>
__device__ __forceinline__ void wg_ss(float* d, unsigned long long da, unsigned long long db, int accumulate) {
    if (BK == 64) wg_ss_n64(d, da, db, accumulate);
    else wg_ss_n128(d, da, db, accumulate);
}

// The masking helpers below come in two forms, MASK false for tiles every row sees in full and
// true for the tiles on a document, window or causal edge; the kernels branch between them per
// tile. (Written as one loop with "if (!full)" inside, the compiler predicated the masking and
// issued its ~120 compares and selects on every tile, a quarter of the forward's loop.)

// wg_mask_max: the forward's scores s (64 x BK, accumulator layout) with keys outside a row's
// [lo, hi] set to -inf (MASK), and the row maxima of this thread's two rows.
template <bool MASK, int BK>
__device__ __forceinline__ void wg_mask_max(float* s, int j0, int lane, int lo0, int hi0, int lo1, int hi1, float& mx0, float& mx1) {
#pragma unroll
    for (int nt = 0; nt < BK / 8; nt++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            float a = s[4 * nt + e], b = s[4 * nt + 2 + e];
            if (MASK) {
                int j = j0 + nt * 8 + (lane & 3) * 2 + e;
                a = (j >= lo0 && j <= hi0) ? a : NEG_INF;
                b = (j >= lo1 && j <= hi1) ? b : NEG_INF;
                s[4 * nt + e] = a;
                s[4 * nt + 2 + e] = b;
            }
            mx0 = fmaxf(mx0, a);
            mx1 = fmaxf(mx1, b);
        }
    }
}

// wg_fwd_softmax: one key tile's online-softmax step of the forward: mask (MASK), row maxima,
// rescale of the running sums l and the output o, and s turned into probabilities.
template <bool MASK, int HD, int BK>
__device__ __forceinline__ void wg_fwd_softmax(float* s, float* o, float& m0, float& m1, float& l0, float& l1, int j0, int lane,
                                               float sl2, int lo0, int hi0, int lo1, int hi1) {
    float mx0 = NEG_INF, mx1 = NEG_INF;
    wg_mask_max<MASK, BK>(s, j0, lane, lo0, hi0, lo1, hi1, mx0, mx1);
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    // As in attn_fwd_mma_impl: raw maxima, p = 2^(s sl2 - m sl2), rows that have seen
    // nothing keep m = -inf and a base of 0.
    float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    float b0 = n0 == NEG_INF ? 0.f : n0 * sl2, b1 = n1 == NEG_INF ? 0.f : n1 * sl2;
    float c0 = ex2(m0 * sl2 - b0), c1 = ex2(m1 * sl2 - b1);
    l0 *= c0;
    l1 *= c1;
#pragma unroll
    for (int nt = 0; nt < BK / 8; nt++) {
        s[4 * nt + 0] = ex2(fmaf(s[4 * nt + 0], sl2, -b0));
        s[4 * nt + 1] = ex2(fmaf(s[4 * nt + 1], sl2, -b0));
        s[4 * nt + 2] = ex2(fmaf(s[4 * nt + 2], sl2, -b1));
        s[4 * nt + 3] = ex2(fmaf(s[4 * nt + 3], sl2, -b1));
        l0 += s[4 * nt + 0] + s[4 * nt + 1];
        l1 += s[4 * nt + 2] + s[4 * nt + 3];
    }
    m0 = n0;
    m1 = n1;
#pragma unroll
    for (int nt = 0; nt < HD / 8; nt++) {
        o[4 * nt + 0] *= c0;
        o[4 * nt + 1] *= c0;
        o[4 * nt + 2] *= c1;
        o[4 * nt + 3] *= c1;
    }
}

// wg_probs_rows: dQ's probabilities p = 2^(s sl2 - L) of a 64 x 64 tile whose rows are queries
// (L per row), zero outside a row's key range [lo, hi] (MASK).
template <bool MASK>
__device__ __forceinline__ void wg_probs_rows(float* s, int j0, int lane, float sl2, float L0, float L1, int lo0, int hi0, int lo1, int hi1) {
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            float p0 = ex2(fmaf(s[4 * nt + e], sl2, -L0));
            float p1 = ex2(fmaf(s[4 * nt + 2 + e], sl2, -L1));
            if (MASK) {
                int j = j0 + nt * 8 + (lane & 3) * 2 + e;
                p0 = (j >= lo0 && j <= hi0) ? p0 : 0.f;
                p1 = (j >= lo1 && j <= hi1) ? p1 : 0.f;
            }
            s[4 * nt + e] = p0;
            s[4 * nt + 2 + e] = p1;
        }
    }
}

// wg_probs_cols: dK/dV's transposed probabilities P^T (rows are keys, columns queries i0 + c
// with L per column from Lb), zero outside a key row's query range [lo, hi] (MASK).
template <bool MASK>
__device__ __forceinline__ void wg_probs_cols(float* s, int i0, int lane, float sl2, const float* Lb, int lo0, int hi0, int lo1, int hi1) {
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
        wg_f2 L2 = *(const wg_f2*)(Lb + nt * 8 + (lane & 3) * 2);  // columns c, c + 1
#pragma unroll
        for (int e = 0; e < 2; e++) {
            int c = nt * 8 + (lane & 3) * 2 + e;
            float L = e == 0 ? L2.x : L2.y;
            float p0 = ex2(fmaf(s[4 * nt + e], sl2, -L));
            float p1 = ex2(fmaf(s[4 * nt + 2 + e], sl2, -L));
            if (MASK) {
                int i = i0 + c;
                p0 = (i >= lo0 && i <= hi0) ? p0 : 0.f;
                p1 = (i >= lo1 && i <= hi1) ? p1 : 0.f;
            }
            s[4 * nt + e] = p0;
            s[4 * nt + 2 + e] = p1;
        }
    }
}

// The grids are one-dimensional: block index = rank * heads + head, the rank mapped to a row
// block by the host's order (heaviest first) or the built-in one (wg_query_block, and key
// blocks in row order for dK/dV).
//
// attn_fwd_wg_impl: a block of 64 queries of one head walks key tiles of BK (64 or 128).
// Dynamic shared memory: 1024 + 64 * HD * 2 (Q) + 4 * BK * HD * 2 (K, V, two buffers each).
template <int HD, int BK>
__device__ void attn_fwd_wg_impl(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                 const int* cu_q, const int* cu_k, int D, long long N, int NH, int NKV,
                                 float scale, int window, const int* order) {
    const int TILE = BK * HD * 2;
    extern __shared__ __attribute__((aligned(16))) unsigned char smem[];
    unsigned Qs = wg_tile_base(smem), Ks = Qs + WG_ROWS * HD * 2, Vs = Ks + 2 * TILE;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int h = blockIdx.x % NH, g = h / (NH / NKV), rank = blockIdx.x / NH;
    long long qblk = wg_query_block(order, rank, N);
    long long i0 = qblk * WG_ROWS + warp * 16 + (lane >> 2), i1 = i0 + 8;
    int lo0, hi0, lo1, hi1;
    query_range(cu_q, cu_k, D, N, i0, window, &lo0, &hi0);
    query_range(cu_q, cu_k, D, N, i1, window, &lo1, &hi1);
    spans sp = row_spans(lo0, hi0, lo1, hi1);
    long long qld = (long long)NH * HD, kld = (long long)NKV * HD, col = (long long)g * HD;
    int ntiles = sp.bhi < sp.blo ? 0 : (sp.bhi - sp.blo) / BK + 1;
    wg_load<HD, WG_ROWS>(Qs, q, qblk * WG_ROWS, N - 1, qld, (long long)h * HD);
    if (ntiles > 0) {
        wg_load<HD, BK>(Ks, k, sp.blo, sp.bhi, kld, col);
        wg_load<HD, BK>(Vs, v, sp.blo, sp.bhi, kld, col);
    }
    cp_commit();
    float o[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) o[i] = 0.f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;
    const float sl2 = scale * LOG2E;
    const unsigned long long dQ = wg_desc_k(Qs), dK = wg_desc_k(Ks), dV = wg_desc_mn<BK>(Vs);
    for (int t = 0; t < ntiles; t++) {
        int j0 = sp.blo + t * BK, buf = t & 1;
        cp_wait_all();
        wg_fence_proxy();
        __syncthreads();
        if (t + 1 < ntiles) {
            wg_load<HD, BK>(Ks + (buf ^ 1) * TILE, k, j0 + BK, sp.bhi, kld, col);
            wg_load<HD, BK>(Vs + (buf ^ 1) * TILE, v, j0 + BK, sp.bhi, kld, col);
        }
        cp_commit();
        float s[BK / 2];
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wg_ss<BK>(s, wg_kstep<WG_ROWS>(dQ, kk), wg_kstep<BK>(wg_desc_plus(dK, buf * TILE), kk), kk > 0);
        wg_commit();
        wg_wait_all();
        wg_hold<BK / 2>(s);
        bool full = j0 >= sp.ilo && j0 + BK - 1 <= sp.ihi;
        if (full) wg_fwd_softmax<false, HD, BK>(s, o, m0, m1, l0, l1, j0, lane, sl2, lo0, hi0, lo1, hi1);
        else wg_fwd_softmax<true, HD, BK>(s, o, m0, m1, l0, l1, j0, lane, sl2, lo0, hi0, lo1, hi1);
        unsigned pa[BK / 16][4];
        wg_pack<BK / 16>(pa, s);
        wg_hold_u<BK / 4>(&pa[0][0]);
        wg_hold<HD / 2>(o);
        wg_fence();
#pragma unroll
        for (int j = 0; j < BK / 16; j++) wg_rs<HD>(o, pa[j], wg_mnstep(wg_desc_plus(dV, buf * TILE), j));
        wg_commit();
        wg_wait_all();
        wg_hold<HD / 2>(o);
    }
    cp_wait_all();
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
#pragma unroll
    for (int nt = 0; nt < HD / 8; nt++) {
        int c = h * HD + nt * 8 + (lane & 3) * 2;
        if (i0 < N) *(unsigned*)(out + i0 * qld + c) = pack_bf16(o[4 * nt + 0] * inv0, o[4 * nt + 1] * inv0);
        if (i1 < N) *(unsigned*)(out + i1 * qld + c) = pack_bf16(o[4 * nt + 2] * inv1, o[4 * nt + 3] * inv1);
    }
    if (lse && (lane & 3) == 0) {
        if (i0 < N) lse[i0 * NH + h] = l0 > 0.f ? (m0 * sl2 + log2f(l0)) * LN2 : NEG_INF;
        if (i1 < N) lse[i1 * NH + h] = l1 > 0.f ? (m1 * sl2 + log2f(l1)) * LN2 : NEG_INF;
    }
}

// attn_bwd_dq_wg_impl: a block of 64 queries of one head walks key tiles of 64:
// S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K. S and dP are committed as two groups, so
// that P is computed while dP is still being multiplied.
// Dynamic shared memory: 1024 + 2 * 64 * HD * 2 (Q, dO) + 4 * 64 * HD * 2 (K, V, two buffers each).
template <int HD>
__device__ void attn_bwd_dq_wg_impl(bf16* dq, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                                    const float* dl, const int* cu, int D, long long N,
                                    int NH, int NKV, float scale, int window, const int* order) {
    const int BK = WG_ROWS, TILE = WG_ROWS * HD * 2;
    extern __shared__ __attribute__((aligned(16))) unsigned char smem[];
    unsigned Qs = wg_tile_base(smem), dOs = Qs + TILE, Ks = dOs + TILE, Vs = Ks + 2 * TILE;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int h = blockIdx.x % NH, g = h / (NH / NKV), rank = blockIdx.x / NH;
    long long qblk = wg_query_block(order, rank, N);
    long long i0 = qblk * WG_ROWS + warp * 16 + (lane >> 2), i1 = i0 + 8;
    int lo0, hi0, lo1, hi1;
    query_range(cu, cu, D, N, i0, window, &lo0, &hi0);
    query_range(cu, cu, D, N, i1, window, &lo1, &hi1);
    spans sp = row_spans(lo0, hi0, lo1, hi1);
    long long qld = (long long)NH * HD, kld = (long long)NKV * HD, col = (long long)g * HD;
    const float sl2 = scale * LOG2E;
    const float *Lh = dl + (long long)h * N, *Dh = dl + ((long long)NH + h) * N;
    float L0 = i0 < N ? Lh[i0] : 0.f, L1 = i1 < N ? Lh[i1] : 0.f;
    float D0 = i0 < N ? Dh[i0] : 0.f, D1 = i1 < N ? Dh[i1] : 0.f;
    int ntiles = sp.bhi < sp.blo ? 0 : (sp.bhi - sp.blo) / BK + 1;
    const wg_copier<HD, WG_ROWS> cp;
    const bf16 *kg = k + col, *vg = v + col;
    cp.load(Qs, q + (long long)h * HD, (int)(qblk * WG_ROWS), (int)(N - 1), (int)qld);
    cp.load(dOs, dout + (long long)h * HD, (int)(qblk * WG_ROWS), (int)(N - 1), (int)qld);
    if (ntiles > 0) {
        cp.load(Ks, kg, sp.blo, sp.bhi, (int)kld);
        cp.load(Vs, vg, sp.blo, sp.bhi, (int)kld);
    }
    cp_commit();
    float acc[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) acc[i] = 0.f;
    const unsigned long long dQ = wg_desc_k(Qs), dO = wg_desc_k(dOs);
    const unsigned long long dK = wg_desc_k(Ks), dV = wg_desc_k(Vs), dKmn = wg_desc_mn<WG_ROWS>(Ks);
    for (int t = 0; t < ntiles; t++) {
        int j0 = sp.blo + t * BK, buf = t & 1;
        cp_wait_all();
        wg_fence_proxy();
        __syncthreads();
        if (t + 1 < ntiles) {
            cp.load(Ks + (buf ^ 1) * TILE, kg, j0 + BK, sp.bhi, (int)kld);
            cp.load(Vs + (buf ^ 1) * TILE, vg, j0 + BK, sp.bhi, (int)kld);
        }
        cp_commit();
        float s[32], dp[32];
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wg_ss_n64(s, wg_kstep<WG_ROWS>(dQ, kk), wg_kstep<WG_ROWS>(wg_desc_plus(dK, buf * TILE), kk), kk > 0);
        wg_commit();  // S in its own group: P is computed while dP is multiplied
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wg_ss_n64(dp, wg_kstep<WG_ROWS>(dO, kk), wg_kstep<WG_ROWS>(wg_desc_plus(dV, buf * TILE), kk), kk > 0);
        wg_commit();
        wg_wait_1();
        wg_hold<32>(s);
        bool full = j0 >= sp.ilo && j0 + BK - 1 <= sp.ihi;
        if (full) wg_probs_rows<false>(s, j0, lane, sl2, L0, L1, lo0, hi0, lo1, hi1);
        else wg_probs_rows<true>(s, j0, lane, sl2, L0, L1, lo0, hi0, lo1, hi1);
        wg_wait_all();
        wg_hold<32>(dp);
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            s[4 * nt + 0] *= dp[4 * nt + 0] - D0;
            s[4 * nt + 1] *= dp[4 * nt + 1] - D0;
            s[4 * nt + 2] *= dp[4 * nt + 2] - D1;
            s[4 * nt + 3] *= dp[4 * nt + 3] - D1;
        }
        unsigned da[4][4];
        wg_pack(da, s);
        wg_hold_u<16>(&da[0][0]);
        wg_hold<HD / 2>(acc);
        wg_fence();
#pragma unroll
        for (int j = 0; j < 4; j++) wg_rs<HD>(acc, da[j], wg_mnstep(wg_desc_plus(dKmn, buf * TILE), j));
        wg_commit();
        wg_wait_all();
        wg_hold<HD / 2>(acc);
    }
    cp_wait_all();
#pragma unroll
    for (int nt = 0; nt < HD / 8; nt++) {
        int c = h * HD + nt * 8 + (lane & 3) * 2;
        if (i0 < N) *(unsigned*)(dq + i0 * qld + c) = pack_bf16(acc[4 * nt + 0] * scale, acc[4 * nt + 1] * scale);
        if (i1 < N) *(unsigned*)(dq + i1 * qld + c) = pack_bf16(acc[4 * nt + 2] * scale, acc[4 * nt + 3] * scale);
    }
}

// attn_bwd_dkv_wg_impl: a block of 64 keys of one key head walks, for each query head of
// its group, the query tiles of 64 that see them: S^T = K Q^T, dP^T = V dO^T,
// dS^T = P^T (dP^T - D), dV += P^T dO, dK += dS^T Q.
// Dynamic shared memory: 1024 + 2 * 64 * HD * 2 (K, V) + 4 * 64 * HD * 2 (Q, dO, two buffers
// each) + 4 * 64 * 4 (lse and D of each query tile, two buffers each).
template <int HD>
__device__ void attn_bwd_dkv_wg_impl(bf16* dk, bf16* dv, const bf16* q, const bf16* k, const bf16* v,
                                     const bf16* dout, const float* dl, const int* cu, int D,
                                     long long N, int NH, int NKV, float scale, int window, const int* order) {
    const int BQ = WG_ROWS, TILE = WG_ROWS * HD * 2;
    extern __shared__ __attribute__((aligned(16))) unsigned char smem[];
    unsigned Ks = wg_tile_base(smem), Vs = Ks + TILE, Qs = Vs + TILE, dOs = Qs + 2 * TILE;
    float* Ls = (float*)(smem + (dOs + 2 * TILE - smem_addr(smem)));  // [2][BQ] lse * log2 e
    float* Ds = Ls + 2 * BQ;                                           // [2][BQ]
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = blockIdx.x % NKV, G = NH / NKV, rank = blockIdx.x / NKV;
    long long krow0 = (long long)(order ? order[rank] : rank) * WG_ROWS;
    long long j0k = krow0 + warp * 16 + (lane >> 2), j1k = j0k + 8;
    int lo0, hi0, lo1, hi1;
    key_range(cu, D, N, j0k, window, &lo0, &hi0);
    key_range(cu, D, N, j1k, window, &lo1, &hi1);
    spans sp = row_spans(lo0, hi0, lo1, hi1);
    long long kld = (long long)NKV * HD, qld = (long long)NH * HD;
    const wg_copier<HD, WG_ROWS> cp;
    cp.load(Ks, k + (long long)g * HD, (int)krow0, (int)(N - 1), (int)kld);
    cp.load(Vs, v + (long long)g * HD, (int)krow0, (int)(N - 1), (int)kld);
    float dka[HD / 2], dva[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) dka[i] = dva[i] = 0.f;
    const float sl2 = scale * LOG2E;
    int ntq = sp.bhi < sp.blo ? 0 : (sp.bhi - sp.blo) / BQ + 1;
    int ntiles = ntq * G;
    // The tiles run over the group's query heads g * G + t / ntq, and in each over the query
    // rows blo + (t % ntq) * BQ; (hn, in0) is the next tile to copy, advanced by counting. Threads
    // 0..63 copy its lse * log2 e values (dl's first half), threads 64..127 its D values (second).
    int hn = g * G, in0 = sp.blo, i0 = sp.blo;
    const unsigned ldst = smem_addr(Ls) + (((threadIdx.x >> 6) * 2 * BQ + (threadIdx.x & 63)) << 2);
    const float* lsrc = dl + (long long)(threadIdx.x >> 6) * NH * N + (threadIdx.x & 63);
    if (ntiles > 0) {
        cp.load(Qs, q + (long long)hn * HD, in0, sp.bhi, (int)qld);
        cp.load(dOs, dout + (long long)hn * HD, in0, sp.bhi, (int)qld);
        bool ok = in0 + (int)(threadIdx.x & 63) <= sp.bhi;
        cp4(ldst, ok ? lsrc + (long long)hn * N + in0 : dl, ok);
        in0 += BQ;
        if (in0 > sp.bhi) in0 = sp.blo, hn++;
    }
    cp_commit();
    const unsigned long long dK = wg_desc_k(Ks), dV = wg_desc_k(Vs);
    const unsigned long long dQk = wg_desc_k(Qs), dOk = wg_desc_k(dOs);
    const unsigned long long dQmn = wg_desc_mn<WG_ROWS>(Qs), dOmn = wg_desc_mn<WG_ROWS>(dOs);
    for (int t = 0; t < ntiles; t++) {
        int buf = t & 1;
        cp_wait_all();
        wg_fence_proxy();
        __syncthreads();
        if (t + 1 < ntiles) {
            cp.load(Qs + (buf ^ 1) * TILE, q + (long long)hn * HD, in0, sp.bhi, (int)qld);
            cp.load(dOs + (buf ^ 1) * TILE, dout + (long long)hn * HD, in0, sp.bhi, (int)qld);
            bool ok = in0 + (int)(threadIdx.x & 63) <= sp.bhi;
            cp4(ldst + (buf ^ 1) * (BQ * 4), ok ? lsrc + (long long)hn * N + in0 : dl, ok);
        }
        cp_commit();
        const float* Lb = Ls + buf * BQ;
        const float* Db = Ds + buf * BQ;
        float s[32], dp[32];
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wg_ss_n64(s, wg_kstep<WG_ROWS>(dK, kk), wg_kstep<WG_ROWS>(wg_desc_plus(dQk, buf * TILE), kk), kk > 0);
        wg_commit();  // S^T in its own group: P^T is computed while dP^T is multiplied
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wg_ss_n64(dp, wg_kstep<WG_ROWS>(dV, kk), wg_kstep<WG_ROWS>(wg_desc_plus(dOk, buf * TILE), kk), kk > 0);
        wg_commit();
        wg_wait_1();
        wg_hold<32>(s);
        bool full = i0 >= sp.ilo && i0 + BQ - 1 <= sp.ihi;
        if (full) wg_probs_cols<false>(s, i0, lane, sl2, Lb, lo0, hi0, lo1, hi1);
        else wg_probs_cols<true>(s, i0, lane, sl2, Lb, lo0, hi0, lo1, hi1);
        unsigned pa[4][4], da[4][4];
        wg_pack(pa, s);
        wg_wait_all();
        wg_hold<32>(dp);
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            wg_f2 Dv = *(const wg_f2*)(Db + nt * 8 + (lane & 3) * 2);  // columns c, c + 1
            dp[4 * nt + 0] = s[4 * nt + 0] * (dp[4 * nt + 0] - Dv.x);
            dp[4 * nt + 1] = s[4 * nt + 1] * (dp[4 * nt + 1] - Dv.y);
            dp[4 * nt + 2] = s[4 * nt + 2] * (dp[4 * nt + 2] - Dv.x);
            dp[4 * nt + 3] = s[4 * nt + 3] * (dp[4 * nt + 3] - Dv.y);
        }
        wg_pack(da, dp);
        wg_hold_u<16>(&da[0][0]);
        wg_hold<HD / 2>(dka);
        wg_hold_u<16>(&pa[0][0]);
        wg_hold<HD / 2>(dva);
        wg_fence();
#pragma unroll
        for (int j = 0; j < 4; j++) wg_rs<HD>(dva, pa[j], wg_mnstep(wg_desc_plus(dOmn, buf * TILE), j));
#pragma unroll
        for (int j = 0; j < 4; j++) wg_rs<HD>(dka, da[j], wg_mnstep(wg_desc_plus(dQmn, buf * TILE), j));
        wg_commit();
        wg_wait_all();
        wg_hold<HD / 2>(dva);
        wg_hold<HD / 2>(dka);
        i0 = in0;
        in0 += BQ;
        if (in0 > sp.bhi) in0 = sp.blo, hn++;
    }
    cp_wait_all();
#pragma unroll
    for (int nt = 0; nt < HD / 8; nt++) {
        int c = g * HD + nt * 8 + (lane & 3) * 2;
        if (j0k < N) {
            *(unsigned*)(dk + j0k * kld + c) = pack_bf16(dka[4 * nt + 0] * scale, dka[4 * nt + 1] * scale);
            *(unsigned*)(dv + j0k * kld + c) = pack_bf16(dva[4 * nt + 0], dva[4 * nt + 1]);
        }
        if (j1k < N) {
            *(unsigned*)(dk + j1k * kld + c) = pack_bf16(dka[4 * nt + 2] * scale, dka[4 * nt + 3] * scale);
            *(unsigned*)(dv + j1k * kld + c) = pack_bf16(dva[4 * nt + 2], dva[4 * nt + 3]);
        }
    }
}

// attn_bwd_dl_wg_impl writes the per-row terms of the backward kernels above, head-major so that
// a query tile's 64 values are contiguous (dK/dV copies them with one cp.async per thread):
// dl[h * N + i] = lse[i, h] * log2 e, dl[(NH + h) * N + i] = D[i, h] = sum_d dout[i, h, d] *
// out[i, h, d] (fp32 sum of the bf16 products). Grid (ceil(N / (256 / (HD / 8))), NH), 256
// threads: HD / 8 threads per row, 16 bytes of each operand per thread.
template <int HD>
__device__ void attn_bwd_dl_wg_impl(float* dl, const bf16* dout, const bf16* out, const float* lse, long long N, int NH) {
    const int TPR = HD / 8;
    int h = blockIdx.y, part = threadIdx.x % TPR;
    long long i = (long long)blockIdx.x * (256 / TPR) + threadIdx.x / TPR;
    float s = 0.f;
    if (i < N) {
        long long e = (i * NH + h) * HD + part * 8;
        wg_u4 a = *(const wg_u4*)(dout + e), b = *(const wg_u4*)(out + e);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            s = fmaf(__uint_as_float(a.u[j] << 16), __uint_as_float(b.u[j] << 16), s);
            s = fmaf(__uint_as_float(a.u[j] & 0xffff0000u), __uint_as_float(b.u[j] & 0xffff0000u), s);
        }
    }
#pragma unroll
    for (int o = TPR / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (i < N && part == 0) {
        dl[(long long)h * N + i] = lse[i * NH + h] * LOG2E;
        dl[((long long)NH + h) * N + i] = s;
    }
}

extern "C" __global__ void __launch_bounds__(256) attn_bwd_dl_wg_64(float* dl, const bf16* dout, const bf16* out, const float* lse, long long N, int NH) {
    attn_bwd_dl_wg_impl<64>(dl, dout, out, lse, N, NH);
}
extern "C" __global__ void __launch_bounds__(256) attn_bwd_dl_wg_128(float* dl, const bf16* dout, const bf16* out, const float* lse, long long N, int NH) {
    attn_bwd_dl_wg_impl<128>(dl, dout, out, lse, N, NH);
}

// Entry points (128 threads each; dynamic shared memory as stated at each implementation), with
// the arguments of attn_fwd_mma, attn_bwd_dq_mma and attn_bwd_dkv_mma: attn_fwd_wg_<HD>[_k<BK>],
// attn_bwd_dq_wg_<HD> and attn_bwd_dkv_wg_<HD>, plus forms whose register budget lets <B> blocks
// share a multiprocessor (suffix _b<B>). attention.go lists them (wgKernels).
#define WG_FWD(HD, BK, SUF, MINB)                                                                                   \
    extern "C" __global__ void __launch_bounds__(128, MINB) attn_fwd_wg_##HD##SUF(                                  \
        bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const int* cu_q, const int* cu_k,       \
        int D, long long N, int NH, int NKV, float scale, int window, const int* order) {                           \
        attn_fwd_wg_impl<HD, BK>(out, lse, q, k, v, cu_q, cu_k, D, N, NH, NKV, scale, window, order);               \
    }
#define WG_DQ(HD, SUF, MINB)                                                                                        \
    extern "C" __global__ void __launch_bounds__(128, MINB) attn_bwd_dq_wg_##HD##SUF(                               \
        bf16* dq, const bf16* q, const bf16* k, const bf16* v, const bf16* dout, const float* dl, const int* cu,     \
        int D, long long N, int NH, int NKV, float scale, int window, const int* order) {                           \
        attn_bwd_dq_wg_impl<HD>(dq, q, k, v, dout, dl, cu, D, N, NH, NKV, scale, window, order);                    \
    }
#define WG_DKV(HD, SUF, MINB)                                                                                       \
    extern "C" __global__ void __launch_bounds__(128, MINB) attn_bwd_dkv_wg_##HD##SUF(                              \
        bf16* dk, bf16* dv, const bf16* q, const bf16* k, const bf16* v, const bf16* dout, const float* dl,         \
        const int* cu, int D, long long N, int NH, int NKV, float scale, int window, const int* order) {            \
        attn_bwd_dkv_wg_impl<HD>(dk, dv, q, k, v, dout, dl, cu, D, N, NH, NKV, scale, window, order);               \
    }
WG_FWD(64, 64, , 1)
WG_FWD(128, 64, , 1)
WG_FWD(64, 128, _k128, 1)
WG_FWD(64, 64, _b4, 4)
WG_FWD(64, 128, _k128_b3, 3)
WG_DQ(64, , 1)
WG_DQ(128, , 1)
WG_DQ(64, _b4, 4)
WG_DKV(64, , 1)
WG_DKV(128, , 1)
WG_DKV(64, _b3, 3)
