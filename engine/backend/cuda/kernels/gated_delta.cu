// gated_delta.cu: the gated delta rule, the recurrence of the gated delta-net layers
// (backend.Optional.GatedDelta and GatedDeltaBackward; engine/backend/gated_delta.go states the
// contract). Shapes: q, k [N,KH,KD], v, out, dout, dv [N,VH,VD], beta, g [N,VH] (f32 or bf16,
// each its own dtype); cu [docs+1] i32; states [ceil(N/chunk),VH,KD,VD] f32; dq, dk [N,KH,KD],
// dbeta, dg [N,VH] f32.
//   S_t = e^{g_t} S_{t-1} + k_t d_tᵀ, d_t = beta_t (v_t - (e^{g_t} S_{t-1})ᵀ k_t)
//   out_t = S_tᵀ q_t                                   (=)
//   states[t/chunk] = S_{t-1} for t % chunk == 0      (=; zero at a document's start)
//   dq, dk, dbeta, dg (+=), dv (=): the gradients
//
// One block per (value head, document), one thread per column j of the state: thread j holds
// S[:, j] (and in the backward dS[:, j]) in registers, KD <= GD_MAXKD. The columns of a state
// evolve independently (each reads only k, q, beta, g and its own v[j]), so the threads never
// wait for each other; the sums over columns in the backward (dq, dk, dbeta, dg) are atomic
// additions. The backward walks a document's stretches of chunk tokens from the last, restarts
// each from its kept state and recomputes the state before every token from there, which costs
// about chunk/2 forward steps per token and holds no per-token state.

#define GD_MAXKD 256

__device__ __forceinline__ void gd_step(float* s, const void* k, int dtk, long long koff, float decay, float beta,
                                        float vj, int KD) {
    float mem = 0.f;
#pragma unroll 8
    for (int i = 0; i < GD_MAXKD; i++) {
        if (i >= KD) break;
        s[i] *= decay;
        mem += s[i] * ldf(k, dtk, koff + i);
    }
    float delta = (vj - mem) * beta;
#pragma unroll 8
    for (int i = 0; i < GD_MAXKD; i++) {
        if (i >= KD) break;
        s[i] += ldf(k, dtk, koff + i) * delta;
    }
}

extern "C" __global__ void gated_delta_fwd(void* out, int dto, float* states, const void* q, int dtq, const void* k,
                                           int dtk, const void* v, int dtv, const void* beta, int dtb, const void* g,
                                           int dtg, const int* cu, int KH, int VH, int KD, int VD, int chunk) {
    int h = blockIdx.x, doc = blockIdx.y, j = threadIdx.x;
    if (j >= VD) return;
    int kh = h / (VH / KH);
    float s[GD_MAXKD];
    for (int i = 0; i < KD; i++) s[i] = 0.f;
    for (long long t = cu[doc]; t < cu[doc + 1]; t++) {
        if (states && t % chunk == 0) {
            float* dst = states + (((t / chunk) * VH + h) * (long long)KD) * VD;
            for (int i = 0; i < KD; i++) dst[(long long)i * VD + j] = s[i];
        }
        long long th = t * VH + h, koff = (t * KH + kh) * (long long)KD;
        gd_step(s, k, dtk, koff, expf(ldf(g, dtg, th)), ldf(beta, dtb, th), ldf(v, dtv, th * VD + j), KD);
        float o = 0.f;
        for (int i = 0; i < KD; i++) o += s[i] * ldf(q, dtq, koff + i);
        stf(out, dto, th * VD + j, o);
    }
}

extern "C" __global__ void gated_delta_bwd(float* dq, float* dk, void* dv, int dtdv, float* dbeta, float* dg,
                                           const float* states, const void* dout, int dtdo, const void* q, int dtq,
                                           const void* k, int dtk, const void* v, int dtv, const void* beta, int dtb,
                                           const void* g, int dtg, const int* cu, int KH, int VH, int KD, int VD,
                                           int chunk) {
    int h = blockIdx.x, doc = blockIdx.y, j = threadIdx.x;
    if (j >= VD) return;
    int kh = h / (VH / KH);
    long long first = cu[doc], end = cu[doc + 1];
    if (first == end) return;
    float ds[GD_MAXKD], s[GD_MAXKD];
    for (int i = 0; i < KD; i++) ds[i] = 0.f;
    for (long long c = (end - 1) / chunk; c >= first / chunk; c--) {
        long long s0 = c * chunk > first ? c * chunk : first;
        long long s1 = (c + 1) * chunk < end ? (c + 1) * chunk : end;
        for (long long t = s1 - 1; t >= s0; t--) {
            // s = S_{t-1}, recomputed from the stretch's kept state.
            const float* st = states + ((c * VH + h) * (long long)KD) * VD;
            for (int i = 0; i < KD; i++) s[i] = s0 == first ? 0.f : st[(long long)i * VD + j];
            for (long long u = s0; u < t; u++) {
                long long uh = u * VH + h;
                gd_step(s, k, dtk, (u * KH + kh) * (long long)KD, expf(ldf(g, dtg, uh)), ldf(beta, dtb, uh),
                        ldf(v, dtv, uh * VD + j), KD);
            }
            long long th = t * VH + h, koff = (t * KH + kh) * (long long)KD;
            float decay = expf(ldf(g, dtg, th)), b = ldf(beta, dtb, th), vj = ldf(v, dtv, th * VD + j);
            float doj = ldf(dout, dtdo, th * VD + j);
            // s becomes Ŝ = decay·S_{t-1}; mem = Ŝᵀk; delta; S_t = Ŝ + k·delta.
            float mem = 0.f;
            for (int i = 0; i < KD; i++) {
                s[i] *= decay;
                mem += s[i] * ldf(k, dtk, koff + i);
            }
            float delta = b * (vj - mem);
            float ddelta = 0.f;
            for (int i = 0; i < KD; i++) {
                float ki = ldf(k, dtk, koff + i);
                atomicAdd(dq + koff + i, (s[i] + ki * delta) * doj);
                ds[i] += ldf(q, dtq, koff + i) * doj;
                ddelta += ds[i] * ki;
            }
            stf(dv, dtdv, th * VD + j, b * ddelta);
            float dkv = -b * ddelta, dgt = 0.f;
            for (int i = 0; i < KD; i++) {
                float ki = ldf(k, dtk, koff + i);
                atomicAdd(dk + koff + i, ds[i] * delta + s[i] * dkv);
                float dsh = ds[i] + ki * dkv;
                dgt += s[i] * dsh;
                ds[i] = decay * dsh;
            }
            atomicAdd(dbeta + th, ddelta * (vj - mem));
            atomicAdd(dg + th, dgt);
        }
    }
}
