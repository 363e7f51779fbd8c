// attention.cu: causal grouped-query attention over packed variable-length documents,
// flash-style: scores are computed a tile of 32 keys at a time with an online softmax, and no
// [N, N] score or probability matrix is ever stored.
//
// Shapes: q, out, dout, dq [N, NH*HD]; k, v, dk, dv [Nk, NKV*HD]; lse, dvec [N, NH] fp32;
// cu_q, cu_k [D+1] i32 document boundaries (cu_k == cu_q unless decoding with a KV cache, where
// the queries of a document are the last positions of its keys). Query head h reads key/value
// head h / (NH/NKV). Query i (local index in its document) sees key j of the same document iff
// j <= i + (lenK - lenQ) and, with window > 0, (i + lenK - lenQ) - j < window.
//
// Forward:  out = softmax(scale * q k^T) v                           (=)
//           lse = log(sum_j exp(scale * q.k_j))                       (=, cached for backward)
// Backward: dvec[i,h] = sum_d dout*out                                (scratch)
//           P = exp(scale*q.k - lse); dP = dout.v; dS = P * (dP - dvec)
//           dq = scale * dS k     (=, one warp per query row, no atomics)
//           dk = scale * dS^T q,  dv = P^T dout  (=, one warp per key row, summed over the query
//           heads of its group; no atomics, so results are deterministic)
//
// Layout of a block: 8 warps, one row (query or key) per warp; K/V (or Q/dout) tiles of 32 rows
// are staged in shared memory as fp32 with rows padded to HD+1 floats (no bank conflicts); each
// lane owns head dims lane, lane+32, ... (HD <= 256: attn_fwd, attn_bwd_dq, attn_bwd_dkv).
//
// Head dims above 256 (up to 512) take the *_wide kernels, the same computation with the same
// block layout, but a staged tile holds WCH head dims of its 32 rows at a time (one [32][WCH+1]
// fp32 buffer) instead of all HD: a score is summed over the chunks of the tile, then the
// products that use it (P v, dS k, P^T dout, dS^T q) go over the chunks again, re-staging them.
// Shared memory is then the staging buffer plus the block's own rows ([ROWS][HD], one or two
// arrays), under 48 KiB for HD <= 512, where whole fp32 tiles would need 160 KiB (more than the
// 99 KiB an sm_86/sm_89 block may have) and would leave one block per multiprocessor.

#define ROWS 8
#define TILE 32
#define MAXD 8  // HD / 32 rounded up, for HD <= 256

__device__ __forceinline__ int find_doc(const int* cu, int D, long long i) {
    int lo = 0, hi = D - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (cu[mid] <= i) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// block_range combines the warps' inclusive [lo, hi] key (or query) ranges.
__device__ __forceinline__ void block_range(int* s_lo, int* s_hi, int lo, int hi, int* blo, int* bhi) {
    int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) { s_lo[warp] = lo; s_hi[warp] = hi; }
    __syncthreads();
    int a = 0x7fffffff, b = -1;
    for (int w = 0; w < ROWS; w++) { a = min(a, s_lo[w]); b = max(b, s_hi[w]); }
    *blo = a; *bhi = b;
}

