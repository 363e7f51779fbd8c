// grouped_gemm_wg.cu: the grouped expert products of grouped_gemm.cu on Hopper's warpgroup MMAs
// (wgmma), for sm_90a only (kernels.go). Same kinds, contract and launch grids as the mma.sync
// kernels there (read its header for the letters and the three products: out (=), or with
// accumulate = 1 out (+=), one rounding); prepended with attention_mma.cuh (cp.async),
// wgmma.cuh (descriptors, products, swizzled layout) and grouped.cuh (row-tile search).
//
// A CTA is two warpgroups (256 threads) that own a 128 x 128 output tile, warpgroup w its rows
// [64w, 64w + 64) as one m64n128 fp32 accumulator (64 registers a thread). The reduction runs in
// steps of 64 through a ring of four shared-memory stages filled by cp.async, so that the copies
// of steps i+1 .. i+3 overlap the products of step i; each step is four m64n128k16 wgmmas per
// warpgroup with both operands read from shared memory through descriptors. Operand tiles are
// stored in wgmma.cuh's 128-byte swizzle: a K-major tile (the reduction contiguous: A of the
// forward and input grad, B of the forward) is 128 rows x 64 columns; an MN-major tile (the
// output dimension contiguous: B of the input grad, both operands of the weight grad) is 64
// reduction rows x 128 columns, two panels, read with wgmma's transpose flag. Rows past a
// group's end and columns past the reduction's end are copied as zeros, so partial tiles need
// no masking in the products; the store masks rows and columns. Every output element is
// written by one thread: no atomics, deterministic results.

#define GW_TILE_BYTES 16384 // one operand's stage: 128 x 64 or 64 x 128 bf16
#define GW_STAGES 4
#define GW_THREADS 256
#define GW_BK 64
// Dynamic shared memory: four stages of both operands, plus 1024 bytes to align the first tile
// to the swizzle's 1024-byte period (wg_tile_base).
#define GW_SHARED (2 * GW_STAGES * GW_TILE_BYTES + 1024)

// gw_load_k starts copying a K-major tile: rows [row0, row0 + 128) of a row-major bf16 matrix g
// (row stride ld) by columns [col0, col0 + 64), rows >= row_end and columns >= col_end as zeros
// (col_end and ld are multiples of 8, so a 16-byte chunk is wholly inside or outside).
__device__ __forceinline__ void gw_load_k(unsigned base, const bf16* g, long long ld, long long row0, long long row_end,
                                          long long col0, long long col_end) {
#pragma unroll
    for (int it = 0; it < 4; it++) {
        int e = threadIdx.x + it * GW_THREADS; // 1024 chunks: 128 rows x 8
        int r = e >> 3, c = e & 7;
        long long row = row0 + r, col = col0 + c * 8;
        bool ok = row < row_end && col < col_end;
        cp16(base + r * 128 + ((c ^ (r & 7)) << 4), g + (ok ? row * ld + col : 0), ok);
    }
}

// gw_load_mn starts copying an MN-major tile: rows [row0, row0 + 64) (the reduction) by columns
// [col0, col0 + 128) into two panels of 64 rows x 128 bytes; out-of-range rows and columns as
// in gw_load_k.
__device__ __forceinline__ void gw_load_mn(unsigned base, const bf16* g, long long ld, long long row0, long long row_end,
                                           long long col0, long long col_end) {
#pragma unroll
    for (int it = 0; it < 4; it++) {
        int e = threadIdx.x + it * GW_THREADS; // 1024 chunks: 64 rows x 16
        int r = e >> 4, c = e & 15;
        long long row = row0 + r, col = col0 + c * 8;
        bool ok = row < row_end && col < col_end;
        cp16(base + (c >> 3) * (64 * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4), g + (ok ? row * ld + col : 0), ok);
    }
}

