// moe.cu: mixture-of-experts routing, permutation, combine, and SwiGLU and GeGLU over packed
// gate|up rows.
//
// Letters: N tokens, C hidden size, E experts, K top-k, I expert width, S = N*K routed slots
// (slot i = n*K + j is token n's j-th choice), CH = ceil(S / 1024) chunks of slots, R row
// chunks of the probability sum.
//
// Router (moe_route_fwd, one warp per token; per warp E floats of probabilities and E of scores
// in shared memory):
//   probs[n]     = softmax(logits[n]) (warp max, expf, warp sum) or sigmoid          [N,E] F32 =
//   score[n,e]   = probs[n,e] + bias[e]   (bias optional; NaN ranks below every number)
//   groups       = the topk_group best of n_group groups of E/n_group experts, a group scored by
//                  its two largest scores (one when a group holds one expert); ties to the lower
//                  (the other groups' experts score 0, as transformers' masked_fill sets them)
//   sel[n]       = the K largest scores, largest first, ties to the lower expert     [N,K] I32 =
//   weights[n,j] = probs[n,sel[n,j]] (/ sum_j probs[n,sel[n,j]] (+1e-20 sigmoid)) * scaling
//                  (* escale[sel[n,j]], escale optional)                           [N,K] F32 =
//   counts[e]   += tokens choosing e (integer atomics: the result does not depend on order) [E]
// moe_prob_sum_part, moe_prob_sum: prob_sum[e] = sum_n probs[n,e]: partial sums over R row
// chunks [R,E] (scratch), then the R partials in order                           [E] F32 =
// Backward (moe_route_bwd, one warp per token): with g = dweights, s = scaling, a[j] =
// escale[sel[n,j]] (1 without escale),
//   dp[e]  = aux[e] + s*a[j]*g[j] (sel[n,j] = e), or with norm (s*a[j]*g[j] - sum_i g[i]*w[i]) / D
//   dlogits = probs*(dp - dot(probs, dp)) (softmax) or probs*(1-probs)*dp (sigmoid)  [N,E] =
//   gq[n,e] = g[j] * s*probs[n,e] (/ D with norm) for sel[n,j] = e, else 0  [N,E] F32 = (optional)
// and dscale[e] = sum_n gq[n,e] by moe_prob_sum_part and moe_prob_sum, as prob_sum  [E] F32 =
//
// Permutation, a stable counting sort by expert in three passes and a gather:
//   moe_hist     hist[ch,e]  = slots of chunk ch choosing e                    [CH,E] I32 (scratch)
//   moe_scan     hist[ch,e] <- slots of chunks before ch choosing e; offsets [E+1] =
//   moe_scatter  pos = offsets[sel] + hist[ch,sel] + earlier slots of the chunk choosing the
//                same expert;
//                order[pos] = n [S] I32 =, slot[n,j] = pos [N,K] I32 =
//   moe_gather_* xs[p] = x[order[p]]                                            [S,C] =
// moe_unpermute_bwd: dx[n] (+)= sum_j dxs[slot[n,j]] in increasing j, fp32      [N,C]
// moe_combine:       out[n] (+)= sum_j w[n,j] * ys[slot[n,j]] in increasing j, fp32 [N,C]
// moe_combine_bwd (one block per token): dys[slot[n,j]] = w[n,j]*dout[n] [S,C] =;
//                    dw[n,j] = dot(dout[n], ys[slot[n,j]]) (block tree, fixed order) [N,K] F32 =
// swiglu_packed_fwd: out[r,i] = silu(gu[r,i]) * gu[r,I+i]                       [R,I] =
// swiglu_packed_bwd: dgu[r,i], dgu[r,I+i] from dout [R,I] and gu [R,2I] (=, may alias gu)
// geglu_packed_fwd:  out[r,i] = gelu_tanh(gu[r,i]) * gu[r,I+i]                  [R,I] =
// geglu_packed_bwd:  dgu[r,i], dgu[r,I+i] from dout and gu, as geglu.cu's geglu_bwd (=, may alias gu)
//
// Nothing uses floating-point atomics or scatter-adds, so every result is deterministic. Nothing
// reads sizes back to the host: offsets stay on the device for the grouped GEMM.

