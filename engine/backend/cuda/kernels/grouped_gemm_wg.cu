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
//
// The kernels come in variants of one template (gw_tile): BN the tile's columns (128, or 256
// with each warpgroup one m64n256 accumulator of 128 registers a thread), S the shared-memory
// stages, and PIPE the schedule. Without PIPE (the unsuffixed kernels) a warpgroup waits for its
// step's products before the next barrier and the ring runs S - 1 steps ahead. With PIPE a
// warpgroup keeps its last step's products in flight while it waits at the barrier and issues
// the next (wgmma.wait_group 1): the stage a step refills is then the one read two steps back,
// so the ring runs S - 2 steps ahead; the store writes two adjacent columns per instruction.
// Suffixes (kernel names and grouped_gemm.go's groupedWGVariants): _n128 (BN 128, 5 stages),
// _n256 (BN 256, 4 stages, 193 KiB of shared memory), _n128x2 (BN 128, 3 stages, 97 KiB, two
// CTAs a multiprocessor, so that one's prologue and store overlap the other's products).

#define GW_TILE_BYTES 16384 // one operand's stage: 128 x 64 or 64 x 128 bf16
#define GW_STAGES 4
#define GW_THREADS 256
#define GW_BK 64
// Dynamic shared memory: four stages of both operands, plus 1024 bytes to align the first tile
// to the swizzle's 1024-byte period (wg_tile_base).
#define GW_SHARED (2 * GW_STAGES * GW_TILE_BYTES + 1024)

// gw_load_k starts copying a K-major tile: rows [row0, row0 + R) of a row-major bf16 matrix g
// (row stride ld) by columns [col0, col0 + 64), rows >= row_end and columns >= col_end as zeros
// (col_end and ld are multiples of 8, so a 16-byte chunk is wholly inside or outside).
template <int R>
__device__ __forceinline__ void gw_load_k(unsigned base, const bf16* g, long long ld, long long row0, long long row_end,
                                          long long col0, long long col_end) {
#pragma unroll
    for (int it = 0; it < R / 32; it++) {
        int e = threadIdx.x + it * GW_THREADS; // R rows x 8 chunks
        int r = e >> 3, c = e & 7;
        long long row = row0 + r, col = col0 + c * 8;
        bool ok = row < row_end && col < col_end;
        cp16(base + r * 128 + ((c ^ (r & 7)) << 4), g + (ok ? row * ld + col : 0), ok);
    }
}

// gw_load_mn starts copying an MN-major tile: rows [row0, row0 + 64) (the reduction) by columns
// [col0, col0 + C) into C / 64 panels of 64 rows x 128 bytes; out-of-range rows and columns as
// in gw_load_k.
template <int C>
__device__ __forceinline__ void gw_load_mn(unsigned base, const bf16* g, long long ld, long long row0, long long row_end,
                                           long long col0, long long col_end) {
#pragma unroll
    for (int it = 0; it < C / 32; it++) {
        int e = threadIdx.x + it * GW_THREADS; // 64 rows x C / 8 chunks
        int r = e / (C / 8), c = e % (C / 8);
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

// GW_ACC128: the 128 accumulator operands of an m64n256 product, two GW_ACC64 runs.
#define GW_ACC128(d) GW_ACC64(d), GW_ACC64((d + 64))

// GW_MMA_ASM and GW_MMA256_ASM: d (64 x 128 or 64 x 256, fp32) += A . B for one 16-deep slice,
// both operands in shared memory (descriptors da, db; scale-d is true, so it always adds: gw_tile
// zeroes d first); TRANS the transpose flags of A and B ("1" for an MN-major operand).
#define GW_MMA_ASM(TRANS)                                                                                          \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                      \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, " \
                 "%10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, "  \
                 "%29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "   \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, " \
                 "1, " TRANS ";\n}\n"                                                                             \
                 : GW_ACC64(d)                                                                                      \
                 : "l"(da), "l"(db), "r"(1))
#define GW_MMA256_ASM(TRANS)                                                                                       \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                                     \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"                                         \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "  \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "  \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "  \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "  \
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "  \
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "  \
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "  \
                 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "  \
                 "%128, %129, p, 1, 1, " TRANS ";\n}\n"                                                            \
                 : GW_ACC128(d)                                                                                     \
                 : "l"(da), "l"(db), "r"(1))

