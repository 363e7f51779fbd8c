// crossentropy.cu: the per-row part of the fused LM head + cross-entropy.
//
// The Go side computes one chunk of logits [R, V] fp32 = hidden[rows] @ weight^T with cuBLASLt,
// calls ce_rows, then (backward) dhidden[rows] = dlogits @ weight (=) and
// dweight += dlogits^T @ hidden[rows] (+=). Only one chunk of logits exists at a time; the full
// [N, V] logits are never materialised.
//
// ce_rows, one block per row r of the chunk (global row n = row0 + r):
//   lse = log(sum_v exp(logits[r, v]));  logprob[n] = logits[r, t] - lse;  loss[n] = -logprob[n]
//   dlogits[r, v] = s * (softmax[r, v] - [v == t])   (=, written when dlogits is not null)
//   with s = scale * token_scale[n] when token_scale is not null, else scale
// Rows whose target is ignore_index get loss = logprob = 0 and zero gradient. A target outside
// [0, V) that is not ignore_index records the smallest bad n in *bad (initialised to N).
// With cap > 0 every logit is first capped, x = cap * tanh(x / cap) (final_logit_softcapping),
// and dlogits carries the cap's derivative: scale * (softmax - onehot) * (1 - tanh^2); the
// capped logits are recomputed on each read and never stored.
// The logits are fp32 or bf16 (dtl: HALO_CE_LOGITS=bf16 has the logits GEMM round them to bf16,
// as transformers' bf16 LM head does before its fp32 loss); every sum is fp32. Each logit is read
// once for lse (a running max and rescaled sum) and once more for dlogits; with V a multiple of 4
// the reads are 16-byte (fp32) or 8-byte (bf16) and the bf16 dlogits stores 8-byte. dlogits may
// alias logits when both have the same dtype (each thread rewrites only the elements it read,
// after the barrier that follows thread 0's read of the target's logit).

struct alignas(16) ce_f4 { float x, y, z, w; };
struct alignas(8) ce_u2 { unsigned int x, y; };
struct alignas(16) ce_out4 { float x, y, z, w; };

// ce_ld4 reads logits 4k..4k+3 of a row of dtype dtl (V a multiple of 4).
__device__ __forceinline__ ce_f4 ce_ld4(const void* row, int dtl, int k) {
    if (dtl == DT_F32) return ((const ce_f4*)row)[k];
    ce_u2 u = ((const ce_u2*)row)[k];
    ce_f4 x;
    x.x = bf2f((bf16)(u.x & 0xffffu));
    x.y = bf2f((bf16)(u.x >> 16));
    x.z = bf2f((bf16)(u.y & 0xffffu));
    x.w = bf2f((bf16)(u.y >> 16));
    return x;
}

// ce_add folds x into the running (max m, sum s of exp(v - m)).
__device__ __forceinline__ void ce_add(float& m, float& s, float x) {
    if (x > m) {
        s = s * expf(m - x) + 1.f;
        m = x;
    } else {
        s += expf(x - m);
    }
}

// ce_merge folds (m2, s2) into (m, s); an empty side has m = -inf and s = 0.
__device__ __forceinline__ void ce_merge(float& m, float& s, float m2, float s2) {
    if (s2 == 0.f) return;
    if (s == 0.f) { m = m2; s = s2; return; }
    float M = fmaxf(m, m2);
    s = s * expf(m - M) + s2 * expf(m2 - M);
    m = M;
}

// ce_block_lse returns log(sum exp) over the block's (m, s) pairs to every thread.
__device__ __forceinline__ float ce_block_lse(float m, float s) {
    __shared__ float sm[32], ss[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        float s2 = __shfl_xor_sync(0xffffffffu, s, o);
        ce_merge(m, s, m2, s2);
    }
    if (lane == 0) { sm[warp] = m; ss[warp] = s; }
    __syncthreads();
    m = lane < nw ? sm[lane] : __int_as_float(0xff800000);
    s = lane < nw ? ss[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        float s2 = __shfl_xor_sync(0xffffffffu, s, o);
        ce_merge(m, s, m2, s2);
    }
    return m + logf(s);
}