#define GW_ACC64(d)                                                                                            \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),             \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),   \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// gw_mma: d (64 x 128, fp32) += A . B for one 16-deep slice, both operands in shared memory
// (descriptors da, db; scale-d is true, so it always adds: gw_tile zeroes d first); TA and TB
// say the operand is MN-major (wgmma's transpose flags).
template <bool TA, bool TB>
__device__ __forceinline__ void gw_mma(float* d, unsigned long long da, unsigned long long db) {
#define GW_MMA_ASM(TRANS)                                                                                          \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                      \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, " \
                 "%10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, "  \
                 "%29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "   \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, " \
                 "1, " TRANS ";\n}\n"                                                                             \
                 : GW_ACC64(d)                                                                                      \
                 : "l"(da), "l"(db), "r"(1))
    if (TA && TB) GW_MMA_ASM("1, 1");
    else if (TB) GW_MMA_ASM("0, 1");
    else if (TA) GW_MMA_ASM("1, 0");
    else GW_MMA_ASM("0, 0");
#undef GW_MMA_ASM
}

// gw_tile computes the CTA's 128 x 128 tile of C = A . B^T over the reduction [k0, k_end), in the
// product's terms A [m, k] and B [n, k]: TA says A is stored MN-major (a[k * lda + m]) rather than
// K-major (a[m * lda + k]), TB likewise for B. Rows m0 .. below m_end, columns n0 .. below n_end.
// acc is this thread's share of its warpgroup's 64 x 128 accumulator (wgmma.cuh's layout).
template <bool TA, bool TB>
__device__ __forceinline__ void gw_tile(float* acc, unsigned sbase, const bf16* a, long long lda, long long m0,
                                        long long m_end, const bf16* b, long long ldb, long long n0, long long n_end,
                                        long long k0, long long k_end) {
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.f;
    const int nk = (int)((k_end - k0 + GW_BK - 1) / GW_BK);
    if (nk <= 0) return;
    const unsigned sa = sbase, sb = sbase + GW_STAGES * GW_TILE_BYTES;
    auto load = [&](int st, long long kt) {
        if (TA) gw_load_mn(sa + st * GW_TILE_BYTES, a, lda, kt, k_end, m0, m_end);
        else gw_load_k(sa + st * GW_TILE_BYTES, a, lda, m0, m_end, kt, k_end);
        if (TB) gw_load_mn(sb + st * GW_TILE_BYTES, b, ldb, kt, k_end, n0, n_end);
        else gw_load_k(sb + st * GW_TILE_BYTES, b, ldb, n0, n_end, kt, k_end);
    };
    // Warpgroup w's 64 rows of A: rows [64w, 64w + 64) of a K-major tile, or panel w of an
    // MN-major one; both start 64 x 128 bytes in.
    const unsigned aoff = (threadIdx.x >> 7) * (64 * 128);
    // One commit group per step (empty past the last), so that waiting for GW_STAGES - 2
    // pending groups means "step i has landed".
#pragma unroll
    for (int st = 0; st < GW_STAGES - 1; st++) {
        if (st < nk) load(st, k0 + (long long)st * GW_BK);
        cp_commit();
    }
    for (int i = 0; i < nk; i++) {
        cp_wait_n<GW_STAGES - 2>();
        // The copies are read by wgmma (the async proxy); the barrier also tells every thread
        // that both warpgroups are done with step i - 1, whose stage the copy below refills.
        wg_fence_proxy();
        __syncthreads();
        if (i + GW_STAGES - 1 < nk) load((i + GW_STAGES - 1) % GW_STAGES, k0 + (long long)(i + GW_STAGES - 1) * GW_BK);
        cp_commit();
        const int st = i % GW_STAGES;
        const unsigned ta = sa + st * GW_TILE_BYTES + aoff, tb = sb + st * GW_TILE_BYTES;
        const unsigned long long da = TA ? wg_desc_mn<64>(ta) : wg_desc_k(ta);
        const unsigned long long db = TB ? wg_desc_mn<64>(tb) : wg_desc_k(tb);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < GW_BK / 16; kk++)
            gw_mma<TA, TB>(acc, TA ? wg_mnstep(da, kk) : wg_kstep<128>(da, kk), TB ? wg_mnstep(db, kk) : wg_kstep<128>(db, kk));
        wg_commit();
        wg_wait_all();
        wg_hold<64>(acc);
    }
    cp_wait_n<0>();
}