// gw_mma<BN>::run<TA, TB>: the product of one slice into a 64 x BN accumulator (BN / 2 registers a
// thread); TA and TB say the operand is MN-major (wgmma's transpose flags). A struct per width,
// so that each instantiation holds only the instruction of its width.
template <int BN>
struct gw_mma;
template <>
struct gw_mma<128> {
    template <bool TA, bool TB>
    static __device__ __forceinline__ void run(float* d, unsigned long long da, unsigned long long db) {
        if (TA && TB) GW_MMA_ASM("1, 1");
        else if (TB) GW_MMA_ASM("0, 1");
        else if (TA) GW_MMA_ASM("1, 0");
        else GW_MMA_ASM("0, 0");
    }
};
template <>
struct gw_mma<256> {
    template <bool TA, bool TB>
    static __device__ __forceinline__ void run(float* d, unsigned long long da, unsigned long long db) {
        if (TA && TB) GW_MMA256_ASM("1, 1");
        else if (TB) GW_MMA256_ASM("0, 1");
        else if (TA) GW_MMA256_ASM("1, 0");
        else GW_MMA256_ASM("0, 0");
    }
};
#undef GW_MMA_ASM
#undef GW_MMA256_ASM

// gw_tile computes the CTA's 128 x BN tile of C = A . B^T over the reduction [k0, k_end), in the
// product's terms A [m, k] and B [n, k]: TA says A is stored MN-major (a[k * lda + m]) rather than
// K-major (a[m * lda + k]), TB likewise for B. Rows m0 .. below m_end, columns n0 .. below n_end.
// acc is this thread's share of its warpgroup's 64 x BN accumulator (wgmma.cuh's layout), BN / 2
// registers. S stages of A (128 x 64) and B (BN x 64) tiles; PIPE the schedule of the file's
// header.
template <int BN, int S, bool PIPE, bool TA, bool TB>
__device__ __forceinline__ void gw_tile(float* acc, unsigned sbase, const bf16* a, long long lda, long long m0,
                                        long long m_end, const bf16* b, long long ldb, long long n0, long long n_end,
                                        long long k0, long long k_end) {
    constexpr int NA = BN / 2, BBYTES = BN * 128;
    // The steps the ring runs ahead: without PIPE the stage refilled at step i is the one read
    // at step i - 1 (finished by every warpgroup before the barrier); with PIPE step i - 1 may
    // still run, so the refill takes the stage of step i - 2.
    constexpr int D = PIPE ? S - 2 : S - 1;
#pragma unroll
    for (int i = 0; i < NA; i++) acc[i] = 0.f;
    const int nk = (int)((k_end - k0 + GW_BK - 1) / GW_BK);
    if (nk <= 0) return;
    const unsigned sa = sbase, sb = sbase + S * GW_TILE_BYTES;
    auto load = [&](int st, long long kt) {
        if (TA) gw_load_mn<128>(sa + st * GW_TILE_BYTES, a, lda, kt, k_end, m0, m_end);
        else gw_load_k<128>(sa + st * GW_TILE_BYTES, a, lda, m0, m_end, kt, k_end);
        if (TB) gw_load_mn<BN>(sb + st * BBYTES, b, ldb, kt, k_end, n0, n_end);
        else gw_load_k<BN>(sb + st * BBYTES, b, ldb, n0, n_end, kt, k_end);
    };
    // Warpgroup w's 64 rows of A: rows [64w, 64w + 64) of a K-major tile, or panel w of an
    // MN-major one; both start 64 x 128 bytes in.
    const unsigned aoff = (threadIdx.x >> 7) * (64 * 128);
    // One commit group per step (empty past the last), so that waiting for D - 1 pending
    // groups means "step i has landed".
#pragma unroll
    for (int st = 0; st < D; st++) {
        if (st < nk) load(st, k0 + (long long)st * GW_BK);
        cp_commit();
    }
    for (int i = 0; i < nk; i++) {
        cp_wait_n<D - 1>();
        // The copies are read by wgmma (the async proxy); the barrier also tells every thread
        // that both warpgroups are done with the stage the copy below refills (step i - 1's
        // without PIPE, step i - 2's with it: each warpgroup waited for it last iteration).
        wg_fence_proxy();
        __syncthreads();
        if (i + D < nk) load((i + D) % S, k0 + (long long)(i + D) * GW_BK);
        cp_commit();
        const int st = i % S;
        const unsigned ta = sa + st * GW_TILE_BYTES + aoff, tb = sb + st * BBYTES;
        const unsigned long long da = TA ? wg_desc_mn<64>(ta) : wg_desc_k(ta);
        const unsigned long long db = TB ? wg_desc_mn<64>(tb) : wg_desc_k(tb);
        wg_hold<NA>(acc);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < GW_BK / 16; kk++)
            gw_mma<BN>::template run<TA, TB>(acc, TA ? wg_mnstep(da, kk) : wg_kstep<128>(da, kk), TB ? wg_mnstep(db, kk) : wg_kstep<BN>(db, kk));
        wg_commit();
        if (PIPE) wg_wait_1();
        else wg_wait_all();
        wg_hold<NA>(acc);
    }
    if (PIPE) {
        wg_wait_all();
        wg_hold<NA>(acc);
    }
    cp_wait_n<0>();
}