#define MOE_NAN __int_as_float(0x7fffffff)
#define MOE_NEG_INF __int_as_float(0xff800000)

// moe_better reports whether (v, i) ranks before (bv, bi): larger value, then lower index.
__device__ __forceinline__ bool moe_better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

// moe_warp_argmax returns, to every lane, the best (value, index) over the lanes' candidates
// (index INT_MAX: none).
__device__ __forceinline__ void moe_warp_argmax(float& v, int& i) {
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (moe_better(ov, oi, v, i)) { v = ov; i = oi; }
    }
}

// moe_pick removes and returns the best live entry of sc[0..n) (a NaN entry is removed); every
// lane gets the same index (or -1 when none is live).
__device__ __forceinline__ int moe_pick(float* sc, int n, int lane) {
    float bv = MOE_NEG_INF;
    int bi = 0x7fffffff;
    for (int e = lane; e < n; e += 32) {
        float v = sc[e];
        if (v == v && moe_better(v, e, bv, bi)) { bv = v; bi = e; }
    }
    moe_warp_argmax(bv, bi);
    if (bi == 0x7fffffff) return -1;
    __syncwarp();
    if (lane == 0) sc[bi] = MOE_NAN;
    __syncwarp();
    return bi;
}

// Shared memory: per warp E floats of probabilities and E of scores, then (grouped) n_group of
// group scores.
extern "C" __global__ void moe_route_fwd(const void* logits, int dtl,  // [N,E]
                                         const float* bias,             // [E] or null
                                         float* probs,                  // [N,E]
                                         int* sel,                      // [N,K]
                                         float* weights,                // [N,K]
                                         int* counts,                   // [E] or null
                                         const float* escale,           // [E] or null
                                         int N, int E, int K, int sigmoid, int norm, float scaling,
                                         int n_group, int topk_group) {
    extern __shared__ float moe_sh[];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int per_warp = 2 * E + (n_group > 1 ? n_group : 0);
    float* p = moe_sh + warp * per_warp;
    float* sc = p + E;
    float* gs = sc + E;
    for (int n = blockIdx.x * nw + warp; n < N; n += gridDim.x * nw) {
        long long row = (long long)n * E;
        if (sigmoid) {
            for (int e = lane; e < E; e += 32) p[e] = 1.f / (1.f + expf(-ldf(logits, dtl, row + e)));
        } else {
            float mx = MOE_NEG_INF;
            for (int e = lane; e < E; e += 32) mx = fmaxf(mx, ldf(logits, dtl, row + e));
            mx = warp_max(mx);
            float s = 0.f;
            for (int e = lane; e < E; e += 32) {
                float x = expf(ldf(logits, dtl, row + e) - mx);
                p[e] = x;
                s += x;
            }
            s = warp_sum(s);
            __syncwarp();
            for (int e = lane; e < E; e += 32) p[e] = p[e] / s;
        }
        __syncwarp();
        for (int e = lane; e < E; e += 32) {
            float v = p[e] + (bias ? bias[e] : 0.f);
            sc[e] = v == v ? v : MOE_NEG_INF;
            probs[row + e] = p[e];
        }
        __syncwarp();
        if (n_group > 1) {
            int per = E / n_group;
            for (int g = lane; g < n_group; g += 32) {
                float a = MOE_NEG_INF, b = MOE_NEG_INF;
                for (int e = g * per; e < (g + 1) * per; e++) {
                    float v = sc[e];
                    if (v > a) { b = a; a = v; }
                    else if (v > b) b = v;
                }
                gs[g] = per == 1 ? a : a + b;
            }
            __syncwarp();
            // Pick the kept groups (marked NaN in gs), then score the experts of the others 0.
            for (int t = 0; t < topk_group; t++) {
                int g = moe_pick(gs, n_group, lane);
                (void)g;
            }
            for (int e = lane; e < E; e += 32)
                if (gs[e / per] == gs[e / per]) sc[e] = 0.f;
            __syncwarp();
        }
        float sum = 0.f;
        for (int j = 0; j < K; j++) {
            int e = moe_pick(sc, E, lane);
            if (e < 0) e = 0; // unreachable with enough live experts; keeps indices in range
            if (lane == 0) {
                sel[(long long)n * K + j] = e;
                weights[(long long)n * K + j] = p[e];
                if (counts) atomicAdd(&counts[e], 1);
            }
            sum += p[e];
        }
        if (sigmoid) sum += 1e-20f;
        if (lane == 0) {
            for (int j = 0; j < K; j++) {
                long long q = (long long)n * K + j;
                float w = weights[q];
                if (norm) w = w / sum;
                w = w * scaling;
                if (escale) w = w * escale[sel[q]];
                weights[q] = w;
            }
        }
        __syncwarp();
    }
}

