// dsv4_softmax.cu: DeepSeek-V4's sink softmax (backend.DSV4Ops.SinkSoftmax and
// SinkSoftmaxBackward; engine/backend/dsv4.go states the contract), the softmax of sink
// attention alone, for its composition from matrix products.
//
// Shapes: x, dp [R, S] f32 with R = N*H rows, row r = t*H + h (query t, head h); p, ds [R, S]
// float (f32 or bf16, each its own dtype); sinks, gsinks [H] float; mask [N, C] i32 (optional,
// C = S - N); lse [R] f32 ([N, H]); delta [R] f32 scratch (optional). Row r sees own key s iff
// lo(t) <= s <= t, lo(t) = max(0, t - window + 1) (0 for window 0), and compressed entry
// w = s - N iff w < (t+1)/rate and (no mask or mask[t, w] != 0): sink attention's rule.
//   lse[r]  = log(exp(sinks[h]) + sum_visible exp(x[r,s]))      (=, or read with use_lse)
//   p[r,s]  = exp(x[r,s] - lse[r]) where visible, 0 elsewhere   (=)
// Backward:
//   delta[r] = sum_s p[r,s] dp[r,s]
//   ds[r,s]  = p[r,s] (dp[r,s] - delta[r])                      (=; ds may be p)
// and gsinks from delta and lse by dsv4_attention.cu's dsv4_sink_attn_bwd_sinks (the same sum).
//
// One block per row. The forward reads only the visible spans of x (own keys [lo, t], the
// compressed entries under the causal bound), each thread keeping a running max and sum that
// the sink's logit starts (so a row that sees nothing gets lse = sinks[h] and p = 0), joins
// them by block reductions, then writes the whole row of p, reading x again only where a
// group of columns holds a visible one (the row is still in L1/L2). The backward reads p
// everywhere and dp only where p is nonzero, twice: once for delta, once to write ds. Every
// thread reads the element it writes before writing it, and the block reductions stand between
// the passes, so ds may be p. The V = 4 variants move four columns per load and store (S a
// multiple of 4 and the rows aligned: the launcher checks); the V = 1 ones take any S.

struct alignas(16) ss_f4 {
    float x, y, z, w;
};

struct alignas(8) ss_b4 {
    bf16 x, y, z, w;
};

// ss_ldx loads V consecutive f32 values.
template <int V>
__device__ __forceinline__ void ss_ldx(float* v, const float* x) {
    if (V == 4) {
        ss_f4 q = *(const ss_f4*)x;
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
        v[0] = x[0];
    }
}

// ss_ldf loads V consecutive values of a float tensor from element i.
template <int V>
__device__ __forceinline__ void ss_ldf(float* v, const void* p, int dt, long long i) {
    if (V == 4) {
        if (dt == DT_F32) {
            ss_ldx<4>(v, (const float*)p + i);
        } else {
            ss_b4 q = *(const ss_b4*)((const bf16*)p + i);
            v[0] = bf2f(q.x), v[1] = bf2f(q.y), v[2] = bf2f(q.z), v[3] = bf2f(q.w);
        }
    } else {
        v[0] = ldf(p, dt, i);
    }
}

// ss_stf stores V consecutive values into a float tensor from element i.
template <int V>
__device__ __forceinline__ void ss_stf(void* p, int dt, long long i, const float* v) {
    if (V == 4) {
        if (dt == DT_F32) {
            ss_f4 q = {v[0], v[1], v[2], v[3]};
            *(ss_f4*)((float*)p + i) = q;
        } else {
            ss_b4 q = {f2bf(v[0]), f2bf(v[1]), f2bf(v[2]), f2bf(v[3])};
            *(ss_b4*)((bf16*)p + i) = q;
        }
    } else {
        stf(p, dt, i, v[0]);
    }
}

// ss_row is which columns of one row are visible.
struct ss_row {
    int t, lo, hi, N, cend;  // own keys [lo, hi), compressed columns [N, cend)
    const int* mask;         // the row's query's mask row (nullptr: every entry)

    __device__ __forceinline__ bool vis(int s) const {
        if (s < hi) return s >= lo;
        return s >= N && s < cend && (!mask || mask[s - N] != 0);
    }
    // any reports whether columns [s, s+V) may hold a visible one.
    __device__ __forceinline__ bool any(int s, int V) const {
        return (s < hi && s + V > lo) || (s < cend && s + V > N);
    }
};

__device__ __forceinline__ ss_row ss_make_row(int r, int N, int C, int H, int window, int rate, const int* mask) {
    ss_row w;
    w.t = r / H;
    w.lo = window > 0 ? max(0, w.t - window + 1) : 0;
    w.hi = w.t + 1;
    w.N = N;
    w.cend = N + (C > 0 ? min(C, (w.t + 1) / rate) : 0);
    w.mask = mask ? mask + (long long)w.t * C : nullptr;
    return w;
}

// ss_span folds the visible columns among groups [g0, g1) into the thread's running max m and
// sum l (of exp(x - m)).
template <int V>
__device__ __forceinline__ void ss_span(float& m, float& l, const float* xr, const ss_row& w, int g0, int g1) {
    for (int g = g0 + threadIdx.x; g < g1; g += blockDim.x) {
        int s = g * V;
        float v[4];
        ss_ldx<V>(v, xr + s);
        float gm = m;
#pragma unroll
        for (int k = 0; k < V; k++) {
            if (!w.vis(s + k)) v[k] = __int_as_float(0xff800000);  // -inf: exp gives 0
            gm = fmaxf(gm, v[k]);
        }
        float a = 0.f;
#pragma unroll
        for (int k = 0; k < V; k++) a += expf(v[k] - gm);
        l = l * expf(m - gm) + a;
        m = gm;
    }
}