// gw_store writes the CTA's accumulators into out (row stride ldo, dtype code co): rows m0 ..
// below m_end, columns n0 .. below n_end; with accumulate, adds the old value first (one
// rounding). Without VEC each element is its own access; with VEC the two adjacent columns a
// thread holds are one 8-byte (fp32) or 4-byte (bf16) access, which needs ldo, n_end and n0
// even and out aligned to the pair (the launcher's N_ and K_ are multiples of 8). tid is the
// thread's index among the CTA's two consuming warpgroups (threadIdx.x, or threadIdx.x - 128
// in the TMA kernels, whose first warpgroup loads).
struct __attribute__((aligned(8))) gw_f2 {
    float x, y;
};
template <int BN, bool VEC>
__device__ __forceinline__ void gw_store(void* out, int co, long long ldo, const float* acc, long long m0, long long m_end,
                                         long long n0, long long n_end, int accumulate, int tid) {
    const int lane = tid & 31;
    const long long row0 = m0 + (tid >> 7) * 64 + ((tid >> 5) & 3) * 16 + (lane >> 2);
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            long long row = row0 + h * 8, col = n0 + 8 * j + 2 * (lane & 3);
            if (row >= m_end) continue;
            float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
            long long i = row * ldo + col;
            if (!VEC) {
                if (col < n_end) stf(out, co, i, accumulate ? v0 + ldf(out, co, i) : v0);
                if (col + 1 < n_end) stf(out, co, i + 1, accumulate ? v1 + ldf(out, co, i + 1) : v1);
                continue;
            }
            if (col >= n_end) continue;
            if (co == DT_F32) {
                gw_f2* p = (gw_f2*)((float*)out + i);
                if (accumulate) {
                    gw_f2 o = *p;
                    v0 += o.x;
                    v1 += o.y;
                }
                gw_f2 w;
                w.x = v0;
                w.y = v1;
                *p = w;
            } else {
                unsigned* p = (unsigned*)((bf16*)out + i);
                if (accumulate) {
                    unsigned o = *p;
                    v0 += bf2f((bf16)(o & 0xffffu));
                    v1 += bf2f((bf16)(o >> 16));
                }
                *p = (unsigned)f2bf(v0) | ((unsigned)f2bf(v1) << 16);
            }
        }
}