// Block (x, y) = (32 experts, row chunk y) of 32x8 threads: thread (tx, ty) sums rows
// lo+ty, lo+ty+8, ... < hi of expert 32x+tx; the 8 partial sums are added in order.
extern "C" __global__ void moe_prob_sum_part(const float* probs, float* part, int N, int E, int rows_per_chunk) {
    __shared__ float acc[8][33];
    int e = blockIdx.x * 32 + threadIdx.x;
    int lo = blockIdx.y * rows_per_chunk, hi = min(N, lo + rows_per_chunk);
    float s = 0.f;
    if (e < E)
        for (int n = lo + threadIdx.y; n < hi; n += 8) s += probs[(long long)n * E + e];
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && e < E) {
        float t = 0.f;
        for (int y = 0; y < 8; y++) t += acc[y][threadIdx.x];
        part[(long long)blockIdx.y * E + e] = t;
    }
}

extern "C" __global__ void moe_prob_sum(const float* part, float* prob_sum, int R, int E) {
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= E) return;
    float t = 0.f;
    for (int r = 0; r < R; r++) t += part[(long long)r * E + e];
    prob_sum[e] = t;
}

// Shared memory: per warp E floats of dp.
extern "C" __global__ void moe_route_bwd(const float* probs,    // [N,E]
                                         const int* sel,        // [N,K]
                                         const float* weights,  // [N,K]
                                         const float* dweights, // [N,K]
                                         const float* aux,      // [E] or null
                                         void* dlogits, int dtd, // [N,E]
                                         const float* escale,   // [E] or null
                                         float* gq,             // [N,E] or null: dscale's terms
                                         int N, int E, int K, int sigmoid, int norm, float scaling) {
    extern __shared__ float moe_sh[];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float* dp = moe_sh + warp * E;
    for (int n = blockIdx.x * nw + warp; n < N; n += gridDim.x * nw) {
        long long row = (long long)n * E, krow = (long long)n * K;
        for (int e = lane; e < E; e += 32) dp[e] = aux ? aux[e] : 0.f;
        float d = 0.f, dot = 0.f;
        if (norm) {
            for (int j = lane; j < K; j += 32) {
                int e = sel[krow + j];
                d += (e >= 0 && e < E) ? probs[row + e] : 0.f;
                dot += dweights[krow + j] * weights[krow + j];
            }
            d = warp_sum(d);
            dot = warp_sum(dot);
            if (sigmoid) d += 1e-20f;
        }
        __syncwarp();
        // A token's choices are distinct experts: lanes add into different dp entries.
        for (int j = lane; j < K; j += 32) {
            int e = sel[krow + j];
            if (e < 0 || e >= E) continue;
            float g = scaling * dweights[krow + j];
            if (escale) g = g * escale[e];
            dp[e] += norm ? (g - dot) / d : g;
        }
        __syncwarp();
        if (gq) {
            // Each lane writes its experts' entries: the term of the slot choosing e, or 0.
            for (int e = lane; e < E; e += 32) {
                float v = 0.f;
                for (int j = 0; j < K; j++)
                    if (sel[krow + j] == e) {
                        float q = scaling * probs[row + e];
                        if (norm) q = q / d;
                        v = dweights[krow + j] * q;
                    }
                gq[row + e] = v;
            }
        }
        if (sigmoid) {
            for (int e = lane; e < E; e += 32) {
                float pv = probs[row + e];
                stf(dlogits, dtd, row + e, pv * (1.f - pv) * dp[e]);
            }
        } else {
            float s = 0.f;
            for (int e = lane; e < E; e += 32) s += probs[row + e] * dp[e];
            s = warp_sum(s);
            for (int e = lane; e < E; e += 32) {
                float pv = probs[row + e];
                stf(dlogits, dtd, row + e, pv * (dp[e] - s));
            }
        }
        __syncwarp();
    }
}

