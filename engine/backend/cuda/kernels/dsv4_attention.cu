// dsv4_attention.cu: DeepSeek-V4's sink attention (backend.DSV4Ops.SinkAttention and
// SinkAttentionBackward; engine/backend/dsv4.go states the contract).
//
// Shapes: q, out, dout, dq [N, H*D]; kv, dkv [S, D] (the N own rows, then C = S-N compressed
// entries; the keys are also the values, one head shared by the H query heads); sinks,
// gsinks [H]; mask [N, C] i32 (optional); lse [N, H] f32; delta [N, H] f32 scratch. Float
// tensors are f32 or bf16, each its own dtype; arithmetic is fp32.
// Query t sees own key s iff lo(t) <= s <= t, lo(t) = max(0, t - window + 1) (0 for window 0),
// and compressed entry w iff w < (t+1)/rate and (no mask or mask[t, w] != 0). With
// x[t,h,s] = scale * q[t,h]·kv[s] over the visible s:
//   lse[t,h] = log(exp(sinks[h]) + sum_s exp(x))                                        (=)
//   out[t,h] = sum_s exp(x - lse) kv[s]                                                 (=)
// Backward, with p = exp(x - lse), delta = dout·out, ds = p (dout[t,h]·kv[s] - delta) scale:
//   dq[t,h] += sum_s ds kv[s]                                                          (+=)
//   dkv[s]  += sum_{t,h seeing s} p dout[t,h] + ds q[t,h]                              (+=)
//   gsinks[h] += -sum_t exp(sinks[h] - lse[t,h]) delta[t,h]                            (+=)
//
// The forward and dq kernels are one block per query row and group of heads, a warp per head;
// lane l holds elements l, l+32, ... of its head's vectors (D <= 32 * SA_DPL). The block stages
// the row's candidate keys (its window, then the compressed entries under the causal bound)
// SA_TK at a time in shared memory, marking those the mask hides, and each warp takes the
// tile's scores by warp sums. The forward keeps a running max and sum that the sink's logit
// starts, so a query that sees no key gets out 0 and lse = sinks[h]; the dq kernel has lse and
// needs neither. It also writes delta. The dkv kernel is one block per key row: its warps take
// the (query, head) pairs that see the row in turn and accumulate in registers, and the warps'
// sums are added in warp order. gsinks is one block per head. No float atomics: every sum has
// a fixed order.

#define SA_DPL 16  // head-dim elements per lane: D <= 512
#define SA_TK 16   // keys per shared-memory tile

// sa_lo is the first own key query t sees.
__device__ __forceinline__ int sa_lo(int t, int window) { return window > 0 ? max(0, t - window + 1) : 0; }

// sa_comps bounds the compressed entries query t may see: w < sa_comps (before the mask).
__device__ __forceinline__ int sa_comps(int t, int C, int rate) { return C > 0 ? min(C, (t + 1) / rate) : 0; }

// sa_stage loads the tile of candidates j0.. of query t into ki (key row, -1 where hidden or
// past the candidates) and kt [SA_TK][D]; the block's threads all call it.
__device__ __forceinline__ void sa_stage(float* kt, int* ki, int j0, int t, int lo, int nown, int cand,
                                         const void* kv, int dtk, const int* mask, int N, int C, int D) {
    __syncthreads();  // the previous tile is consumed
    if (threadIdx.x < SA_TK) {
        int j = j0 + threadIdx.x, s = -1;
        if (j < nown) s = lo + j;
        else if (j < cand) {
            int w = j - nown;
            if (!mask || mask[(long long)t * C + w] != 0) s = N + w;
        }
        ki[threadIdx.x] = s;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < SA_TK * D; e += blockDim.x) {
        int s = ki[e / D];
        kt[e] = s >= 0 ? ldf(kv, dtk, (long long)s * D + e % D) : 0.f;
    }
    __syncthreads();
}

// sa_load reads lane's elements of the D-vector at off of x into r (0 past D).
__device__ __forceinline__ void sa_load(float* r, const void* x, int dt, long long off, int D, bool live) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < SA_DPL; i++) {
        int c = lane + 32 * i;
        r[i] = live && c < D ? ldf(x, dt, off + c) : 0.f;
    }
}