// The three products of one variant. Forward: out [S, N_] rows of group g = a [S, K_] rows .
// b_g^T, b [G, N_, K_], grid (ceil(N_/BN), ceil(S/128) + G). Input grad: out [S, K_] rows of
// group g = a [S, N_] rows . b_g, grid (ceil(K_/BN), ceil(S/128) + G). Weight grad: out_g
// [N_, K_] = a_g^T . b_g over the rows of group g, a [S, N_] = dY, b [S, K_] = X, grid
// (ceil(K_/BN), ceil(N_/128), G).
// gw_rows is the forward (DX false) or the input grad (DX true): the products whose rows are a
// group's rows. The forward reduces over K_ with B_g [N_, K_] K-major and writes N_ columns; the
// input grad reduces over N_ with B_g MN-major in the product's terms and writes K_ columns.
template <int BN, int S, bool PIPE, bool DX>
__device__ __forceinline__ void gw_rows(unsigned char* smem, void* out, int co, const bf16* a, const bf16* b, const int* off,
                                        int G, int N, int K, int accumulate) {
    __shared__ int sg, sm0, send;
    gg_find_row_tile(off, G, blockIdx.y, &sg, &sm0, &send);
    if (sg < 0) return;
    const long long n0 = (long long)blockIdx.x * BN, cols = DX ? K : N, red = DX ? N : K;
    float acc[BN / 2];
    gw_tile<BN, S, PIPE, false, DX>(acc, wg_tile_base(smem), a, red, sm0, send, b + (long long)sg * N * K, K, n0, cols, 0, red);
    gw_store<BN, PIPE>(out, co, cols, acc, sm0, send, n0, cols, accumulate, threadIdx.x);
}

template <int BN, int S, bool PIPE>
__device__ __forceinline__ void gw_fwd(unsigned char* smem, void* out, int co, const bf16* a, const bf16* b, const int* off,
                                       int G, int N, int K, int accumulate) {
    gw_rows<BN, S, PIPE, false>(smem, out, co, a, b, off, G, N, K, accumulate);
}

template <int BN, int S, bool PIPE>
__device__ __forceinline__ void gw_dx(unsigned char* smem, void* out, int co, const bf16* a, const bf16* b, const int* off,
                                      int G, int N, int K, int accumulate) {
    gw_rows<BN, S, PIPE, true>(smem, out, co, a, b, off, G, N, K, accumulate);
}

template <int BN, int S, bool PIPE>
__device__ __forceinline__ void gw_dw(unsigned char* smem, void* out, int co, const bf16* a, const bf16* b, const int* off,
                                      int G, int N, int K, int accumulate) {
    const int g = blockIdx.z;
    long long m0 = (long long)blockIdx.y * 128, n0 = (long long)blockIdx.x * BN;
    float acc[BN / 2];
    // C [N_, K_] = A [N_, rows] . B [rows, K_]: both stored with the reduction (rows) outermost.
    gw_tile<BN, S, PIPE, true, true>(acc, wg_tile_base(smem), a, N, m0, N, b, K, n0, K, off[g], off[g + 1]);
    gw_store<BN, PIPE>((char*)out + (long long)g * N * K * (co == DT_F32 ? 4 : 2), co, K, acc, m0, N, n0, K, accumulate,
                       threadIdx.x);
}

// GW_KERNEL defines kernel grouped_gemm_wg_KIND SUF running gw_KIND<BN, S, PIPE>, with MINB CTAs
// a multiprocessor in __launch_bounds__; GW_KERNELS the three kinds of one variant. Arguments:
// out (f32 or bf16, dtype code co), a, b (bf16), off [G+1] (the groups' row offsets), G, N_,
// K_, accumulate.
#define GW_KERNEL(KIND, SUF, BN, S, PIPE, MINB)                                                                       \
    extern "C" __global__ void __launch_bounds__(GW_THREADS, MINB) grouped_gemm_wg_##KIND##SUF(                       \
        void* out, int co, const bf16* a, const bf16* b, const int* off, int G, int N, int K, int accumulate) {      \
        extern __shared__ __attribute__((aligned(16))) unsigned char gw_smem[];                                      \
        gw_##KIND<BN, S, PIPE>(gw_smem, out, co, a, b, off, G, N, K, accumulate);                                    \
    }
#define GW_KERNELS(SUF, BN, S, PIPE, MINB)   \
    GW_KERNEL(fwd, SUF, BN, S, PIPE, MINB) \
    GW_KERNEL(dx, SUF, BN, S, PIPE, MINB)  \
    GW_KERNEL(dw, SUF, BN, S, PIPE, MINB)

// Dynamic shared memory of a variant: S stages of a 16 KiB A tile and a BN x 64 B tile, plus
// 1024 bytes to align the first tile to the swizzle's 1024-byte period (wg_tile_base).
// grouped_gemm.go's groupedWGVariants repeats these sizes.
GW_KERNELS(, 128, GW_STAGES, false, 1)   // 4 x 32 KiB + 1 KiB
GW_KERNELS(_n128, 128, 5, true, 1)       // 5 x 32 KiB + 1 KiB
GW_KERNELS(_n256, 256, 4, true, 1)       // 4 x 48 KiB + 1 KiB
GW_KERNELS(_n128x2, 128, 3, true, 2)     // 3 x 32 KiB + 1 KiB