// 1024 threads per chunk of 1024 slots; shared memory E ints.
extern "C" __global__ void moe_hist(const int* sel, int* hist, int S, int E) {
    extern __shared__ int moe_h[];
    for (int e = threadIdx.x; e < E; e += blockDim.x) moe_h[e] = 0;
    __syncthreads();
    int i = blockIdx.x * 1024 + threadIdx.x;
    if (i < S) {
        int e = sel[i];
        if (e >= 0 && e < E) atomicAdd(&moe_h[e], 1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) hist[(long long)blockIdx.x * E + e] = moe_h[e];
}

// One block; shared memory E+1 ints. Thread e turns expert e's column into its exclusive
// prefix over the chunks (eight loads in flight at a time), then the expert totals are scanned
// into offsets.
extern "C" __global__ void moe_scan(int* hist, int* offsets, int CH, int E) {
    extern __shared__ int moe_t[];
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int run = 0;
        for (int c0 = 0; c0 < CH; c0 += 8) {
            int v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) v[u] = c0 + u < CH ? hist[(long long)(c0 + u) * E + e] : 0;
#pragma unroll
            for (int u = 0; u < 8; u++) {
                if (c0 + u < CH) hist[(long long)(c0 + u) * E + e] = run;
                run += v[u];
            }
        }
        moe_t[e] = run;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0;
        for (int e = 0; e < E; e++) {
            offsets[e] = run;
            run += moe_t[e];
        }
        offsets[E] = run;
    }
}

// 1024 threads per chunk of 1024 slots.
extern "C" __global__ void moe_scatter(const int* sel, const int* hist, const int* offsets, int* order, int* slot,
                                       int S, int K, int E) {
    __shared__ int s[1024];
    int t = threadIdx.x, i = blockIdx.x * 1024 + t;
    s[t] = i < S ? sel[i] : -1;
    __syncthreads();
    if (i >= S) return;
    int e = s[t];
    if (e < 0 || e >= E) {
        slot[i] = -1;
        return;
    }
    int rank = 0;
    for (int j = 0; j < t; j++) rank += s[j] == e;
    int pos = offsets[e] + hist[(long long)blockIdx.x * E + e] + rank;
    order[pos] = i / K;
    slot[i] = pos;
}

// xs[p] = x[order[p]], moving 16-byte units (u16 = row bytes / 16 per row), 4-byte or 2-byte words.
struct alignas(16) moe_v16 { unsigned int u[4]; };

extern "C" __global__ void moe_gather_v16(moe_v16* xs, const moe_v16* x, const int* order, long long S, long long u) {
    GRID_STRIDE(i, S * u) {
        long long p = i / u, c = i - p * u;
        xs[i] = x[(long long)order[p] * u + c];
    }
}

extern "C" __global__ void moe_gather_u32(unsigned int* xs, const unsigned int* x, const int* order, long long S, long long u) {
    GRID_STRIDE(i, S * u) {
        long long p = i / u, c = i - p * u;
        xs[i] = x[(long long)order[p] * u + c];
    }
}