extern "C" __global__ void attn_fwd(void* out, float* lse, const void* q, const void* k, const void* v, int dt,
                                    const int* cu_q, const int* cu_k, int D, long long N,
                                    int NH, int NKV, int HD, float scale, int window) {
    extern __shared__ float sm[];
    __shared__ int s_lo[ROWS], s_hi[ROWS];
    const int P = HD + 1;
    float* Ks = sm;
    float* Vs = Ks + TILE * P;
    float* Qs = Vs + TILE * P;  // [ROWS][HD]
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int h = blockIdx.y, g = h / (NH / NKV);
    long long i = (long long)blockIdx.x * ROWS + warp;
    int lo = 0x7fffffff, hi = -1;
    if (i < N) {
        int d = find_doc(cu_q, D, i);
        int lenQ = cu_q[d + 1] - cu_q[d], lenK = cu_k[d + 1] - cu_k[d];
        int kpos = (int)(i - cu_q[d]) + lenK - lenQ;
        int jlo = 0;
        if (window > 0) jlo = max(0, kpos - window + 1);
        if (kpos >= 0 && lenK > 0) {
            lo = cu_k[d] + jlo;
            hi = cu_k[d] + min(kpos, lenK - 1);
        }
        for (int e = lane; e < HD; e += 32) Qs[warp * HD + e] = ldf(q, dt, i * NH * HD + (long long)h * HD + e);
    }
    int blo, bhi;
    block_range(s_lo, s_hi, lo, hi, &blo, &bhi);
    float acc[MAXD];
    for (int t = 0; t < MAXD; t++) acc[t] = 0.f;
    float m = __int_as_float(0xff800000), l = 0.f;
    long long kstride = (long long)NKV * HD;
    for (int j0 = blo; j0 <= bhi; j0 += TILE) {
        __syncthreads();
        for (int e = threadIdx.x; e < TILE * HD; e += blockDim.x) {
            int r = e / HD, c = e % HD;
            int j = j0 + r;
            float kv = 0.f, vv = 0.f;
            if (j <= bhi) {
                kv = ldf(k, dt, j * kstride + (long long)g * HD + c);
                vv = ldf(v, dt, j * kstride + (long long)g * HD + c);
            }
            Ks[r * P + c] = kv;
            Vs[r * P + c] = vv;
        }
        __syncthreads();
        if (hi < j0 || lo > j0 + TILE - 1) continue;  // warp-uniform: this tile is outside the row's range
        int j = j0 + lane;
        bool ok = j >= lo && j <= hi;
        float s = __int_as_float(0xff800000);
        if (ok) {
            float dot = 0.f;
            const float* qr = Qs + warp * HD;
            const float* kr = Ks + lane * P;
            for (int e = 0; e < HD; e++) dot += qr[e] * kr[e];
            s = dot * scale;
        }
        float mt = warp_max(s);
        float mn = fmaxf(m, mt);
        float p = ok ? expf(s - mn) : 0.f;
        float corr = expf(m - mn);
        l = l * corr + warp_sum(p);
        m = mn;
        for (int t = 0; t < MAXD; t++) acc[t] *= corr;
        for (int jj = 0; jj < TILE; jj++) {
            float pj = __shfl_sync(0xffffffffu, p, jj);
            if (pj == 0.f) continue;
            const float* vr = Vs + jj * P;
            for (int t = 0; t < MAXD; t++) {
                int e = lane + 32 * t;
                if (e < HD) acc[t] += pj * vr[e];
            }
        }
    }
    if (i < N) {
        float inv = l > 0.f ? 1.f / l : 0.f;
        for (int t = 0; t < MAXD; t++) {
            int e = lane + 32 * t;
            if (e < HD) stf(out, dt, i * NH * HD + (long long)h * HD + e, acc[t] * inv);
        }
        if (lse && lane == 0) lse[i * NH + h] = l > 0.f ? m + logf(l) : __int_as_float(0xff800000);
    }
}

// dvec[i, h] = sum_d dout[i, h, d] * out[i, h, d]; one warp per (i, h).
extern "C" __global__ void attn_bwd_dot(float* dvec, const void* dout, const void* out, int dt, long long N, int NH, int HD) {
    long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= N * NH) return;
    float s = 0.f;
    for (int e = lane; e < HD; e += 32) s += ldf(dout, dt, w * HD + e) * ldf(out, dt, w * HD + e);
    s = warp_sum(s);
    if (lane == 0) dvec[w] = s;
}

// dq_query_row sets up query row i (global index) of head h for the dQ kernels: [*lo, *hi] are
// the key rows it attends to (its document's start, or i - window + 1, to i), empty (lo > hi)
// past N; the row's Q and dOut go to qr and dor ([HD] each, this warp's lanes), its
// log-sum-exp and dOut·Out to *li and *di (0 past N).
__device__ __forceinline__ void dq_query_row(const void* q, const void* dout, int dt, const float* lse, const float* dvec,
                                             const int* cu, int D, long long N, long long i, int NH, int h, int HD,
                                             int window, float* qr, float* dor, int lane, int* lo, int* hi, float* li,
                                             float* di) {
    *lo = 0x7fffffff;
    *hi = -1;
    *li = 0.f;
    *di = 0.f;
    if (i >= N) return;
    int d = find_doc(cu, D, i);
    int iq = (int)(i - cu[d]);
    *lo = cu[d] + (window > 0 ? max(0, iq - window + 1) : 0);
    *hi = (int)i;
    for (int e = lane; e < HD; e += 32) {
        qr[e] = ldf(q, dt, i * NH * HD + (long long)h * HD + e);
        dor[e] = ldf(dout, dt, i * NH * HD + (long long)h * HD + e);
    }
    *li = lse[i * NH + h];
    *di = dvec[i * NH + h];
}