// ---------------------------------------------------------------------------------------------
// The persistent weight gradients (suffixes _p and _p256, grouped_gemm.go's "wg-p" and
// "wg-p256"): a grid of at most MINB CTAs a multiprocessor, each walking the 128 x BN output
// tiles t = blockIdx.x, blockIdx.x + gridDim.x, ... of all groups (t = g * tiles_per_group +
// row tile * column tiles + column tile, so that the CTAs at work at one time share a group's
// rows in L2). The cp.async ring of gw_tile runs over the concatenated reduction steps of the
// CTA's tiles, so the copies of a tile's first steps are in flight while the previous tile
// finishes and stores: a group's reduction is a few hundred rows (a few steps), and a CTA per
// tile would wait out the ring's fill on every tile. Tiles of a group without rows write zeros
// (or keep out, accumulating).

// gw_ptile is output tile t of the persistent weight gradient: its group, first output row (of
// N_) and column (of K_), and its reduction rows [k0, k_end) with nk steps of GW_BK.
struct gw_ptile {
    long long m0, n0, k0, k_end;
    int g, nk;
};
__device__ __forceinline__ gw_ptile gw_ptile_at(long long t, int tn, int per_g, int bn, const int* off) {
    gw_ptile p;
    p.g = (int)(t / per_g);
    const int r = (int)(t % per_g);
    p.m0 = (long long)(r / tn) * 128;
    p.n0 = (long long)(r % tn) * bn;
    p.k0 = off[p.g];
    p.k_end = off[p.g + 1];
    p.nk = (int)((p.k_end - p.k0 + GW_BK - 1) / GW_BK);
    return p;
}

template <int BN, int S>
__device__ __forceinline__ void gw_dw_persist(unsigned char* smem, void* out, int co, const bf16* a, const bf16* b,
                                              const int* off, int G, int N, int K, int accumulate) {
    constexpr int NA = BN / 2, D = S - 1, BBYTES = BN * 128; // the ring runs S - 1 steps ahead (gw_tile without PIPE)
    const int tn = (K + BN - 1) / BN, per_g = ((N + 127) / 128) * tn;
    const long long total = (long long)G * per_g, step = gridDim.x;
    const unsigned sa = wg_tile_base(smem), sb = sa + S * GW_TILE_BYTES;
    const unsigned aoff = (threadIdx.x >> 7) * (64 * 128);
    const long long esize = co == DT_F32 ? 4 : 2;
    // The loading cursor: tile lt (lp) and its step lk, always at a step that exists or past
    // the CTA's last tile (lt >= total).
    long long lt = blockIdx.x;
    int lk = 0;
    gw_ptile lp;
    if (lt < total) lp = gw_ptile_at(lt, tn, per_g, BN, off);
    while (lt < total && lp.nk == 0) {
        lt += step;
        if (lt < total) lp = gw_ptile_at(lt, tn, per_g, BN, off);
    }
    auto load_next = [&](int st) {
        if (lt >= total) return;
        const long long kt = lp.k0 + (long long)lk * GW_BK;
        gw_load_mn<128>(sa + st * GW_TILE_BYTES, a, N, kt, lp.k_end, lp.m0, N);
        gw_load_mn<BN>(sb + st * BBYTES, b, K, kt, lp.k_end, lp.n0, K);
        if (++lk < lp.nk) return;
        lk = 0;
        do {
            lt += step;
            if (lt < total) lp = gw_ptile_at(lt, tn, per_g, BN, off);
        } while (lt < total && lp.nk == 0);
    };
#pragma unroll
    for (int st = 0; st < D; st++) {
        load_next(st);
        cp_commit();
    }
    float acc[NA];
#pragma unroll
    for (int i = 0; i < NA; i++) acc[i] = 0.f;
    int i = 0; // steps consumed so far: the stage of the next one is i % S
    for (long long ct = blockIdx.x; ct < total; ct += step) {
        const gw_ptile cp = gw_ptile_at(ct, tn, per_g, BN, off);
        char* o = (char*)out + (long long)cp.g * N * K * esize;
        if (cp.nk == 0) {
            if (!accumulate) gw_store<BN, true>(o, co, K, acc, cp.m0, N, cp.n0, K, 0, threadIdx.x);
            continue;
        }
        for (int k = 0; k < cp.nk; k++, i++) {
            cp_wait_n<D - 1>();
            wg_fence_proxy();
            __syncthreads();
            load_next((i + D) % S);
            cp_commit();
            const int st = i % S;
            const unsigned long long da = wg_desc_mn<64>(sa + st * GW_TILE_BYTES + aoff);
            const unsigned long long db = wg_desc_mn<64>(sb + st * BBYTES);
            wg_hold<NA>(acc);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < GW_BK / 16; kk++)
                gw_mma<BN>::template run<true, true>(acc, wg_mnstep(da, kk), wg_mnstep(db, kk));
            wg_commit();
            wg_wait_all();
            wg_hold<NA>(acc);
        }
        gw_store<BN, true>(o, co, K, acc, cp.m0, N, cp.n0, K, accumulate, threadIdx.x);
#pragma unroll
        for (int j = 0; j < NA; j++) acc[j] = 0.f;
    }
    cp_wait_n<0>();
}

