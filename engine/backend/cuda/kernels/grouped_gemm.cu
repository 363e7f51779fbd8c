// grouped_gemm.cu: the grouped expert products of a mixture-of-experts layer
// (backend.Optional.GroupedGEMM, engine/backend/moe.go). Prepended with attention_mma.cuh for the
// mma.sync, ldmatrix and cp.async helpers and grouped.cuh for the row-tile search (kernels.go).
//
// Letters: G groups (experts), S rows of the row-stacked operands (routed slots, sorted by group),
// N_ and K_ the sizes of one group's weight B_g [N_, K_]. off [G+1] i32 gives group g the rows
// [off[g], off[g+1]); it is read here, on the device, and never on the host.
//
//   forward     (kind 0): out[r, :] = a[r, :] · b_g^T     a [S, K_], b [G, N_, K_], out [S, N_]
//   input grad  (kind 1): out[r, :] = a[r, :] · b_g       a [S, N_] = dY, b [G, N_, K_], out [S, K_] = dX
//   weight grad (kind 2): out_g = a_g^T · b_g             a [S, N_] = dY, b [S, K_] = X, out [G, N_, K_] = dW
//
// The three are the forward of y = x · W_g^T and its two gradients: dX = dY · W_g, and
// dW_g = dY_g^T · X_g summed over the group's rows (an empty group gives zeros). Products
// accumulate in fp32 registers; out (=), or with accumulate = 1 out (+=): the old value read in
// fp32, the sum rounded once into out's dtype. No atomics: every output element is written by one thread,
// so results are deterministic. Nothing of size [S, ...] is materialised beyond the operands.
//
// Two implementations:
//   grouped_gemm_mma_{fwd,dx,dw}: bf16 operands (rows 16-byte aligned: every leading dimension
//     a multiple of 8), out f32 or bf16. CTA tiles of 128 x 128 outputs, 8 warps of 64 x 32, the
//     reduction in steps of 32 through a ring of four shared-memory buffers filled by cp.async
//     (the copies of steps i+1 .. i+3 overlap the products of step i), products by mma.sync
//     m16n8k16 with operands out of shared memory by ldmatrix (.trans where the operand's
//     contiguous dimension is not the reduction). Runs on every arch from sm_80.
//     Row kinds: blockIdx.y is a row tile of the concatenation of per-group tiles (group g has
//     ceil(M_g / 128) of them); the launcher sizes the grid for the bound ceil(S / 128) + G, and
//     each CTA finds its group with a warp prefix sum over off, exiting when it has none.
//     Weight grad: blockIdx.z is the group, each CTA reduces over all of the group's rows.
//   grouped_gemm_simt: any mix of f32 and bf16, any alignment; one thread per output element.
//     The fallback for what the mma kernels do not take.

#define GG_BM 128
static_assert(GG_BM == GG_ROWS, "a row tile is grouped.cuh's GG_ROWS rows");
#define GG_BN 128
#define GG_BK 32
#define GG_THREADS 256
#define GG_STAGES 4
// Shared-memory elements of one operand's buffer: a K-major tile [128][32+8] or a tile of the
// other layout [32][128+8], whichever is larger (row strides of 16 bytes past a multiple of 64
// keep the eight rows of one ldmatrix in distinct banks).
#define GG_TILE_ELEMS (GG_BM * (GG_BK + 8))
// Dynamic shared memory of the mma kernels: GG_STAGES buffers of each operand (80 KiB; two CTAs
// fit on an sm_80 or later multiprocessor).
#define GG_SHARED (2 * GG_STAGES * GG_TILE_ELEMS * 2)

// gg_load starts copying an R x CC tile of a row-major bf16 matrix g (row stride ld elements) at
// (row0, col0) into sm with row stride CC + 8; rows >= row_end or columns >= col_end read as zero.
// col_end and ld are multiples of 8, so a 16-byte chunk is wholly inside or wholly outside.
template <int R, int CC>
__device__ __forceinline__ void gg_load(bf16* sm, const bf16* g, long long ld, long long row0, long long row_end,
                                        long long col0, long long col_end) {
    const int CH = CC / 8;
#pragma unroll
    for (int it = 0; it < R * CH / GG_THREADS; it++) {
        int e = threadIdx.x + it * GG_THREADS;
        int r = e / CH, c = (e % CH) * 8;
        long long row = row0 + r, col = col0 + c;
        bool ok = row < row_end && col < col_end;
        cp16(smem_addr(sm + r * (CC + 8) + c), g + (ok ? row * ld + col : 0), ok);
    }
}