template <int V>
__device__ __forceinline__ void ss_fwd(void* p, int dtp, float* lse, const float* x, const void* sinks, int dts,
                                       const int* mask, int N, int C, int H, int S, int window, int rate,
                                       int use_lse) {
    __shared__ float ss_scratch[32];
    int r = blockIdx.x;
    ss_row w = ss_make_row(r, N, C, H, window, rate, mask);
    const float* xr = x + (long long)r * S;
    float ls;
    if (use_lse) {
        ls = lse[r];
    } else {
        float sk = ldf(sinks, dts, r % H), m = sk, l = 0.f;
        int ownEnd = (w.hi + V - 1) / V;  // groups of the own span; then those of the compressed
        ss_span<V>(m, l, xr, w, w.lo / V, ownEnd);
        if (w.cend > w.N) ss_span<V>(m, l, xr, w, max(ownEnd, w.N / V), (w.cend + V - 1) / V);
        float M = block_max(m, ss_scratch);
        float L = block_sum(l * expf(m - M), ss_scratch) + expf(sk - M);
        ls = M + logf(L);
        if (threadIdx.x == 0) lse[r] = ls;
    }
    long long base = (long long)r * S;
    for (int g = threadIdx.x; g < S / V; g += blockDim.x) {
        int s = g * V;
        float v[4] = {0.f, 0.f, 0.f, 0.f};
        if (w.any(s, V)) {
            ss_ldx<V>(v, xr + s);
#pragma unroll
            for (int k = 0; k < V; k++) v[k] = w.vis(s + k) ? expf(v[k] - ls) : 0.f;
        }
        ss_stf<V>(p, dtp, base + s, v);
    }
}

// dsv4_sink_softmax_fwd, dsv4_sink_softmax_fwd4: grid R, blocks of a multiple of 32 threads
// (at most 1024); the 4 variant needs S % 4 == 0 and x, p aligned to 4 elements.
extern "C" __global__ void dsv4_sink_softmax_fwd(void* p, int dtp, float* lse, const float* x, const void* sinks,
                                                 int dts, const int* mask, int N, int C, int H, int S, int window,
                                                 int rate, int use_lse) {
    ss_fwd<1>(p, dtp, lse, x, sinks, dts, mask, N, C, H, S, window, rate, use_lse);
}

extern "C" __global__ void dsv4_sink_softmax_fwd4(void* p, int dtp, float* lse, const float* x, const void* sinks,
                                                  int dts, const int* mask, int N, int C, int H, int S, int window,
                                                  int rate, int use_lse) {
    ss_fwd<4>(p, dtp, lse, x, sinks, dts, mask, N, C, H, S, window, rate, use_lse);
}

// ss_bwd_load reads columns [s, s+V) of p and, where any of them is nonzero, of dp (0
// elsewhere).
template <int V>
__device__ __forceinline__ void ss_bwd_load(float* pv, float* dv, const void* p, int dtp, const float* dp,
                                            long long i) {
    ss_ldf<V>(pv, p, dtp, i);
    bool nz = false;
#pragma unroll
    for (int k = 0; k < V; k++) nz = nz || pv[k] != 0.f;
    if (nz) {
        ss_ldx<V>(dv, dp + i);
    } else {
#pragma unroll
        for (int k = 0; k < V; k++) dv[k] = 0.f;
    }
}

template <int V>
__device__ __forceinline__ void ss_bwd(void* ds, int dtds, float* delta, const void* p, int dtp, const float* dp,
                                       int S) {
    __shared__ float ss_scratch[32];
    long long base = (long long)blockIdx.x * S;
    float a = 0.f;
    for (int g = threadIdx.x; g < S / V; g += blockDim.x) {
        float pv[4], dv[4];
        ss_bwd_load<V>(pv, dv, p, dtp, dp, base + g * V);
#pragma unroll
        for (int k = 0; k < V; k++) a += pv[k] * dv[k];
    }
    float dl = block_sum(a, ss_scratch);  // every thread's reads of p precede any write of ds
    if (delta && threadIdx.x == 0) delta[blockIdx.x] = dl;
    for (int g = threadIdx.x; g < S / V; g += blockDim.x) {
        float pv[4], dv[4];
        ss_bwd_load<V>(pv, dv, p, dtp, dp, base + g * V);
#pragma unroll
        for (int k = 0; k < V; k++) pv[k] *= dv[k] - dl;
        ss_stf<V>(ds, dtds, base + g * V, pv);
    }
}

// dsv4_sink_softmax_bwd, dsv4_sink_softmax_bwd4: grid R, blocks as the forward's; delta may be
// null; the 4 variant needs S % 4 == 0 and p, dp, ds aligned to 4 elements.
extern "C" __global__ void dsv4_sink_softmax_bwd(void* ds, int dtds, float* delta, const void* p, int dtp,
                                                 const float* dp, int S) {
    ss_bwd<1>(ds, dtds, delta, p, dtp, dp, S);
}

extern "C" __global__ void dsv4_sink_softmax_bwd4(void* ds, int dtds, float* delta, const void* p, int dtp,
                                                  const float* dp, int S) {
    ss_bwd<4>(ds, dtds, delta, p, dtp, dp, S);
}