// GW_DW_PERSIST defines the persistent weight gradient grouped_gemm_wg_dw SUF: BN-column
// tiles in S stages, MINB CTAs a multiprocessor (grouped_gemm.go's persistentGrid launches that
// many a multiprocessor).
#define GW_DW_PERSIST(SUF, BN, S, MINB)                                                                              \
    extern "C" __global__ void __launch_bounds__(GW_THREADS, MINB) grouped_gemm_wg_dw##SUF(                          \
        void* out, int co, const bf16* a, const bf16* b, const int* off, int G, int N, int K, int accumulate) {     \
        extern __shared__ __attribute__((aligned(16))) unsigned char gw_smem[];                                     \
        gw_dw_persist<BN, S>(gw_smem, out, co, a, b, off, G, N, K, accumulate);                                     \
    }
// Dynamic shared memory: S stages of a 16 KiB A tile and a BN x 64 B tile, plus 1 KiB
// (wgShared(S, BN)). _p: 128-column tiles, 3 stages, two CTAs a multiprocessor, the forward
// and input grad of _n128x2; _p256: 256-column tiles, 4 stages, one CTA a multiprocessor, the
// forward and input grad of _n256 (the larger tile reads 25% fewer operand bytes per product,
// and with a weight gradient written (=) rather than accumulated its store waits for no load).
GW_KERNEL(fwd, _p, 128, 3, true, 2)
GW_KERNEL(dx, _p, 128, 3, true, 2)
GW_DW_PERSIST(_p, 128, 3, 2)
GW_KERNEL(fwd, _p256, 256, 4, true, 1)
GW_KERNEL(dx, _p256, 256, 4, true, 1)
GW_DW_PERSIST(_p256, 256, 4, 1)

// ---------------------------------------------------------------------------------------------
// The TMA variant (suffix _tma, grouped_gemm.go's "wg-tma"): 384 threads, of which the first
// warpgroup loads and the other two multiply, 128 x 256 tiles in four stages. Thread 0 fills
// the stages with the tensor memory accelerator (cp.async.bulk.tensor): each TMA copies one box
// of a tensor map that the host encoded for the product (grouped_gemm.go's groupedTMAMaps) into
// the 128-byte swizzled layout of wgmma.cuh, zeros past the tensor's bounds, and counts its
// bytes on the stage's "full" mbarrier. A consuming warpgroup waits on "full", issues the
// step's wgmmas, keeps them in flight while it waits for the previous step's, and then arrives
// on that step's "empty" mbarrier, which the loader waits on before it refills the stage: no
// CTA-wide barrier inside the loop, and the loads run four steps ahead of the products.
//
// Bounds: the weights are 3-D maps [G, N_, K_], so a box never reads another expert's rows.
// The row-stacked operands are 2-D maps over all S rows: rows past a group's end are the next
// group's. In the forward and input grad they only reach output rows that the store masks; in
// the weight grad they would enter the reduction, so the consumers zero those rows of the last
// step's stage before its products.