extern "C" __global__ void moe_gather_u16(unsigned short* xs, const unsigned short* x, const int* order, long long S, long long u) {
    GRID_STRIDE(i, S * u) {
        long long p = i / u, c = i - p * u;
        xs[i] = x[(long long)order[p] * u + c];
    }
}

extern "C" __global__ void moe_unpermute_bwd(void* dx, int dtx,          // [N,C]
                                             const void* dxs, int dts,   // [S,C]
                                             const int* slot,            // [N,K]
                                             long long N, int C, int K, int accumulate) {
    GRID_STRIDE(i, N * C) {
        long long n = i / C, c = i - n * C;
        float acc = 0.f;
        for (int j = 0; j < K; j++) acc += ldf(dxs, dts, (long long)slot[n * K + j] * C + c);
        if (accumulate) acc = ldf(dx, dtx, i) + acc;
        stf(dx, dtx, i, acc);
    }
}

extern "C" __global__ void moe_combine(void* out, int dto,            // [N,C]
                                       const void* ys, int dty,       // [S,C]
                                       const int* slot,               // [N,K]
                                       const float* w,                // [N,K]
                                       long long N, int C, int K, int accumulate) {
    GRID_STRIDE(i, N * C) {
        long long n = i / C, c = i - n * C;
        float acc = 0.f;
        for (int j = 0; j < K; j++) acc += w[n * K + j] * ldf(ys, dty, (long long)slot[n * K + j] * C + c);
        if (accumulate) acc = ldf(out, dto, i) + acc;
        stf(out, dto, i, acc);
    }
}

// One block (a multiple of 32 threads) per token.
extern "C" __global__ void moe_combine_bwd(void* dys, int dtdy,          // [S,C]
                                           float* dw,                    // [N,K]
                                           const void* dout, int dtdo,   // [N,C]
                                           const void* ys, int dty,      // [S,C]
                                           const int* slot,              // [N,K]
                                           const float* w,               // [N,K]
                                           int C, int K) {
    __shared__ float scratch[32];
    long long n = blockIdx.x;
    for (int j = 0; j < K; j++) {
        long long q = n * K + j;
        long long p = slot[q];
        float wj = w[q], acc = 0.f;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float d = ldf(dout, dtdo, n * C + c);
            acc += d * ldf(ys, dty, p * C + c);
            stf(dys, dtdy, p * C + c, wj * d);
        }
        acc = block_sum(acc, scratch);
        if (threadIdx.x == 0) dw[q] = acc;
    }
}

extern "C" __global__ void swiglu_packed_fwd(void* out, int dto, const void* gu, int dtg, long long R, int I) {
    GRID_STRIDE(i, R * I) {
        long long r = i / I, c = i - r * I;
        float g = ldf(gu, dtg, r * 2 * I + c), u = ldf(gu, dtg, r * 2 * I + I + c);
        float sg = 1.f / (1.f + expf(-g));
        stf(out, dto, i, g * sg * u);
    }
}

extern "C" __global__ void swiglu_packed_bwd(void* dgu, int dtdg, const void* dout, int dtdo, const void* gu, int dtg,
                                             long long R, int I) {
    GRID_STRIDE(i, R * I) {
        long long r = i / I, c = i - r * I;
        long long ig = r * 2 * I + c, iu = ig + I;
        float g = ldf(gu, dtg, ig), u = ldf(gu, dtg, iu), d = ldf(dout, dtdo, i);
        float sg = 1.f / (1.f + expf(-g));
        // both inputs are read before either output is written: dgu may be gu
        stf(dgu, dtdg, ig, d * u * sg * (1.f + g * (1.f - sg)));
        stf(dgu, dtdg, iu, d * g * sg);
    }
}

