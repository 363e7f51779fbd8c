// decode.cu: one step of batched decoding on the device (backend.Optional.DecodeAttention and
// backend.Optional.SampleTokens, engine/backend/decode.go). Inference only: no backward.
//
// decode_attn: B rows, one query token each, over a slotted KV cache. Row b owns cache rows
// [b*cap, (b+1)*cap); its new token is at position p = pos[b]. One block per (row b, kv head g)
// first writes this step's key and value into cache row b*cap + p, then attends the G = NH/NKV
// query heads of the group over keys j in [lo, p] (lo = max(0, p-window+1), or 0):
//   out[b, h] = sum_j softmax_j(scale * q_h . k_j) v_j        (=)
//   lse[b, h] = log sum_j exp(scale * q_h . k_j)              (=, optional)
// Keys are taken in tiles of DEC_TILE with an online softmax, so neither the [G, p] score row
// of a long slot nor any [B, cap] matrix is ever materialised beyond one tile.
//
// sample_tokens: one token per row of logits [B, V]. Greedy at temperature 0 (first index of
// the largest logit); otherwise the Gumbel-max draw over the entries kept by top-k and top-p,
// whose thresholds are found by bisection over the order-preserving integer keys of the scaled
// logits (32 block-wide passes each), with the uniforms of backend.SampleUniform. The ids are
// always in [0, V); a row with a NaN logit gets id 0 and bad[b] = 1.

#define DEC_THREADS 256
#define DEC_TILE 128
#define DEC_MAX_ACC 32  // accumulators per thread: G*HD <= DEC_THREADS*DEC_MAX_ACC

// Shapes: q, out [B, NH*HD]; k, v [B, NKV*HD]; cache_k, cache_v [B*cap, NKV*HD] (all one dtype,
// dt); pos [B] i32; lse [B, NH] f32 or null. Dynamic shared memory: G*HD + G*DEC_TILE + 3*G
// floats.
extern "C" __global__ void __launch_bounds__(DEC_THREADS) decode_attn(void* out, float* lse, const void* q, const void* k, const void* v,
                                       void* cache_k, void* cache_v, const int* pos, int dt, int cap, int nh,
                                       int nkv, int hd, float scale, int window) {
    extern __shared__ float sm[];
    const int b = blockIdx.x, g = blockIdx.y, G = nh / nkv, GH = G * hd;
    const int p = pos[b];
    if (p < 0 || p >= cap) return;
    const long long kw = (long long)nkv * hd, qw = (long long)nh * hd;
    float* qs = sm;                    // [G, hd], pre-scaled
    float* sc = qs + GH;               // [G, DEC_TILE] scores, then probabilities
    float* mrow = sc + G * DEC_TILE;   // [G] running max
    float* lrow = mrow + G;            // [G] running sum
    float* corr = lrow + G;            // [G] rescale of this tile
    const long long slot = (long long)b * cap;
    const long long col = (long long)g * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        stf(cache_k, dt, (slot + p) * kw + col + d, ldf(k, dt, b * kw + col + d));
        stf(cache_v, dt, (slot + p) * kw + col + d, ldf(v, dt, b * kw + col + d));
    }
    for (int e = threadIdx.x; e < GH; e += blockDim.x)
        qs[e] = ldf(q, dt, b * qw + (long long)g * GH + e) * scale;
    for (int h = threadIdx.x; h < G; h += blockDim.x) {
        mrow[h] = __int_as_float(0xff800000);
        lrow[h] = 0.f;
    }
    float acc[DEC_MAX_ACC];
#pragma unroll
    for (int i = 0; i < DEC_MAX_ACC; i++) acc[i] = 0.f;
    __syncthreads();  // the cache rows written above are read below
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int lo = window > 0 ? max(0, p - window + 1) : 0;
    for (int j0 = lo; j0 <= p; j0 += DEC_TILE) {
        const int n = min(DEC_TILE, p + 1 - j0);
        // Scores: a warp per key, lanes across the head dimension.
        for (int t = warp; t < n; t += nw) {
            const long long row = (slot + j0 + t) * kw + col;
            for (int h = 0; h < G; h++) {
                float s = 0.f;
                for (int d = lane; d < hd; d += 32) s += qs[h * hd + d] * ldf(cache_k, dt, row + d);
                s = warp_sum(s);
                if (lane == 0) sc[h * DEC_TILE + t] = s;
            }
        }
        __syncthreads();
        // Online softmax: a warp per head updates its max and sum and turns scores into weights.
        for (int h = warp; h < G; h += nw) {
            float m = __int_as_float(0xff800000);
            for (int t = lane; t < n; t += 32) m = fmaxf(m, sc[h * DEC_TILE + t]);
            m = warp_max(m);
            const float mold = mrow[h], mnew = fmaxf(mold, m);
            float s = 0.f;
            for (int t = lane; t < n; t += 32) {
                float e = __expf(sc[h * DEC_TILE + t] - mnew);
                sc[h * DEC_TILE + t] = e;
                s += e;
            }
            s = warp_sum(s);
            __syncwarp();
            if (lane == 0) {
                const float c = mold == __int_as_float(0xff800000) ? 0.f : __expf(mold - mnew);
                corr[h] = c;
                lrow[h] = lrow[h] * c + s;
                mrow[h] = mnew;
            }
        }
        __syncthreads();
        // Weighted values: thread e owns output elements e, e + DEC_THREADS, ... of [G, hd].
#pragma unroll
        for (int i = 0; i < DEC_MAX_ACC; i++) {
            const int e = threadIdx.x + i * DEC_THREADS;
            if (e < GH) {
                const int h = e / hd, d = e - h * hd;
                float a = acc[i] * corr[h];
                const float* w = sc + h * DEC_TILE;
                for (int t = 0; t < n; t++) a += w[t] * ldf(cache_v, dt, (slot + j0 + t) * kw + col + d);
                acc[i] = a;
            }
        }
        __syncthreads();  // sc, corr are rewritten by the next tile
    }