#define GW_TMA_STAGES 4
#define GW_TMA_THREADS 384

struct __attribute__((aligned(64))) gw_tmap {
    unsigned long long v[16]; // CUtensorMap, opaque
};

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// mbar_fence_init makes the initialised mbarriers visible to the async proxy (the TMA unit).
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// mbar_expect_tx arrives on bar and adds bytes to the transactions its phase waits for.
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// mbar_wait returns once the phase of bar with the given parity has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    unsigned done = 0;
    while (!done) {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    }
}
// tma_2d and tma_3d copy the box of map at coordinates (innermost first) into shared memory at
// dst, completing their bytes on bar.
__device__ __forceinline__ void tma_2d(unsigned dst, const gw_tmap* map, int c0, int c1, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}
__device__ __forceinline__ void tma_3d(unsigned dst, const gw_tmap* map, int c0, int c1, int c2, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
        "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
}
__device__ __forceinline__ void st_shared_zero16(unsigned addr) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
}
// gw_consumers_sync is a barrier of the two consuming warpgroups only (barrier 1; the loading
// warpgroup has exited by then).
__device__ __forceinline__ void gw_consumers_sync() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }

// gw_tma_body is one product of the TMA variant; KIND 0 the forward, 1 the input grad, 2 the
// weight grad, with the grids and operands of gw_fwd, gw_dx and gw_dw. The maps (boxes of 64
// bf16 along the innermost dimension): forward A = X [S, K_] (box 64 x 128) and B = W [G, N_,
// K_] (box 64 x 256 x 1); input grad A = dY [S, N_] (64 x 128) and B = W (64 x 64 x 1, one
// panel of the MN-major tile per copy); weight grad A = dY (64 x 64) and B = X (64 x 64).
template <int KIND>
__device__ __forceinline__ void gw_tma_body(const gw_tmap* ma, const gw_tmap* mb, unsigned char* smem, void* out, int co,
                                            const int* off, int G, int N, int K, int accumulate) {
    constexpr int S = GW_TMA_STAGES, BN = 256, NA = BN / 2;
    constexpr unsigned ABYTES = GW_TILE_BYTES, BBYTES = BN * 128, PANEL = 64 * 128;
    constexpr bool TA = KIND == 2, TB = KIND != 0;
    __shared__ unsigned long long full[S], empty[S];
    __shared__ int sg, sm0, send;
    int g;
    long long m0, m_end, n_end, k0, k_end;
    const long long n0 = (long long)blockIdx.x * BN;
    if (KIND == 2) {
        g = blockIdx.z;
        m0 = (long long)blockIdx.y * 128, m_end = N, n_end = K, k0 = off[g], k_end = off[g + 1];
    } else {
        gg_find_row_tile(off, G, blockIdx.y, &sg, &sm0, &send);
        if (sg < 0) return;
        g = sg, m0 = sm0, m_end = send, n_end = KIND == 0 ? N : K, k0 = 0, k_end = KIND == 0 ? K : N;
    }
    const unsigned sa = wg_tile_base(smem), sb = sa + S * ABYTES;
    const unsigned bfull = smem_addr(&full[0]), bempty = smem_addr(&empty[0]);
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) {
            mbar_init(bfull + 8 * s, 1);
            mbar_init(bempty + 8 * s, 2); // one arrival per consuming warpgroup
        }
        mbar_fence_init();
    }
    __syncthreads();
    const int nk = (int)((k_end - k0 + GW_BK - 1) / GW_BK);
    if (threadIdx.x < 128) {
        if (threadIdx.x != 0) return;
        for (int i = 0; i < nk; i++) {
            const int s = i % S;
            if (i >= S) mbar_wait(bempty + 8 * s, ((i / S) - 1) & 1);
            const unsigned fb = bfull + 8 * s, da = sa + s * ABYTES, db = sb + s * BBYTES;
            const int kt = (int)(k0 + (long long)i * GW_BK);
            mbar_expect_tx(fb, ABYTES + BBYTES);
            if (KIND == 0) {
                tma_2d(da, ma, kt, (int)m0, fb);
                tma_3d(db, mb, kt, (int)n0, g, fb);
            } else if (KIND == 1) {
                tma_2d(da, ma, kt, (int)m0, fb);
                for (int p = 0; p < BN / 64; p++) tma_3d(db + p * PANEL, mb, (int)n0 + 64 * p, kt, g, fb);
            } else {
                for (int p = 0; p < 2; p++) tma_2d(da + p * PANEL, ma, (int)m0 + 64 * p, kt, fb);
                for (int p = 0; p < BN / 64; p++) tma_2d(db + p * PANEL, mb, (int)n0 + 64 * p, kt, fb);
            }
        }
        return;
    }
    const int ct = threadIdx.x - 128, cw = ct >> 7;
    float acc[NA];