// gelu_tanh(g) and its derivative in *d: the arithmetic of geglu.cu's gg_eval.
#define MOE_GELU_C 0.7978845608028654f
__device__ __forceinline__ float moe_gelu(float g, float* d) {
    float t = tanhf(MOE_GELU_C * (g + 0.044715f * g * g * g));
    *d = 0.5f * (1.f + t) + 0.5f * g * (1.f - t * t) * MOE_GELU_C * (1.f + 3.f * 0.044715f * g * g);
    return 0.5f * g * (1.f + t);
}

extern "C" __global__ void geglu_packed_fwd(void* out, int dto, const void* gu, int dtg, long long R, int I) {
    GRID_STRIDE(i, R * I) {
        long long r = i / I, c = i - r * I;
        float g = ldf(gu, dtg, r * 2 * I + c), u = ldf(gu, dtg, r * 2 * I + I + c);
        float d;
        stf(out, dto, i, moe_gelu(g, &d) * u);
    }
}

extern "C" __global__ void geglu_packed_bwd(void* dgu, int dtdg, const void* dout, int dtdo, const void* gu, int dtg,
                                            long long R, int I) {
    GRID_STRIDE(i, R * I) {
        long long r = i / I, c = i - r * I;
        long long ig = r * 2 * I + c, iu = ig + I;
        float g = ldf(gu, dtg, ig), u = ldf(gu, dtg, iu), o = ldf(dout, dtdo, i);
        float d;
        float y = moe_gelu(g, &d);
        // both inputs are read before either output is written: dgu may be gu
        stf(dgu, dtdg, ig, o * u * d);
        stf(dgu, dtdg, iu, o * y);
    }
}

// Vectorised bf16 forms of the combine, the gather's backward, the combine's backward and the
// packed SwiGLU and GeGLU, for bf16 rows whose width is a multiple of 8 and 16-byte aligned addresses: a
// thread moves 8 elements per 16-byte access. Same arithmetic in the same order as the scalar
// kernels above, so the results are identical, except the combine backward's dw, whose block
// sum takes the elements in another order.
__device__ __forceinline__ void moe_unpack8(moe_v16 v, float* f) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
        f[2 * k] = __uint_as_float(v.u[k] << 16);
        f[2 * k + 1] = __uint_as_float(v.u[k] & 0xffff0000u);
    }
}

__device__ __forceinline__ moe_v16 moe_pack8(const float* f) {
    moe_v16 v;
#pragma unroll
    for (int k = 0; k < 4; k++) v.u[k] = (unsigned int)f2bf(f[2 * k]) | ((unsigned int)f2bf(f[2 * k + 1]) << 16);
    return v;
}

// C8 = C / 8 vectors per row.
extern "C" __global__ void moe_combine_bf16x8(moe_v16* out, const moe_v16* ys, const int* slot, const float* w,
                                              long long N, int C8, int K, int accumulate) {
    GRID_STRIDE(i, N * C8) {
        long long n = i / C8, c = i - n * C8;
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, y[8];
        for (int j = 0; j < K; j++) {
            float wj = w[n * K + j];
            moe_unpack8(ys[(long long)slot[n * K + j] * C8 + c], y);
#pragma unroll
            for (int k = 0; k < 8; k++) acc[k] += wj * y[k];
        }
        if (accumulate) {
            moe_unpack8(out[i], y);
#pragma unroll
            for (int k = 0; k < 8; k++) acc[k] = y[k] + acc[k];
        }
        out[i] = moe_pack8(acc);
    }
}

extern "C" __global__ void moe_unpermute_bwd_bf16x8(moe_v16* dx, const moe_v16* dxs, const int* slot, long long N, int C8,
                                                    int K, int accumulate) {
    GRID_STRIDE(i, N * C8) {
        long long n = i / C8, c = i - n * C8;
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, y[8];
        for (int j = 0; j < K; j++) {
            moe_unpack8(dxs[(long long)slot[n * K + j] * C8 + c], y);
#pragma unroll
            for (int k = 0; k < 8; k++) acc[k] += y[k];
        }
        if (accumulate) {
            moe_unpack8(dx[i], y);
#pragma unroll
            for (int k = 0; k < 8; k++) acc[k] = y[k] + acc[k];
        }
        dx[i] = moe_pack8(acc);
    }
}