// sa_dot is the warp's dot product of its lanes' r with row k of the tile.
__device__ __forceinline__ float sa_dot(const float* r, const float* kt, int k, int D) {
    int lane = threadIdx.x & 31;
    float a = 0.f;
#pragma unroll
    for (int i = 0; i < SA_DPL; i++) {
        int c = lane + 32 * i;
        if (c < D) a += r[i] * kt[k * D + c];
    }
    return warp_sum(a);
}

// dsv4_sink_attn_fwd: grid (N, ceil(H / warps)), blocks of warps * 32 threads, dynamic shared
// memory SA_TK * (D + 1) floats.
extern "C" __global__ void dsv4_sink_attn_fwd(void* out, int dto, float* lse, const void* q, int dtq, const void* kv,
                                              int dtk, const void* sinks, int dts, const int* mask, int N, int C,
                                              int H, int D, int window, int rate, float scale) {
    extern __shared__ float sa_sm[];
    float* kt = sa_sm;
    int* ki = (int*)(sa_sm + SA_TK * D);
    int t = blockIdx.x, lane = threadIdx.x & 31;
    int h = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
    bool live = h < H;
    int lo = sa_lo(t, window), nown = t + 1 - lo, cand = nown + sa_comps(t, C, rate);
    long long row = ((long long)t * H + h) * D;
    float qr[SA_DPL], acc[SA_DPL];
    sa_load(qr, q, dtq, row, D, live);
#pragma unroll
    for (int i = 0; i < SA_DPL; i++) acc[i] = 0.f;
    float m = live ? ldf(sinks, dts, h) : 0.f, l = 1.f;  // the sink: exp(sinks[h] - m) = 1
    for (int j0 = 0; j0 < cand; j0 += SA_TK) {
        sa_stage(kt, ki, j0, t, lo, nown, cand, kv, dtk, mask, N, C, D);
        if (!live) continue;
        float x[SA_TK], mt = m;
#pragma unroll
        for (int k = 0; k < SA_TK; k++) {
            x[k] = 0.f;
            if (ki[k] >= 0) {
                x[k] = scale * sa_dot(qr, kt, k, D);
                mt = fmaxf(mt, x[k]);
            }
        }
        float corr = expf(m - mt);
        l *= corr;
#pragma unroll
        for (int i = 0; i < SA_DPL; i++) acc[i] *= corr;
#pragma unroll
        for (int k = 0; k < SA_TK; k++) {
            if (ki[k] < 0) continue;
            float p = expf(x[k] - mt);
            l += p;
#pragma unroll
            for (int i = 0; i < SA_DPL; i++) {
                int c = lane + 32 * i;
                if (c < D) acc[i] += p * kt[k * D + c];
            }
        }
        m = mt;
    }
    if (!live) return;
    float inv = 1.f / l;
#pragma unroll
    for (int i = 0; i < SA_DPL; i++) {
        int c = lane + 32 * i;
        if (c < D) stf(out, dto, row + c, acc[i] * inv);
    }
    if (lane == 0) lse[(long long)t * H + h] = m + logf(l);
}

// dsv4_sink_attn_bwd_dq writes delta and adds dq; the launch of the forward.
extern "C" __global__ void dsv4_sink_attn_bwd_dq(void* dq, int dtdq, float* delta, const void* dout, int dtdo,
                                                 const void* out, int dto, const float* lse, const void* q, int dtq,
                                                 const void* kv, int dtk, const int* mask, int N, int C, int H, int D,
                                                 int window, int rate, float scale) {
    extern __shared__ float sa_sm[];
    float* kt = sa_sm;
    int* ki = (int*)(sa_sm + SA_TK * D);
    int t = blockIdx.x, lane = threadIdx.x & 31;
    int h = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
    bool live = h < H;
    int lo = sa_lo(t, window), nown = t + 1 - lo, cand = nown + sa_comps(t, C, rate);
    long long row = ((long long)t * H + h) * D;
    float qr[SA_DPL], dr[SA_DPL], acc[SA_DPL];
    sa_load(qr, q, dtq, row, D, live);
    sa_load(dr, dout, dtdo, row, D, live);
    float dl = 0.f;
#pragma unroll
    for (int i = 0; i < SA_DPL; i++) {
        int c = lane + 32 * i;
        if (live && c < D) dl += dr[i] * ldf(out, dto, row + c);
        acc[i] = 0.f;
    }
    dl = warp_sum(dl);
    float ls = live ? lse[(long long)t * H + h] : 0.f;
    for (int j0 = 0; j0 < cand; j0 += SA_TK) {
        sa_stage(kt, ki, j0, t, lo, nown, cand, kv, dtk, mask, N, C, D);
        if (!live) continue;
#pragma unroll
        for (int k = 0; k < SA_TK; k++) {
            if (ki[k] < 0) continue;
            float x = scale * sa_dot(qr, kt, k, D);
            float dp = sa_dot(dr, kt, k, D);
            float ds = expf(x - ls) * (dp - dl) * scale;
#pragma unroll
            for (int i = 0; i < SA_DPL; i++) {
                int c = lane + 32 * i;
                if (c < D) acc[i] += ds * kt[k * D + c];
            }
        }
    }
    if (!live) return;
#pragma unroll
    for (int i = 0; i < SA_DPL; i++) {
        int c = lane + 32 * i;
        if (c < D) stf(dq, dtdq, row + c, ldf(dq, dtdq, row + c) + acc[i]);
    }
    if (lane == 0) delta[(long long)t * H + h] = dl;
}

