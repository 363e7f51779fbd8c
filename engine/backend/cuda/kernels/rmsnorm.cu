// rmsnorm.cu: RMSNorm forward and backward, and the fused residual add + RMSNorm.
//
// Shapes: x, out, dy, dx [N, C]; w [C]; rstd [N] fp32.
// Forward:  rstd[n] = 1/sqrt(mean_c x[n,c]^2 + eps)                  (=, cached for backward)
//           out[n,c] = x[n,c] * rstd[n] * w[c]                         (=)
// Fused:    h = x + residual (= into resid_out, rounded to its dtype), then the forward on h.
// Backward: xhat = x * rstd; g = w * dy
//           dx[n,c] = rstd[n] * (g[c] - xhat[c] * mean_c(g * xhat))   (=, or += when accumulate)
//           dw[c]  += sum_n dy[n,c] * xhat[n,c]                        (+=, parameter gradient,
//           summed per block in shared memory into the fp32 accumulator dw_acc [C], which the
//           caller zeroes and then adds into dw)
// Nothing of size [N, C] is cached: backward re-reads x and the fp32 rstd.

extern "C" __global__ void rmsnorm_fwd(void* out, int dto, float* rstd, const void* x, int dtx,
                                       const void* w, int dtw, int C, float eps) {
    __shared__ float scratch[32];
    long long row = blockIdx.x;
    long long base = row * C;
    float ss = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float v = ldf(x, dtx, base + c);
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    float r = rsqrtf(ss / (float)C + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        stf(out, dto, base + c, ldf(x, dtx, base + c) * r * ldf(w, dtw, c));
}

// resid_out [N, C] = x + residual (may alias residual); then rmsnorm of resid_out.
extern "C" __global__ void add_rmsnorm_fwd(void* resid_out, int dtro, void* out, int dto, float* rstd,
                                           const void* x, int dtx, const void* residual, int dtr,
                                           const void* w, int dtw, int C, float eps) {
    __shared__ float scratch[32];
    long long row = blockIdx.x;
    long long base = row * C;
    float ss = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        stf(resid_out, dtro, base + c, ldf(x, dtx, base + c) + ldf(residual, dtr, base + c));
        float v = ldf(resid_out, dtro, base + c);  // the rounded value, as the unfused Add gives
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    float r = rsqrtf(ss / (float)C + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        stf(out, dto, base + c, ldf(resid_out, dtro, base + c) * r * ldf(w, dtw, c));
}

// Grid-stride over rows; dynamic shared memory holds C floats of the block's dw partial sums
// (dw_acc may be null when no weight gradient is wanted).
extern "C" __global__ void rmsnorm_bwd(void* dx, int dtdx, float* dw_acc, const void* dy, int dtdy,
                                       const void* x, int dtx, const void* w, int dtw,
                                       const float* rstd, long long N, int C, int accumulate) {
    extern __shared__ float dw_s[];
    __shared__ float scratch[32];
    if (dw_acc)
        for (int c = threadIdx.x; c < C; c += blockDim.x) dw_s[c] = 0.f;
    for (long long row = blockIdx.x; row < N; row += gridDim.x) {
        long long base = row * C;
        float r = rstd[row];
        float dot = 0.f;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float xh = ldf(x, dtx, base + c) * r;
            float g = ldf(w, dtw, c) * ldf(dy, dtdy, base + c);
            dot += g * xh;
        }
        dot = block_sum(dot, scratch) / (float)C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float xh = ldf(x, dtx, base + c) * r;
            float d = ldf(dy, dtdy, base + c);
            float v = r * (ldf(w, dtw, c) * d - xh * dot);
            if (accumulate) v += ldf(dx, dtdx, base + c);
            stf(dx, dtdx, base + c, v);
            if (dw_acc) dw_s[c] += d * xh;
        }
    }
    if (dw_acc) {
        __syncthreads();
        for (int c = threadIdx.x; c < C; c += blockDim.x) atomicAdd(&dw_acc[c], dw_s[c]);
    }
}

// ---- vectorised bf16 forms ----
//
// For bf16 tensors with C a multiple of 8 and 16-byte aligned rows: 8 elements per 16-byte
// access, each row handled by L lanes of one warp, L = min(32, C/8) (so C/8 is 32 or more, or
// divides 32: rows of 128 take 16 lanes, two rows per warp), the row reduction a shuffle within
// those lanes. The arithmetic is the scalar kernels' (same expressions); only the summation
// order of the row reductions differs. The backward keeps each lane's weight-gradient partial
// sums in registers, MAXV vectors of 8 per lane: C <= 8 * L * MAXV.