// One block (a multiple of 32 threads) per token.
extern "C" __global__ void moe_combine_bwd_bf16x8(moe_v16* dys, float* dw, const moe_v16* dout, const moe_v16* ys,
                                                  const int* slot, const float* w, int C8, int K) {
    __shared__ float scratch[32];
    long long n = blockIdx.x;
    for (int j = 0; j < K; j++) {
        long long q = n * K + j;
        long long p = slot[q];
        float wj = w[q], acc = 0.f, d[8], y[8];
        for (int c = threadIdx.x; c < C8; c += blockDim.x) {
            moe_unpack8(dout[n * C8 + c], d);
            moe_unpack8(ys[p * C8 + c], y);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                acc += d[k] * y[k];
                d[k] = wj * d[k];
            }
            dys[p * C8 + c] = moe_pack8(d);
        }
        acc = block_sum(acc, scratch);
        if (threadIdx.x == 0) dw[q] = acc;
    }
}

// I8 = I / 8 vectors per half row.
extern "C" __global__ void swiglu_packed_fwd_bf16x8(moe_v16* out, const moe_v16* gu, long long R, int I8) {
    GRID_STRIDE(i, R * I8) {
        long long r = i / I8, c = i - r * I8;
        float g[8], u[8];
        moe_unpack8(gu[r * 2 * I8 + c], g);
        moe_unpack8(gu[r * 2 * I8 + I8 + c], u);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float sg = 1.f / (1.f + expf(-g[k]));
            g[k] = g[k] * sg * u[k];
        }
        out[i] = moe_pack8(g);
    }
}

extern "C" __global__ void swiglu_packed_bwd_bf16x8(moe_v16* dgu, const moe_v16* dout, const moe_v16* gu, long long R, int I8) {
    GRID_STRIDE(i, R * I8) {
        long long r = i / I8, c = i - r * I8;
        long long ig = r * 2 * I8 + c, iu = ig + I8;
        float g[8], u[8], d[8], dg[8], du[8];
        moe_unpack8(gu[ig], g);
        moe_unpack8(gu[iu], u);
        moe_unpack8(dout[i], d);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float sg = 1.f / (1.f + expf(-g[k]));
            dg[k] = d[k] * u[k] * sg * (1.f + g[k] * (1.f - sg));
            du[k] = d[k] * g[k] * sg;
        }
        // both vectors were read above: dgu may be gu
        dgu[ig] = moe_pack8(dg);
        dgu[iu] = moe_pack8(du);
    }
}

extern "C" __global__ void geglu_packed_fwd_bf16x8(moe_v16* out, const moe_v16* gu, long long R, int I8) {
    GRID_STRIDE(i, R * I8) {
        long long r = i / I8, c = i - r * I8;
        float g[8], u[8];
        moe_unpack8(gu[r * 2 * I8 + c], g);
        moe_unpack8(gu[r * 2 * I8 + I8 + c], u);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float d;
            g[k] = moe_gelu(g[k], &d) * u[k];
        }
        out[i] = moe_pack8(g);
    }
}

extern "C" __global__ void geglu_packed_bwd_bf16x8(moe_v16* dgu, const moe_v16* dout, const moe_v16* gu, long long R, int I8) {
    GRID_STRIDE(i, R * I8) {
        long long r = i / I8, c = i - r * I8;
        long long ig = r * 2 * I8 + c, iu = ig + I8;
        float g[8], u[8], o[8], dg[8], du[8];
        moe_unpack8(gu[ig], g);
        moe_unpack8(gu[iu], u);
        moe_unpack8(dout[i], o);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float d;
            float y = moe_gelu(g[k], &d);
            dg[k] = o[k] * u[k] * d;
            du[k] = o[k] * y;
        }
        // both vectors were read above: dgu may be gu
        dgu[ig] = moe_pack8(dg);
        dgu[iu] = moe_pack8(du);
    }
}