#pragma unroll
    for (int i = 0; i < NA; i++) acc[i] = 0.f;
    for (int i = 0; i < nk; i++) {
        const int s = i % S;
        mbar_wait(bfull + 8 * s, (i / S) & 1);
        if (KIND == 2) {
            const int rem = (int)(k_end - (k0 + (long long)i * GW_BK));
            if (rem < GW_BK) {
                // The last step of a group that does not fill it: zero the next group's rows
                // [rem, 64) of the A panels (2) and B panels (4), 128 bytes a row each.
                const int rows = GW_BK - rem, chunks = 6 * rows * 8;
                for (int e = ct; e < chunks; e += 256) {
                    const int pnl = e / (rows * 8), r = rem + (e >> 3) % rows, c = e & 7;
                    const unsigned tile = pnl < 2 ? sa + s * ABYTES + pnl * PANEL : sb + s * BBYTES + (pnl - 2) * PANEL;
                    st_shared_zero16(tile + r * 128 + c * 16);
                }
                wg_fence_proxy();
                gw_consumers_sync();
            }
        }
        const unsigned ta = sa + s * ABYTES + cw * PANEL, tb = sb + s * BBYTES;
        const unsigned long long da = TA ? wg_desc_mn<64>(ta) : wg_desc_k(ta);
        const unsigned long long db = TB ? wg_desc_mn<64>(tb) : wg_desc_k(tb);
        wg_hold<NA>(acc);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < GW_BK / 16; kk++)
            gw_mma<BN>::template run<TA, TB>(acc, TA ? wg_mnstep(da, kk) : wg_kstep<128>(da, kk), TB ? wg_mnstep(db, kk) : wg_kstep<BN>(db, kk));
        wg_commit();
        wg_wait_1();
        wg_hold<NA>(acc);
        // Step i - 1's products are done: its stage may be refilled.
        if (i > 0 && (ct & 127) == 0) mbar_arrive(bempty + 8 * ((i - 1) % S));
    }
    wg_wait_all();
    wg_hold<NA>(acc);
    if (KIND == 0) gw_store<BN, true>(out, co, N, acc, m0, m_end, n0, n_end, accumulate, ct);
    else if (KIND == 1) gw_store<BN, true>(out, co, K, acc, m0, m_end, n0, n_end, accumulate, ct);
    else gw_store<BN, true>((char*)out + (long long)g * N * K * (co == DT_F32 ? 4 : 2), co, K, acc, m0, m_end, n0, n_end, accumulate, ct);
}

// The TMA kernels: the two tensor maps by value (__grid_constant__, so that their parameter-space
// address is what the TMA reads), then the other kernels' arguments less a and b. Dynamic shared
// memory: four stages of 16 + 32 KiB and 1 KiB for alignment.
#define GW_TMA_KERNEL(NAME, KIND)                                                                                      \
    extern "C" __global__ void __launch_bounds__(GW_TMA_THREADS, 1)                                                     \
        NAME(const __grid_constant__ gw_tmap ma, const __grid_constant__ gw_tmap mb, void* out, int co, const int* off, \
             int G, int N, int K, int accumulate) {                                                                     \
        extern __shared__ __attribute__((aligned(16))) unsigned char gw_smem[];                                         \
        gw_tma_body<KIND>(&ma, &mb, gw_smem, out, co, off, G, N, K, accumulate);                                        \
    }
GW_TMA_KERNEL(grouped_gemm_wg_fwd_tma, 0)
GW_TMA_KERNEL(grouped_gemm_wg_dx_tma, 1)
GW_TMA_KERNEL(grouped_gemm_wg_dw_tma, 2)