// ce_cap returns the capped logit (x itself when cap is 0).
__device__ __forceinline__ float ce_cap(float x, float cap) {
    return cap > 0.f ? cap * tanhf(x / cap) : x;
}

// ce_grad is the gradient of the loss at raw logit x (the cap's derivative included).
__device__ __forceinline__ float ce_grad(float x, float lse, float scale, int v, int t, bool ignored, float cap) {
    if (ignored) return 0.f;
    float d = 1.f;
    if (cap > 0.f) {
        float th = tanhf(x / cap);
        x = cap * th;
        d = 1.f - th * th;
    }
    return scale * (expf(x - lse) - (v == t ? 1.f : 0.f)) * d;
}

extern "C" __global__ void ce_rows(const void* logits, int dtl, const int* targets, float* loss, float* logprob,
                                   void* dlogits, int dtdl, float scale, const float* token_scale,
                                   long long row0, int V, int ignore_index, int* bad, float cap) {
    long long r = blockIdx.x;
    long long n = row0 + r;
    const long long rowOff = r * (long long)V;
    const void* lr = dtl == DT_F32 ? (const void*)((const float*)logits + rowOff) : (const void*)((const bf16*)logits + rowOff);
    int t = targets[n];
    bool ignored = (t == ignore_index);
    if (!ignored && (t < 0 || t >= V)) {
        if (threadIdx.x == 0) atomicMin(bad, (int)n);
        ignored = true;
    }
    bool vec = (V & 3) == 0;
    int V4 = V >> 2;
    float m = __int_as_float(0xff800000), s = 0.f;
    if (vec) {
        for (int k = threadIdx.x; k < V4; k += blockDim.x) {
            ce_f4 x = ce_ld4(lr, dtl, k);
            ce_add(m, s, ce_cap(x.x, cap));
            ce_add(m, s, ce_cap(x.y, cap));
            ce_add(m, s, ce_cap(x.z, cap));
            ce_add(m, s, ce_cap(x.w, cap));
        }
    } else {
        for (int v = threadIdx.x; v < V; v += blockDim.x) ce_add(m, s, ce_cap(ldf(lr, dtl, v), cap));
    }
    float lse = ce_block_lse(m, s);
    if (threadIdx.x == 0) {
        float lp = ignored ? 0.f : ce_cap(ldf(lr, dtl, t), cap) - lse;
        if (loss) loss[n] = -lp;
        if (logprob) logprob[n] = lp;
    }
    if (!dlogits) return;
    if (token_scale) scale *= token_scale[n];
    // dlogits may alias logits: no thread may store before thread 0 has read the target's logit.
    __syncthreads();
    if (vec) {
        for (int k = threadIdx.x; k < V4; k += blockDim.x) {
            ce_f4 x = ce_ld4(lr, dtl, k);
            int v = 4 * k;
            float g0 = ce_grad(x.x, lse, scale, v, t, ignored, cap);
            float g1 = ce_grad(x.y, lse, scale, v + 1, t, ignored, cap);
            float g2 = ce_grad(x.z, lse, scale, v + 2, t, ignored, cap);
            float g3 = ce_grad(x.w, lse, scale, v + 3, t, ignored, cap);
            if (dtdl == DT_F32) {
                ce_out4 o = {g0, g1, g2, g3};
                ((ce_out4*)dlogits)[r * V4 + k] = o;
            } else {
                ce_u2 o = {(unsigned int)f2bf(g0) | ((unsigned int)f2bf(g1) << 16),
                           (unsigned int)f2bf(g2) | ((unsigned int)f2bf(g3) << 16)};
                ((ce_u2*)dlogits)[r * V4 + k] = o;
            }
        }
    } else {
        for (int v = threadIdx.x; v < V; v += blockDim.x)
            stf(dlogits, dtdl, rowOff + v, ce_grad(ldf(lr, dtl, v), lse, scale, v, t, ignored, cap));
    }
}