// gg_tile computes one CTA's 128 x 128 tile of C = A · B^T over the reduction range [k0, k_end):
// A [m, k] and B [n, k] in the product's terms. AK says A is stored K-major (a[m * lda + k], rows
// m0.., bounded by a_row_end) or else M-major (a[k * lda + m], bounded by k_end and a_col_end);
// BK likewise for B (b[n * ldb + k], or b[k * ldb + n]). Each warp's 64 x 32 accumulators are
// acc[mtile][ntile][4] in the mma.sync C-fragment layout.
template <bool AK, bool BKM>
__device__ __forceinline__ void gg_tile(float (*acc)[4][4], bf16* sa, bf16* sb,
                                        const bf16* a, long long lda, long long m0, long long m_end,
                                        const bf16* b, long long ldb, long long n0, long long n_end,
                                        long long k0, long long k_end) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[i][j][q] = 0.f;
    const int nk = (int)((k_end - k0 + GG_BK - 1) / GG_BK);
    if (nk <= 0) return;
    auto load = [&](int stage, long long kt) {
        bf16* da = sa + stage * GG_TILE_ELEMS;
        bf16* db = sb + stage * GG_TILE_ELEMS;
        if (AK) gg_load<GG_BM, GG_BK>(da, a, lda, m0, m_end, kt, k_end);
        else gg_load<GG_BK, GG_BM>(da, a, lda, kt, k_end, m0, m_end);
        if (BKM) gg_load<GG_BN, GG_BK>(db, b, ldb, n0, n_end, kt, k_end);
        else gg_load<GG_BK, GG_BN>(db, b, ldb, kt, k_end, n0, n_end);
    };
    // Stages 0 .. GG_STAGES-2 in flight before the first product; one commit group per step
    // (empty past the last tile) so that wait_group GG_STAGES-2 always means "step i landed".
#pragma unroll
    for (int st = 0; st < GG_STAGES - 1; st++) {
        if (st < nk) load(st, k0 + (long long)st * GG_BK);
        cp_commit();
    }
    for (int i = 0; i < nk; i++) {
        cp_wait_n<GG_STAGES - 2>();
        // Step i is in shared memory for every thread, and every warp is done with step i-1,
        // whose buffer the copy below refills.
        __syncthreads();
        if (i + GG_STAGES - 1 < nk) load((i + GG_STAGES - 1) % GG_STAGES, k0 + (long long)(i + GG_STAGES - 1) * GG_BK);
        cp_commit();
        const bf16* ca = sa + (i % GG_STAGES) * GG_TILE_ELEMS;
        const bf16* cb = sb + (i % GG_STAGES) * GG_TILE_ELEMS;
#pragma unroll
        for (int kk = 0; kk < GG_BK; kk += 16) {
            unsigned af[4][4], bfr[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; mi++) {
                int m = wm + mi * 16;
                if (AK) ldsm4(af[mi], smem_addr(ca + (m + (lane & 15)) * (GG_BK + 8) + kk + ((lane >> 4) << 3)));
                else ldsm4t(af[mi], smem_addr(ca + (kk + brow_r(lane)) * (GG_BM + 8) + m + brow_c(lane)));
            }
#pragma unroll
            for (int np = 0; np < 2; np++) {
                int n = wn + np * 16;
                unsigned r[4];
                if (BKM) ldsm4(r, smem_addr(cb + (n + brow_r(lane)) * (GG_BK + 8) + kk + brow_c(lane)));
                else ldsm4t(r, smem_addr(cb + (kk + btr_r(lane)) * (GG_BN + 8) + n + btr_c(lane)));
                bfr[2 * np][0] = r[0];
                bfr[2 * np][1] = r[1];
                bfr[2 * np + 1][0] = r[2];
                bfr[2 * np + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++) mma_bf16(acc[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
        }
    }
    cp_wait_n<0>();
}

// gg_store writes a CTA's accumulators into out (row stride ldo, dtype code co): rows m0.. below
// m_end, columns n0.. below n_end; with acc, adds the old value first (one rounding).
__device__ __forceinline__ void gg_store(void* out, int co, long long ldo, float (*acc)[4][4], long long m0, long long m_end,
                                         long long n0, long long n_end, int accumulate) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            long long row = m0 + wm + mi * 16 + (lane >> 2) + h * 8;
            if (row >= m_end) continue;
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    long long col = n0 + wn + ni * 8 + (lane & 3) * 2 + q;
                    if (col >= n_end) continue;
                    long long i = row * ldo + col;
                    float v = acc[mi][ni][2 * h + q];
                    if (accumulate) v += ldf(out, co, i);
                    stf(out, co, i, v);
                }
        }
}

// Forward: out [S, N_] rows of group g = a [S, K_] rows · b_g^T, b [G, N_, K_]. Grid
// (ceil(N_/128), ceil(S/128) + G).
extern "C" __global__ void __launch_bounds__(GG_THREADS, 2) grouped_gemm_mma_fwd(
    void* out, int co,        // [S, N_] f32 or bf16
    const bf16* a,            // [S, K_]
    const bf16* b,            // [G, N_, K_]
    const int* off,           // [G+1]
    int G, int N, int K, int accumulate) {
    extern __shared__ __attribute__((aligned(16))) unsigned char gg_smem[]; // GG_SHARED bytes
    bf16* sa = (bf16*)gg_smem;
    bf16* sb = sa + GG_STAGES * GG_TILE_ELEMS;
    __shared__ int sg, sm0, send;
    gg_find_row_tile(off, G, blockIdx.y, &sg, &sm0, &send);
    if (sg < 0) return;
    long long n0 = (long long)blockIdx.x * GG_BN;
    float acc[4][4][4];
    gg_tile<true, true>(acc, sa, sb, a, K, sm0, send, b + (long long)sg * N * K, K, n0, N, 0, K);
    gg_store(out, co, N, acc, sm0, send, n0, N, accumulate);
}