extern "C" __global__ void attn_bwd_dq(void* dq, const void* q, const void* k, const void* v, const void* dout, int dt,
                                       const float* lse, const float* dvec, const int* cu, int D, long long N,
                                       int NH, int NKV, int HD, float scale, int window) {
    extern __shared__ float sm[];
    __shared__ int s_lo[ROWS], s_hi[ROWS];
    const int P = HD + 1;
    float* Ks = sm;
    float* Vs = Ks + TILE * P;
    float* Qs = Vs + TILE * P;    // [ROWS][HD]
    float* dOs = Qs + ROWS * HD;  // [ROWS][HD]
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int h = blockIdx.y, g = h / (NH / NKV);
    long long i = (long long)blockIdx.x * ROWS + warp;
    int lo, hi;
    float li, di;
    dq_query_row(q, dout, dt, lse, dvec, cu, D, N, i, NH, h, HD, window, Qs + warp * HD, dOs + warp * HD, lane, &lo, &hi,
                 &li, &di);
    int blo, bhi;
    block_range(s_lo, s_hi, lo, hi, &blo, &bhi);
    float acc[MAXD];
    for (int t = 0; t < MAXD; t++) acc[t] = 0.f;
    long long kstride = (long long)NKV * HD;
    for (int j0 = blo; j0 <= bhi; j0 += TILE) {
        __syncthreads();
        for (int e = threadIdx.x; e < TILE * HD; e += blockDim.x) {
            int r = e / HD, c = e % HD;
            int j = j0 + r;
            float kv = 0.f, vv = 0.f;
            if (j <= bhi) {
                kv = ldf(k, dt, j * kstride + (long long)g * HD + c);
                vv = ldf(v, dt, j * kstride + (long long)g * HD + c);
            }
            Ks[r * P + c] = kv;
            Vs[r * P + c] = vv;
        }
        __syncthreads();
        if (hi < j0 || lo > j0 + TILE - 1) continue;
        int j = j0 + lane;
        float ds = 0.f;
        if (j >= lo && j <= hi) {
            float qk = 0.f, dp = 0.f;
            const float* qr = Qs + warp * HD;
            const float* dr = dOs + warp * HD;
            const float* kr = Ks + lane * P;
            const float* vr = Vs + lane * P;
            for (int e = 0; e < HD; e++) {
                qk += qr[e] * kr[e];
                dp += dr[e] * vr[e];
            }
            float p = expf(qk * scale - li);
            ds = p * (dp - di);
        }
        for (int jj = 0; jj < TILE; jj++) {
            float dj = __shfl_sync(0xffffffffu, ds, jj);
            if (dj == 0.f) continue;
            const float* kr = Ks + jj * P;
            for (int t = 0; t < MAXD; t++) {
                int e = lane + 32 * t;
                if (e < HD) acc[t] += dj * kr[e];
            }
        }
    }
    if (i < N) {
        for (int t = 0; t < MAXD; t++) {
            int e = lane + 32 * t;
            if (e < HD) stf(dq, dt, i * NH * HD + (long long)h * HD + e, acc[t] * scale);
        }
    }
}

// dkv_key_row sets up key row j (global index) of the dK/dV kernels: [*lo, *hi] are the query
// rows that attend to it (from j to the end of its document, or to j + window - 1), empty
// (lo > hi) past N; the row's K and V of group g go to kr and vr ([HD] each, this warp's lanes).
__device__ __forceinline__ void dkv_key_row(const void* k, const void* v, int dt, const int* cu, int D, long long N,
                                            long long j, long long kstride, int g, int HD, int window, float* kr,
                                            float* vr, int lane, int* lo, int* hi) {
    *lo = 0x7fffffff;
    *hi = -1;
    if (j >= N) return;
    int d = find_doc(cu, D, j);
    int len = cu[d + 1] - cu[d];
    int jk = (int)(j - cu[d]);
    int last = len - 1;
    if (window > 0) last = min(last, jk + window - 1);
    *lo = (int)j;
    *hi = cu[d] + last;
    for (int e = lane; e < HD; e += 32) {
        kr[e] = ldf(k, dt, j * kstride + (long long)g * HD + e);
        vr[e] = ldf(v, dt, j * kstride + (long long)g * HD + e);
    }
}