struct alignas(16) rn_bf8 { unsigned int u[4]; };

__device__ __forceinline__ float rn_at(const rn_bf8& v, int j) {
    unsigned int w = v.u[j >> 1];
    return (j & 1) ? __uint_as_float(w & 0xffff0000u) : __uint_as_float(w << 16);
}

__device__ __forceinline__ unsigned int rn_pack(float lo, float hi) {
    return (unsigned int)f2bf(lo) | ((unsigned int)f2bf(hi) << 16);
}

// rn_sum adds v over the L lanes (a power of two dividing 32, aligned groups) holding one row.
__device__ __forceinline__ float rn_sum(float v, int L) {
    for (int o = L >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// rn_lanes is L for a row of C8 vectors.
__device__ __forceinline__ int rn_lanes(int C8) { return C8 < 32 ? C8 : 32; }

// out, x [N, C]; w [C]; rstd [N]. Block: 256 threads, 8 * (32 / L) rows.
extern "C" __global__ void rmsnorm_fwd_bf16x8(rn_bf8* out, float* rstd, const rn_bf8* x, const rn_bf8* w,
                                              long long N, int C, float eps) {
    int C8 = C >> 3, L = rn_lanes(C8), lane = threadIdx.x & 31, l = lane % L;
    long long row = ((long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * (32 / L) + lane / L;
    bool valid = row < N;
    long long base = valid ? row * C8 : 0;
    float ss = 0.f;
    if (valid)
        for (int k = l; k < C8; k += L) {
            rn_bf8 v = x[base + k];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float f = rn_at(v, j);
                ss += f * f;
            }
        }
    ss = rn_sum(ss, L);  // every lane takes part
    if (!valid) return;
    float r = rsqrtf(ss / (float)C + eps);
    if (l == 0) rstd[row] = r;
    for (int k = l; k < C8; k += L) {
        rn_bf8 v = x[base + k], wv = w[k], o;
#pragma unroll
        for (int j = 0; j < 4; j++)
            o.u[j] = rn_pack(rn_at(v, 2 * j) * r * rn_at(wv, 2 * j), rn_at(v, 2 * j + 1) * r * rn_at(wv, 2 * j + 1));
        out[base + k] = o;
    }
}

// resid_out [N, C] = x + residual (rounded; may alias residual), then the forward on it.
extern "C" __global__ void add_rmsnorm_fwd_bf16x8(rn_bf8* resid_out, rn_bf8* out, float* rstd, const rn_bf8* x,
                                                  const rn_bf8* residual, const rn_bf8* w, long long N, int C,
                                                  float eps) {
    int C8 = C >> 3, L = rn_lanes(C8), lane = threadIdx.x & 31, l = lane % L;
    long long row = ((long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * (32 / L) + lane / L;
    bool valid = row < N;
    long long base = valid ? row * C8 : 0;
    float ss = 0.f;
    if (valid)
        for (int k = l; k < C8; k += L) {
            rn_bf8 a = x[base + k], b = residual[base + k], h;
#pragma unroll
            for (int j = 0; j < 4; j++)
                h.u[j] = rn_pack(rn_at(a, 2 * j) + rn_at(b, 2 * j), rn_at(a, 2 * j + 1) + rn_at(b, 2 * j + 1));
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float f = rn_at(h, j);  // the rounded value, as the unfused Add gives
                ss += f * f;
            }
            resid_out[base + k] = h;
        }
    ss = rn_sum(ss, L);
    if (!valid) return;
    float r = rsqrtf(ss / (float)C + eps);
    if (l == 0) rstd[row] = r;
    for (int k = l; k < C8; k += L) {
        rn_bf8 v = resid_out[base + k], wv = w[k], o;  // this lane's own stores above
#pragma unroll
        for (int j = 0; j < 4; j++)
            o.u[j] = rn_pack(rn_at(v, 2 * j) * r * rn_at(wv, 2 * j), rn_at(v, 2 * j + 1) * r * rn_at(wv, 2 * j + 1));
        out[base + k] = o;
    }
}

// ---- one block per row, for few rows ----
//
// With too few rows to fill the SMs with the warp-per-row kernels above (decoding: one row per
// sequence), each row would be one warp's C/256 serial round trips to memory. These spread a row
// over the block: thread t holds vectors t, t + blockDim.x, ... (at most RN_ROW_V of them) in
// registers, loads all of them before it stores anything (so resid_out and out may alias x and
// residual), and the row sum is a block sum. The arithmetic is the warp kernels' (the same
// expressions); only the summation order differs. C/8 <= blockDim.x * RN_ROW_V.
#define RN_ROW_V 8

// rn_row_store finishes a block's row of the _row kernels: the block sum of ss (this thread's
// sum of squares) gives the row's 1/rms, stored in rstd; then out = v * rstd * w for this
// thread's vectors of the row.
__device__ __forceinline__ void rn_row_store(rn_bf8* out, float* rstd, const rn_bf8 (&v)[RN_ROW_V], const rn_bf8* w,
                                             float ss, float* scratch, int C, float eps) {
    int C8 = C >> 3;
    long long base = (long long)blockIdx.x * C8;
    ss = block_sum(ss, scratch);
    float r = rsqrtf(ss / (float)C + eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
#pragma unroll
    for (int i = 0; i < RN_ROW_V; i++) {
        int k = threadIdx.x + i * blockDim.x;
        if (k >= C8) break;
        rn_bf8 wv = w[k], o;
#pragma unroll
        for (int j = 0; j < 4; j++)
            o.u[j] = rn_pack(rn_at(v[i], 2 * j) * r * rn_at(wv, 2 * j), rn_at(v[i], 2 * j + 1) * r * rn_at(wv, 2 * j + 1));
        out[base + k] = o;
    }
}

extern "C" __global__ void rmsnorm_fwd_bf16x8_row(rn_bf8* out, float* rstd, const rn_bf8* x, const rn_bf8* w,
                                                  int C, float eps) {
    __shared__ float scratch[32];
    int C8 = C >> 3;
    long long base = (long long)blockIdx.x * C8;
    rn_bf8 v[RN_ROW_V];
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < RN_ROW_V; i++) {
        int k = threadIdx.x + i * blockDim.x;
        v[i] = rn_bf8{{0u, 0u, 0u, 0u}};
        if (k < C8) v[i] = x[base + k];
    }
#pragma unroll
    for (int i = 0; i < RN_ROW_V; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float f = rn_at(v[i], j);  // zero past the row
            ss += f * f;
        }
    rn_row_store(out, rstd, v, w, ss, scratch, C, eps);
}

extern "C" __global__ void add_rmsnorm_fwd_bf16x8_row(rn_bf8* resid_out, rn_bf8* out, float* rstd, const rn_bf8* x,
                                                      const rn_bf8* residual, const rn_bf8* w, int C, float eps) {
    __shared__ float scratch[32];
    int C8 = C >> 3;
    long long base = (long long)blockIdx.x * C8;
    rn_bf8 a[RN_ROW_V], b[RN_ROW_V];
#pragma unroll
    for (int i = 0; i < RN_ROW_V; i++) {
        int k = threadIdx.x + i * blockDim.x;
        a[i] = b[i] = rn_bf8{{0u, 0u, 0u, 0u}};
        if (k < C8) {
            a[i] = x[base + k];
            b[i] = residual[base + k];
        }
    }
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < RN_ROW_V; i++) {
        rn_bf8 h;
#pragma unroll
        for (int j = 0; j < 4; j++)
            h.u[j] = rn_pack(rn_at(a[i], 2 * j) + rn_at(b[i], 2 * j), rn_at(a[i], 2 * j + 1) + rn_at(b[i], 2 * j + 1));
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float f = rn_at(h, j);  // the rounded value, as the unfused Add gives; zero past the row
            ss += f * f;
        }
        a[i] = h;  // a now holds the sum
    }
#pragma unroll
    for (int i = 0; i < RN_ROW_V; i++) {
        int k = threadIdx.x + i * blockDim.x;
        if (k < C8) resid_out[base + k] = a[i];
    }
    rn_row_store(out, rstd, a, w, ss, scratch, C, eps);
}

// Row groups stride over the rows. Each lane keeps its columns' dw partial sums in registers; at
// the end every row group (8 warps x 32/L groups = G) stores them in dynamic shared memory
// [G, C] (G*C = 8 * max(C, 256) floats), the block adds the G rows in order and stores the sum
// (=) as row blockIdx.x of dw_part [gridDim.x, C], which rmsnorm_dw_reduce adds up: no atomics,
// so dw is deterministic. dw_part is null when no weight gradient is wanted. C <= 8 * L * MAXV.
template <int MAXV>
__device__ __forceinline__ void rmsnorm_bwd_vec(rn_bf8* dx, float* dw_part, const rn_bf8* dy, const rn_bf8* x,
                                                const rn_bf8* w, const float* rstd, long long N, int C,
                                                int accumulate) {
    extern __shared__ float dw_s[];
    int C8 = C >> 3, L = rn_lanes(C8), lane = threadIdx.x & 31, l = lane % L, R = 32 / L;
    float acc[MAXV][8];
#pragma unroll
    for (int i = 0; i < MAXV; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j] = 0.f;
    // The lane's w vectors stay in registers; each row's x, dy (and old dx) are loaded once, all
    // before the first use, so a row costs one memory round trip.
    rn_bf8 wv[MAXV];
#pragma unroll
    for (int i = 0; i < MAXV; i++) {
        int k = l + L * i;
        wv[i] = k < C8 ? w[k] : rn_bf8{{0u, 0u, 0u, 0u}};  // zero: the dot below reads every i
    }
    long long first = ((long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
    long long stride = (long long)gridDim.x * (blockDim.x >> 5) * R;
    for (long long r0 = first; r0 < N; r0 += stride) {  // uniform across the warp
        long long row = r0 + lane / L;
        bool valid = row < N;
        long long base = row * C8;
        float r = valid ? rstd[row] : 0.f;
        rn_bf8 xv[MAXV], dv[MAXV], old[MAXV];
#pragma unroll
        for (int i = 0; i < MAXV; i++) {
            int k = l + L * i;
            xv[i] = dv[i] = old[i] = rn_bf8{{0u, 0u, 0u, 0u}};
            if (valid && k < C8) {
                xv[i] = x[base + k];
                dv[i] = dy[base + k];
                if (accumulate) old[i] = dx[base + k];
            }
        }
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < MAXV; i++)
            if (l + L * i < C8)  // vectors past the row are zero: skip their products
#pragma unroll
                for (int j = 0; j < 8; j++) dot += rn_at(wv[i], j) * rn_at(dv[i], j) * (rn_at(xv[i], j) * r);
        dot = rn_sum(dot, L) / (float)C;
#pragma unroll
        for (int i = 0; i < MAXV; i++) {
            int k = l + L * i;
            if (valid && k < C8) {
                rn_bf8 o;
                float v[8];
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    float xh = rn_at(xv[i], j) * r;
                    float d = rn_at(dv[i], j);
                    v[j] = r * (rn_at(wv[i], j) * d - xh * dot);
                    if (accumulate) v[j] += rn_at(old[i], j);
                    acc[i][j] += d * xh;
                }
#pragma unroll
                for (int j = 0; j < 4; j++) o.u[j] = rn_pack(v[2 * j], v[2 * j + 1]);
                dx[base + k] = o;
            }
        }
    }
    if (dw_part) {
        int G = (blockDim.x >> 5) * R;
        float* mine = dw_s + (long long)((threadIdx.x >> 5) * R + lane / L) * C;
#pragma unroll
        for (int i = 0; i < MAXV; i++) {
            int k = l + L * i;
            if (k < C8)
#pragma unroll
                for (int j = 0; j < 8; j++) mine[8 * k + j] = acc[i][j];
        }
        __syncthreads();
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float t = 0.f;
            for (int q = 0; q < G; q++) t += dw_s[(long long)q * C + c];
            dw_part[(long long)blockIdx.x * C + c] = t;
        }
    }
}

// rmsnorm_bwd_bf16x8_c2048s is the backward for rows of 1024 < C <= 2048 elements (one warp per
// row, 8 vectors of 8 per lane) with each warp's dw partial sums in shared memory instead of
// registers, so that it fits two 256-thread blocks per SM (twice the rows in flight of
// rmsnorm_bwd_bf16x8_c2048). Shared memory: 8 warps x 2048 floats, warp-major; a warp's sum for
// column 8 (l + 32 i) + j sits at (i * 8 + j) * 32 + l, so a warp's updates hit 32 banks. The
// block's sums and dw_part are as in rmsnorm_bwd_vec.
extern "C" __global__ void __launch_bounds__(256, 2) rmsnorm_bwd_bf16x8_c2048s(rn_bf8* dx, float* dw_part, const rn_bf8* dy,
                                                                              const rn_bf8* x, const rn_bf8* w, const float* rstd,
                                                                              long long N, int C, int accumulate) {
    const int MAXV = 8, PER = MAXV * 8 * 32;
    extern __shared__ float dw_s[];
    int C8 = C >> 3, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float* mine = dw_s + warp * PER;
    if (dw_part)
        for (int e = lane; e < PER; e += 32) mine[e] = 0.f;
    long long stride = (long long)gridDim.x * 8;
    for (long long row = (long long)blockIdx.x * 8 + warp; row < N; row += stride) {
        long long base = row * C8;
        float r = rstd[row];
        rn_bf8 xv[MAXV], dv[MAXV], old[MAXV];
#pragma unroll
        for (int i = 0; i < MAXV; i++) {
            int k = lane + 32 * i;
            xv[i] = dv[i] = old[i] = rn_bf8{{0u, 0u, 0u, 0u}};
            if (k < C8) {
                xv[i] = x[base + k];
                dv[i] = dy[base + k];
                if (accumulate) old[i] = dx[base + k];
            }
        }
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < MAXV; i++) {
            int k = lane + 32 * i;
            if (k < C8) {
                rn_bf8 wv = w[k];
#pragma unroll
                for (int j = 0; j < 8; j++) dot += rn_at(wv, j) * rn_at(dv[i], j) * (rn_at(xv[i], j) * r);
            }
        }
        dot = warp_sum(dot) / (float)C;
#pragma unroll
        for (int i = 0; i < MAXV; i++) {
            int k = lane + 32 * i;
            if (k < C8) {
                rn_bf8 wv = w[k], o;
                float v[8];
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    float xh = rn_at(xv[i], j) * r;
                    float d = rn_at(dv[i], j);
                    v[j] = r * (rn_at(wv, j) * d - xh * dot);
                    if (accumulate) v[j] += rn_at(old[i], j);
                    if (dw_part) mine[(i * 8 + j) * 32 + lane] += d * xh;
                }
#pragma unroll
                for (int j = 0; j < 4; j++) o.u[j] = rn_pack(v[2 * j], v[2 * j + 1]);
                dx[base + k] = o;
            }
        }
    }
    if (!dw_part) return;
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        int k = c >> 3, e = ((k >> 5) * 8 + (c & 7)) * 32 + (k & 31);
        float t = 0.f;
        for (int q = 0; q < 8; q++) t += dw_s[q * PER + e];
        dw_part[(long long)blockIdx.x * C + c] = t;
    }
}