// dsv4_sink_attn_bwd_dkv adds dkv: grid S, blocks of warps * 32 threads, dynamic shared memory
// warps * D floats. Own key s is seen by queries s .. s+window-1 (to N; all later ones with
// window 0), compressed entry w by queries (w+1)*rate-1 .. N-1 that the mask lets see it.
extern "C" __global__ void dsv4_sink_attn_bwd_dkv(void* dkv, int dtdkv, const void* dout, int dtdo,
                                                  const float* delta, const float* lse, const void* q, int dtq,
                                                  const void* kv, int dtk, const int* mask, int N, int C, int H,
                                                  int D, int window, int rate, float scale) {
    extern __shared__ float sa_sm[];
    int s = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5;
    float kr[SA_DPL], acc[SA_DPL];
    sa_load(kr, kv, dtk, (long long)s * D, D, true);
#pragma unroll
    for (int i = 0; i < SA_DPL; i++) acc[i] = 0.f;
    bool own = s < N;
    int w = s - N, t0, t1 = N;
    if (own) {
        t0 = s;
        if (window > 0) t1 = min(N, s + window);
    } else {
        t0 = (w + 1) * rate - 1;
    }
    long long items = t1 > t0 ? (long long)(t1 - t0) * H : 0;
    for (long long it = warp; it < items; it += W) {
        int t = t0 + (int)(it / H), h = (int)(it % H);
        if (!own && mask && mask[(long long)t * C + w] == 0) continue;
        long long row = ((long long)t * H + h) * D;
        float qv[SA_DPL], dv[SA_DPL], a = 0.f, b = 0.f;
#pragma unroll
        for (int i = 0; i < SA_DPL; i++) {
            int c = lane + 32 * i;
            qv[i] = c < D ? ldf(q, dtq, row + c) : 0.f;
            dv[i] = c < D ? ldf(dout, dtdo, row + c) : 0.f;
            a += qv[i] * kr[i];
            b += dv[i] * kr[i];
        }
        float x = scale * warp_sum(a), dp = warp_sum(b);
        long long th = (long long)t * H + h;
        float p = expf(x - lse[th]);
        float ds = p * (dp - delta[th]) * scale;
#pragma unroll
        for (int i = 0; i < SA_DPL; i++) acc[i] += p * dv[i] + ds * qv[i];
    }
#pragma unroll
    for (int i = 0; i < SA_DPL; i++) {
        int c = lane + 32 * i;
        if (c < D) sa_sm[warp * D + c] = acc[i];
    }
    __syncthreads();
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        float a = 0.f;
        for (int v = 0; v < W; v++) a += sa_sm[v * D + c];
        long long e = (long long)s * D + c;
        stf(dkv, dtdkv, e, ldf(dkv, dtdkv, e) + a);
    }
}

// dsv4_sink_attn_bwd_sinks adds gsinks: grid H, blocks of 256 threads striding over the
// queries, one block sum per head.
extern "C" __global__ void dsv4_sink_attn_bwd_sinks(void* gsinks, int dtg, const void* sinks, int dts,
                                                    const float* delta, const float* lse, int N, int H) {
    __shared__ float scratch[32];
    int h = blockIdx.x;
    float sk = ldf(sinks, dts, h), acc = 0.f;
    for (int t = threadIdx.x; t < N; t += blockDim.x) {
        long long th = (long long)t * H + h;
        acc -= expf(sk - lse[th]) * delta[th];
    }
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) stf(gsinks, dtg, h, ldf(gsinks, dtg, h) + acc);
}