extern "C" __global__ void attn_bwd_dkv(void* dk, void* dv, const void* q, const void* k, const void* v, const void* dout, int dt,
                                        const float* lse, const float* dvec, const int* cu, int D, long long N,
                                        int NH, int NKV, int HD, float scale, int window) {
    extern __shared__ float sm[];
    __shared__ int s_lo[ROWS], s_hi[ROWS];
    __shared__ float s_lse[TILE], s_dvec[TILE];
    const int P = HD + 1;
    float* Qs = sm;                // [TILE][P]
    float* dOs = Qs + TILE * P;    // [TILE][P]
    float* kS = dOs + TILE * P;    // [ROWS][HD]
    float* vS = kS + ROWS * HD;    // [ROWS][HD]
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = blockIdx.y, G = NH / NKV;
    long long j = (long long)blockIdx.x * ROWS + warp;
    long long kstride = (long long)NKV * HD, qstride = (long long)NH * HD;
    int lo, hi;
    dkv_key_row(k, v, dt, cu, D, N, j, kstride, g, HD, window, kS + warp * HD, vS + warp * HD, lane, &lo, &hi);
    int blo, bhi;
    block_range(s_lo, s_hi, lo, hi, &blo, &bhi);
    float dka[MAXD], dva[MAXD];
    for (int t = 0; t < MAXD; t++) { dka[t] = 0.f; dva[t] = 0.f; }
    for (int h = g * G; h < (g + 1) * G; h++) {
        for (int i0 = blo; i0 <= bhi; i0 += TILE) {
            __syncthreads();
            for (int e = threadIdx.x; e < TILE * HD; e += blockDim.x) {
                int r = e / HD, c = e % HD;
                int i = i0 + r;
                float qv = 0.f, ov = 0.f;
                if (i <= bhi) {
                    qv = ldf(q, dt, i * qstride + (long long)h * HD + c);
                    ov = ldf(dout, dt, i * qstride + (long long)h * HD + c);
                }
                Qs[r * P + c] = qv;
                dOs[r * P + c] = ov;
            }
            if (threadIdx.x < TILE) {
                int i = i0 + threadIdx.x;
                s_lse[threadIdx.x] = i <= bhi ? lse[(long long)i * NH + h] : 0.f;
                s_dvec[threadIdx.x] = i <= bhi ? dvec[(long long)i * NH + h] : 0.f;
            }
            __syncthreads();
            if (hi < i0 || lo > i0 + TILE - 1) continue;
            int i = i0 + lane;
            float p = 0.f, ds = 0.f;
            if (i >= lo && i <= hi) {
                float qk = 0.f, dp = 0.f;
                const float* qr = Qs + lane * P;
                const float* dr = dOs + lane * P;
                const float* kr = kS + warp * HD;
                const float* vr = vS + warp * HD;
                for (int e = 0; e < HD; e++) {
                    qk += qr[e] * kr[e];
                    dp += dr[e] * vr[e];
                }
                p = expf(qk * scale - s_lse[lane]);
                ds = p * (dp - s_dvec[lane]);
            }
            for (int ii = 0; ii < TILE; ii++) {
                float pi = __shfl_sync(0xffffffffu, p, ii);
                float di = __shfl_sync(0xffffffffu, ds, ii);
                if (pi == 0.f && di == 0.f) continue;
                const float* qr = Qs + ii * P;
                const float* dr = dOs + ii * P;
                for (int t = 0; t < MAXD; t++) {
                    int e = lane + 32 * t;
                    if (e < HD) {
                        dva[t] += pi * dr[e];
                        dka[t] += di * qr[e];
                    }
                }
            }
        }
    }
    if (j < N) {
        for (int t = 0; t < MAXD; t++) {
            int e = lane + 32 * t;
            if (e < HD) {
                stf(dk, dt, j * kstride + (long long)g * HD + e, dka[t] * scale);
                stf(dv, dt, j * kstride + (long long)g * HD + e, dva[t]);
            }
        }
    }
}


// ---- head dims 257..512: the *_wide kernels ----

#define WCH 64    // head dims per staged chunk (a multiple of 32)
#define WMAXD 16  // HD / 32 rounded up, for HD <= 512
#define WP (WCH + 1)
#define WCHUNKS (WMAXD * 32 / WCH)