// Input grad: out [S, K_] rows of group g = a [S, N_] rows · b_g, b [G, N_, K_]. Grid
// (ceil(K_/128), ceil(S/128) + G).
extern "C" __global__ void __launch_bounds__(GG_THREADS, 2) grouped_gemm_mma_dx(
    void* out, int co,        // [S, K_] f32 or bf16
    const bf16* a,            // [S, N_] = dY
    const bf16* b,            // [G, N_, K_]
    const int* off,           // [G+1]
    int G, int N, int K, int accumulate) {
    extern __shared__ __attribute__((aligned(16))) unsigned char gg_smem[]; // GG_SHARED bytes
    bf16* sa = (bf16*)gg_smem;
    bf16* sb = sa + GG_STAGES * GG_TILE_ELEMS;
    __shared__ int sg, sm0, send;
    gg_find_row_tile(off, G, blockIdx.y, &sg, &sm0, &send);
    if (sg < 0) return;
    long long n0 = (long long)blockIdx.x * GG_BN;
    float acc[4][4][4];
    // C [rows, K_] = A [rows, N_] · (B_g [N_, K_]): B is N-major in the product's terms.
    gg_tile<true, false>(acc, sa, sb, a, N, sm0, send, b + (long long)sg * N * K, K, n0, K, 0, N);
    gg_store(out, co, K, acc, sm0, send, n0, K, accumulate);
}

// Weight grad: out_g [N_, K_] = a_g^T · b_g over the rows of group g, a [S, N_] = dY, b [S, K_] =
// X. Grid (ceil(K_/128), ceil(N_/128), G).
extern "C" __global__ void __launch_bounds__(GG_THREADS, 2) grouped_gemm_mma_dw(
    void* out, int co,        // [G, N_, K_] f32 or bf16
    const bf16* a,            // [S, N_] = dY
    const bf16* b,            // [S, K_] = X
    const int* off,           // [G+1]
    int G, int N, int K, int accumulate) {
    extern __shared__ __attribute__((aligned(16))) unsigned char gg_smem[]; // GG_SHARED bytes
    bf16* sa = (bf16*)gg_smem;
    bf16* sb = sa + GG_STAGES * GG_TILE_ELEMS;
    const int g = blockIdx.z;
    long long m0 = (long long)blockIdx.y * GG_BM, n0 = (long long)blockIdx.x * GG_BN;
    float acc[4][4][4];
    // C [N_, K_] = A [N_, rows] · B [rows, K_]: both stored with the reduction (rows) outermost.
    gg_tile<false, false>(acc, sa, sb, a, N, m0, N, b, K, n0, K, off[g], off[g + 1]);
    gg_store((char*)out + (long long)g * N * K * (co == DT_F32 ? 4 : 2), co, K, acc, m0, N, n0, K, accumulate);
}

// The scalar fallback, every kind: one thread per output element, operands of any float dtype.
// Row kinds find the row's group by binary search over off.
extern "C" __global__ void grouped_gemm_simt(
    int kind,
    void* out, int co,        // [S, N_] (forward), [S, K_] (input grad) or [G, N_, K_] (weight grad)
    const void* a, int ca,    // [S, K_] (forward) or [S, N_] = dY
    const void* b, int cb,    // [G, N_, K_] (forward, input grad) or [S, K_] = X
    const int* off,           // [G+1]
    int G, long long S, int N, int K, int accumulate) {
    long long total = kind == 2 ? (long long)G * N * K : S * (kind == 0 ? N : K);
    GRID_STRIDE(i, total) {
        float s = 0.f;
        if (kind == 2) {
            int g = (int)(i / ((long long)N * K));
            int j = (int)(i / K % N), p = (int)(i % K);
            for (long long r = off[g]; r < off[g + 1]; r++) s += ldf(a, ca, r * N + j) * ldf(b, cb, r * K + p);
        } else {
            int cols = kind == 0 ? N : K;
            long long r = i / cols;
            int c = (int)(i % cols);
            int lo = 0, hi = G - 1; // the last group g with off[g] <= r (empty groups before it skipped)
            while (lo < hi) {
                int mid = (lo + hi + 1) >> 1;
                if (off[mid] <= r) lo = mid; else hi = mid - 1;
            }
            const long long wb = (long long)lo * N * K;
            if (kind == 0) {
                for (int p = 0; p < K; p++) s += ldf(a, ca, r * K + p) * ldf(b, cb, wb + (long long)c * K + p);
            } else {
                for (int j = 0; j < N; j++) s += ldf(a, ca, r * N + j) * ldf(b, cb, wb + (long long)j * K + c);
            }
        }
        if (accumulate) s += ldf(out, co, i);
        stf(out, co, i, s);
    }
}