// gw_store writes the CTA's accumulators into out (row stride ldo, dtype code co): rows m0 ..
// below m_end, columns n0 .. below n_end; with accumulate, adds the old value first (one
// rounding).
__device__ __forceinline__ void gw_store(void* out, int co, long long ldo, const float* acc, long long m0, long long m_end,
                                         long long n0, long long n_end, int accumulate) {
    const int lane = threadIdx.x & 31;
    const long long row0 = m0 + (threadIdx.x >> 7) * 64 + ((threadIdx.x >> 5) & 3) * 16 + (lane >> 2);
#pragma unroll
    for (int j = 0; j < 16; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            long long row = row0 + (e >> 1) * 8, col = n0 + 8 * j + 2 * (lane & 3) + (e & 1);
            if (row >= m_end || col >= n_end) continue;
            long long i = row * ldo + col;
            float v = acc[4 * j + e];
            if (accumulate) v += ldf(out, co, i);
            stf(out, co, i, v);
        }
}

// Forward: out [S, N_] rows of group g = a [S, K_] rows . b_g^T, b [G, N_, K_]. Grid
// (ceil(N_/128), ceil(S/128) + G).
extern "C" __global__ void __launch_bounds__(GW_THREADS, 1) grouped_gemm_wg_fwd(
    void* out, int co,        // [S, N_] f32 or bf16
    const bf16* a,            // [S, K_]
    const bf16* b,            // [G, N_, K_]
    const int* off,           // [G+1]
    int G, int N, int K, int accumulate) {
    extern __shared__ __attribute__((aligned(16))) unsigned char gw_smem[]; // GW_SHARED bytes
    __shared__ int sg, sm0, send;
    gg_find_row_tile(off, G, blockIdx.y, &sg, &sm0, &send);
    if (sg < 0) return;
    long long n0 = (long long)blockIdx.x * 128;
    float acc[64];
    gw_tile<false, false>(acc, wg_tile_base(gw_smem), a, K, sm0, send, b + (long long)sg * N * K, K, n0, N, 0, K);
    gw_store(out, co, N, acc, sm0, send, n0, N, accumulate);
}

// Input grad: out [S, K_] rows of group g = a [S, N_] rows . b_g, b [G, N_, K_]. Grid
// (ceil(K_/128), ceil(S/128) + G).
extern "C" __global__ void __launch_bounds__(GW_THREADS, 1) grouped_gemm_wg_dx(
    void* out, int co,        // [S, K_] f32 or bf16
    const bf16* a,            // [S, N_] = dY
    const bf16* b,            // [G, N_, K_]
    const int* off,           // [G+1]
    int G, int N, int K, int accumulate) {
    extern __shared__ __attribute__((aligned(16))) unsigned char gw_smem[]; // GW_SHARED bytes
    __shared__ int sg, sm0, send;
    gg_find_row_tile(off, G, blockIdx.y, &sg, &sm0, &send);
    if (sg < 0) return;
    long long n0 = (long long)blockIdx.x * 128;
    float acc[64];
    // C [rows, K_] = A [rows, N_] . B_g [N_, K_]: B is MN-major in the product's terms.
    gw_tile<false, true>(acc, wg_tile_base(gw_smem), a, N, sm0, send, b + (long long)sg * N * K, K, n0, K, 0, N);
    gw_store(out, co, K, acc, sm0, send, n0, K, accumulate);
}

// Weight grad: out_g [N_, K_] = a_g^T . b_g over the rows of group g, a [S, N_] = dY, b [S, K_] =
// X. Grid (ceil(K_/128), ceil(N_/128), G).
extern "C" __global__ void __launch_bounds__(GW_THREADS, 1) grouped_gemm_wg_dw(
    void* out, int co,        // [G, N_, K_] f32 or bf16
    const bf16* a,            // [S, N_] = dY
    const bf16* b,            // [S, K_] = X
    const int* off,           // [G+1]
    int G, int N, int K, int accumulate) {
    extern __shared__ __attribute__((aligned(16))) unsigned char gw_smem[]; // GW_SHARED bytes
    const int g = blockIdx.z;
    long long m0 = (long long)blockIdx.y * 128, n0 = (long long)blockIdx.x * 128;
    float acc[64];
    // C [N_, K_] = A [N_, rows] . B [rows, K_]: both stored with the reduction (rows) outermost.
    gw_tile<true, true>(acc, wg_tile_base(gw_smem), a, N, m0, N, b, K, n0, K, off[g], off[g + 1]);
    gw_store((char*)out + (long long)g * N * K * (co == DT_F32 ? 4 : 2), co, K, acc, m0, N, n0, K, accumulate);
}