// stage_chunk writes head dims [c0, c0 + WCH) of rows r0 .. r0 + TILE - 1 of src into Ts
// ([TILE][WP] fp32), zero past row rlast and past HD. A row's elements are at
// row * stride + off + c.
__device__ __forceinline__ void stage_chunk(float* Ts, const void* src, int dt, long long r0, long long rlast,
                                            long long stride, long long off, int c0, int HD) {
    for (int e = threadIdx.x; e < TILE * WCH; e += blockDim.x) {
        int r = e / WCH, c = e % WCH;
        long long row = r0 + r;
        float x = 0.f;
        if (row <= rlast && c0 + c < HD) x = ldf(src, dt, row * stride + off + c0 + c);
        Ts[r * WP + c] = x;
    }
}

// chunk_dot is sum over the chunk's head dims of a[e] * Ts[row][e - c0] for a = a row's
// [HD] values at a + c0.
__device__ __forceinline__ float chunk_dot(const float* a, const float* Ts, int row, int c0, int HD) {
    int cw = min(WCH, HD - c0);
    const float* t = Ts + row * WP;
    float s = 0.f;
    for (int e = 0; e < cw; e++) s += a[c0 + e] * t[e];
    return s;
}

// chunk_axpy adds w_r * Ts[r][lane + 32u] for the TILE staged rows r (w_r is lane r's w, a
// warp-uniform shuffle) into acc[cc * WCH/32 + u], the lane's head dims of chunk cc.
__device__ __forceinline__ void chunk_axpy(float* acc, const float* Ts, float w, int cc, int HD) {
    int lane = threadIdx.x & 31;
    for (int r = 0; r < TILE; r++) {
        float wr = __shfl_sync(0xffffffffu, w, r);
        if (wr == 0.f) continue;
        const float* t = Ts + r * WP;
#pragma unroll
        for (int u = 0; u < WCH / 32; u++) {
            int e = cc * WCH + lane + 32 * u;
            if (e < HD) acc[cc * (WCH / 32) + u] += wr * t[lane + 32 * u];
        }
    }
}

// attn_fwd_wide is attn_fwd for 256 < HD <= 512. Shared: Ts [TILE][WP], Qs [ROWS][HD].
extern "C" __global__ void attn_fwd_wide(void* out, float* lse, const void* q, const void* k, const void* v, int dt,
                                         const int* cu_q, const int* cu_k, int D, long long N,
                                         int NH, int NKV, int HD, float scale, int window) {
    extern __shared__ float sm[];
    __shared__ int s_lo[ROWS], s_hi[ROWS];
    float* Ts = sm;
    float* Qs = Ts + TILE * WP;  // [ROWS][HD]
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int h = blockIdx.y, g = h / (NH / NKV);
    long long i = (long long)blockIdx.x * ROWS + warp;
    int lo = 0x7fffffff, hi = -1;
    if (i < N) {
        int d = find_doc(cu_q, D, i);
        int lenQ = cu_q[d + 1] - cu_q[d], lenK = cu_k[d + 1] - cu_k[d];
        int kpos = (int)(i - cu_q[d]) + lenK - lenQ;
        int jlo = 0;
        if (window > 0) jlo = max(0, kpos - window + 1);
        if (kpos >= 0 && lenK > 0) {
            lo = cu_k[d] + jlo;
            hi = cu_k[d] + min(kpos, lenK - 1);
        }
        for (int e = lane; e < HD; e += 32) Qs[warp * HD + e] = ldf(q, dt, i * NH * HD + (long long)h * HD + e);
    }
    int blo, bhi;
    block_range(s_lo, s_hi, lo, hi, &blo, &bhi);
    float acc[WMAXD];
#pragma unroll
    for (int t = 0; t < WMAXD; t++) acc[t] = 0.f;
    float m = __int_as_float(0xff800000), l = 0.f;
    long long kstride = (long long)NKV * HD;
    const float* qr = Qs + warp * HD;
    for (int j0 = blo; j0 <= bhi; j0 += TILE) {
        bool live = !(hi < j0 || lo > j0 + TILE - 1);  // warp-uniform: the tile meets the row's range
        int j = j0 + lane;
        bool ok = j >= lo && j <= hi;
        float dot = 0.f;
        for (int c0 = 0; c0 < HD; c0 += WCH) {
            __syncthreads();
            stage_chunk(Ts, k, dt, j0, bhi, kstride, (long long)g * HD, c0, HD);
            __syncthreads();
            if (ok) dot += chunk_dot(qr, Ts, lane, c0, HD);
        }
        float p = 0.f;
        if (live) {
            float s = ok ? dot * scale : __int_as_float(0xff800000);
            float mn = fmaxf(m, warp_max(s));
            p = ok ? expf(s - mn) : 0.f;
            float corr = expf(m - mn);
            l = l * corr + warp_sum(p);
            m = mn;
#pragma unroll
            for (int t = 0; t < WMAXD; t++) acc[t] *= corr;
        }
#pragma unroll
        for (int cc = 0; cc < WCHUNKS; cc++) {
            if (cc * WCH < HD) {  // block-uniform
                __syncthreads();
                stage_chunk(Ts, v, dt, j0, bhi, kstride, (long long)g * HD, cc * WCH, HD);
                __syncthreads();
                if (live) chunk_axpy(acc, Ts, p, cc, HD);
            }
        }
    }
    if (i < N) {
        float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
        for (int t = 0; t < WMAXD; t++) {
            int e = lane + 32 * t;
            if (e < HD) stf(out, dt, i * NH * HD + (long long)h * HD + e, acc[t] * inv);
        }
        if (lse && lane == 0) lse[i * NH + h] = l > 0.f ? m + logf(l) : __int_as_float(0xff800000);
    }
}