// dw [C] += sum over b < B of dw_part[b, c] (fp32, rounded once). Block: 256 threads = 32
// columns x 8 strided partial sums over b, added in a fixed order.
extern "C" __global__ void rmsnorm_dw_reduce(void* dw, int dtdw, const float* dw_part, int B, int C) {
    __shared__ float red[8][32];
    int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    int c = blockIdx.x * 32 + tx;
    float s = 0.f;
    if (c < C) {
#pragma unroll 4
        for (int b = ty; b < B; b += 8) s += dw_part[(long long)b * C + c];
    }
    red[ty][tx] = s;
    __syncthreads();
    if (ty == 0 && c < C) {
        float t = 0.f;
        for (int q = 0; q < 8; q++) t += red[q][tx];
        stf(dw, dtdw, c, ldf(dw, dtdw, c) + t);
    }
}

// C <= 1024 (at most 4 vectors per lane) and C <= 2048 (8).
extern "C" __global__ void rmsnorm_bwd_bf16x8_c1024(rn_bf8* dx, float* dw_part, const rn_bf8* dy, const rn_bf8* x,
                                                    const rn_bf8* w, const float* rstd, long long N, int C,
                                                    int accumulate) {
    rmsnorm_bwd_vec<4>(dx, dw_part, dy, x, w, rstd, N, C, accumulate);
}

extern "C" __global__ void __launch_bounds__(256, 1) rmsnorm_bwd_bf16x8_c2048(rn_bf8* dx, float* dw_part, const rn_bf8* dy, const rn_bf8* x,
                                                    const rn_bf8* w, const float* rstd, long long N, int C,
                                                    int accumulate) {
    rmsnorm_bwd_vec<8>(dx, dw_part, dy, x, w, rstd, N, C, accumulate);
}