#pragma unroll
    for (int i = 0; i < DEC_MAX_ACC; i++) {
        const int e = threadIdx.x + i * DEC_THREADS;
        if (e < GH) {
            const int h = e / hd;
            stf(out, dt, b * qw + (long long)g * GH + e, acc[i] / lrow[h]);
        }
    }
    if (lse != 0)
        for (int h = threadIdx.x; h < G; h += blockDim.x) lse[(long long)b * nh + g * G + h] = mrow[h] + logf(lrow[h]);
}

#define SAMPLE_THREADS 1024

__device__ __forceinline__ unsigned long long sample_mix64(unsigned long long z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// sample_key is backend.OrderedKey: an unsigned key that sorts like the float.
__device__ __forceinline__ unsigned int sample_key(float f) {
    unsigned int u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// sample_logit is entry i of the row, soft-capped when cap != 0.
__device__ __forceinline__ float sample_logit(const void* logits, int dt, long long at, float cap) {
    float l = ldf(logits, dt, at);
    if (cap != 0.f) l = cap * tanhf(l / cap);
    return l;
}

// block_argmax returns to every thread the (value, index) pair with the largest value, the lower
// index on ties. sv and si hold 32 entries each.
__device__ __forceinline__ int block_argmax(float v, int i, float* sv, int* si) {
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sv[warp] = v, si[warp] = i;
    __syncthreads();
    v = lane < nw ? sv[lane] : __int_as_float(0xff800000);
    i = lane < nw ? si[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
    }
    return i;
}

// Shapes: logits [B, V] (dt); out [B] i32 =; bad [B] i32 or null (set to 1 on a NaN row).
// One block of SAMPLE_THREADS per row.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) sample_tokens(int* out, int* bad, const void* logits, int dt, long long V, float cap,
                                         float temp, int topk, float topp, unsigned long long seed,
                                         unsigned long long step) {
    __shared__ float red[32];
    __shared__ int redi[32];
    const int b = blockIdx.x;
    const long long base = (long long)b * V;
    float nan = 0.f, mx = __int_as_float(0xff800000);
    int arg = 0x7fffffff;
    for (long long i = threadIdx.x; i < V; i += blockDim.x) {
        float l = sample_logit(logits, dt, base + i, cap);
        if (l != l) nan = 1.f;
        else if (l > mx || arg == 0x7fffffff) mx = l, arg = (int)i;
    }
    if (block_sum(nan, red) > 0.f) {
        if (threadIdx.x == 0) {
            out[b] = 0;
            if (bad != 0) bad[b] = 1;
        }
        return;
    }
    if (temp == 0.f) {
        int best = block_argmax(mx, arg, red, redi);
        if (threadIdx.x == 0) out[b] = best;
        return;
    }
    float smax = block_max(mx / temp, red);  // max of l/temp: division is monotone
    unsigned int thr = 0;
    if (topk > 0 && (long long)topk < V) {
        unsigned int lo = 0, hi = 0xffffffffu;
        while (lo < hi) {
            unsigned int mid = lo + (hi - lo) / 2 + (hi - lo) % 2;
            float c = 0.f;
            for (long long i = threadIdx.x; i < V; i += blockDim.x)
                c += sample_key(sample_logit(logits, dt, base + i, cap) / temp) >= mid ? 1.f : 0.f;
            if (block_sum(c, red) >= (float)topk) lo = mid;
            else hi = mid - 1;
        }
        thr = lo;
    }
    if (topp > 0.f && topp < 1.f) {
        float z = 0.f;
        for (long long i = threadIdx.x; i < V; i += blockDim.x) {
            float s = sample_logit(logits, dt, base + i, cap) / temp;
            if (sample_key(s) >= thr) z += expf(s - smax);
        }
        const float target = topp * block_sum(z, red);
        unsigned int lo = thr, hi = sample_key(smax);
        while (lo < hi) {
            unsigned int mid = lo + (hi - lo) / 2 + (hi - lo) % 2;
            float m = 0.f;
            for (long long i = threadIdx.x; i < V; i += blockDim.x) {
                float s = sample_logit(logits, dt, base + i, cap) / temp;
                if (sample_key(s) >= mid) m += expf(s - smax);
            }
            if (block_sum(m, red) >= target) lo = mid;
            else hi = mid - 1;
        }
        thr = lo;
    }
    const unsigned long long key = sample_mix64(sample_mix64(sample_mix64(seed) ^ (unsigned long long)b) ^ step);
    float best = __int_as_float(0xff800000);
    int bi = 0x7fffffff;
    for (long long i = threadIdx.x; i < V; i += blockDim.x) {
        float s = sample_logit(logits, dt, base + i, cap) / temp;
        if (sample_key(s) < thr) continue;
        float u = ((float)(sample_mix64(key ^ (unsigned long long)i) >> 40) + 0.5f) * (1.f / 16777216.f);
        float x = s + (-logf(-logf(u)));
        if (x > best || bi == 0x7fffffff) best = x, bi = (int)i;
    }
    int id = block_argmax(best, bi, red, redi);
    if (threadIdx.x == 0) out[b] = id == 0x7fffffff ? 0 : id;
}