// attn_bwd_dq_wide is attn_bwd_dq for 256 < HD <= 512. Shared: Ts [TILE][WP], Qs and dOs
// [ROWS][HD]. K is staged twice per tile: for the scores, then for dS k.
extern "C" __global__ void attn_bwd_dq_wide(void* dq, const void* q, const void* k, const void* v, const void* dout, int dt,
                                            const float* lse, const float* dvec, const int* cu, int D, long long N,
                                            int NH, int NKV, int HD, float scale, int window) {
    extern __shared__ float sm[];
    __shared__ int s_lo[ROWS], s_hi[ROWS];
    float* Ts = sm;
    float* Qs = Ts + TILE * WP;   // [ROWS][HD]
    float* dOs = Qs + ROWS * HD;  // [ROWS][HD]
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int h = blockIdx.y, g = h / (NH / NKV);
    long long i = (long long)blockIdx.x * ROWS + warp;
    int lo, hi;
    float li, di;
    dq_query_row(q, dout, dt, lse, dvec, cu, D, N, i, NH, h, HD, window, Qs + warp * HD, dOs + warp * HD, lane, &lo, &hi,
                 &li, &di);
    int blo, bhi;
    block_range(s_lo, s_hi, lo, hi, &blo, &bhi);
    float acc[WMAXD];
#pragma unroll
    for (int t = 0; t < WMAXD; t++) acc[t] = 0.f;
    long long kstride = (long long)NKV * HD, off = (long long)g * HD;
    const float* qr = Qs + warp * HD;
    const float* dr = dOs + warp * HD;
    for (int j0 = blo; j0 <= bhi; j0 += TILE) {
        bool live = !(hi < j0 || lo > j0 + TILE - 1);
        int j = j0 + lane;
        bool ok = j >= lo && j <= hi;
        float qk = 0.f, dp = 0.f;
        for (int c0 = 0; c0 < HD; c0 += WCH) {
            __syncthreads();
            stage_chunk(Ts, k, dt, j0, bhi, kstride, off, c0, HD);
            __syncthreads();
            if (ok) qk += chunk_dot(qr, Ts, lane, c0, HD);
            __syncthreads();
            stage_chunk(Ts, v, dt, j0, bhi, kstride, off, c0, HD);
            __syncthreads();
            if (ok) dp += chunk_dot(dr, Ts, lane, c0, HD);
        }
        float ds = ok ? expf(qk * scale - li) * (dp - di) : 0.f;
#pragma unroll
        for (int cc = 0; cc < WCHUNKS; cc++) {
            if (cc * WCH < HD) {
                __syncthreads();
                stage_chunk(Ts, k, dt, j0, bhi, kstride, off, cc * WCH, HD);
                __syncthreads();
                if (live) chunk_axpy(acc, Ts, ds, cc, HD);
            }
        }
    }
    if (i < N) {
#pragma unroll
        for (int t = 0; t < WMAXD; t++) {
            int e = lane + 32 * t;
            if (e < HD) stf(dq, dt, i * NH * HD + (long long)h * HD + e, acc[t] * scale);
        }
    }
}

// attn_bwd_dkv_wide is attn_bwd_dkv for 256 < HD <= 512. Shared: Ts [TILE][WP], kS and vS
// [ROWS][HD]. Per query tile, Q and dout are staged for the scores, then dout for P^T dout
// and Q for dS^T q.
extern "C" __global__ void attn_bwd_dkv_wide(void* dk, void* dv, const void* q, const void* k, const void* v, const void* dout, int dt,
                                             const float* lse, const float* dvec, const int* cu, int D, long long N,
                                             int NH, int NKV, int HD, float scale, int window) {
    extern __shared__ float sm[];
    __shared__ int s_lo[ROWS], s_hi[ROWS];
    __shared__ float s_lse[TILE], s_dvec[TILE];
    float* Ts = sm;
    float* kS = Ts + TILE * WP;  // [ROWS][HD]
    float* vS = kS + ROWS * HD;  // [ROWS][HD]
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = blockIdx.y, G = NH / NKV;
    long long j = (long long)blockIdx.x * ROWS + warp;
    long long kstride = (long long)NKV * HD, qstride = (long long)NH * HD;
    int lo, hi;
    dkv_key_row(k, v, dt, cu, D, N, j, kstride, g, HD, window, kS + warp * HD, vS + warp * HD, lane, &lo, &hi);
    int blo, bhi;
    block_range(s_lo, s_hi, lo, hi, &blo, &bhi);
    float dka[WMAXD], dva[WMAXD];
#pragma unroll
    for (int t = 0; t < WMAXD; t++) { dka[t] = 0.f; dva[t] = 0.f; }
    const float* kr = kS + warp * HD;
    const float* vr = vS + warp * HD;
    for (int h = g * G; h < (g + 1) * G; h++) {
        long long off = (long long)h * HD;
        for (int i0 = blo; i0 <= bhi; i0 += TILE) {
            __syncthreads();  // the previous tile is done with s_lse and s_dvec
            if (threadIdx.x < TILE) {
                int i = i0 + threadIdx.x;
                s_lse[threadIdx.x] = i <= bhi ? lse[(long long)i * NH + h] : 0.f;
                s_dvec[threadIdx.x] = i <= bhi ? dvec[(long long)i * NH + h] : 0.f;
            }
            bool live = !(hi < i0 || lo > i0 + TILE - 1);
            int i = i0 + lane;
            bool ok = i >= lo && i <= hi;
            float qk = 0.f, dp = 0.f;
            for (int c0 = 0; c0 < HD; c0 += WCH) {
                __syncthreads();
                stage_chunk(Ts, q, dt, i0, bhi, qstride, off, c0, HD);
                __syncthreads();
                if (ok) qk += chunk_dot(kr, Ts, lane, c0, HD);
                __syncthreads();
                stage_chunk(Ts, dout, dt, i0, bhi, qstride, off, c0, HD);
                __syncthreads();
                if (ok) dp += chunk_dot(vr, Ts, lane, c0, HD);
            }
            float p = 0.f, ds = 0.f;
            if (ok) {
                p = expf(qk * scale - s_lse[lane]);
                ds = p * (dp - s_dvec[lane]);
            }
#pragma unroll
            for (int cc = 0; cc < WCHUNKS; cc++) {
                if (cc * WCH < HD) {
                    __syncthreads();
                    stage_chunk(Ts, dout, dt, i0, bhi, qstride, off, cc * WCH, HD);
                    __syncthreads();
                    if (live) chunk_axpy(dva, Ts, p, cc, HD);
                    __syncthreads();
                    stage_chunk(Ts, q, dt, i0, bhi, qstride, off, cc * WCH, HD);
                    __syncthreads();
                    if (live) chunk_axpy(dka, Ts, ds, cc, HD);
                }
            }
        }
    }
    if (j < N) {
#pragma unroll
        for (int t = 0; t < WMAXD; t++) {
            int e = lane + 32 * t;
            if (e < HD) {
                stf(dk, dt, j * kstride + (long long)g * HD + e, dka[t] * scale);
                stf(dv, dt, j * kstride + (long long)g * HD + e, dva[t]);
            }
        }
    }
}
