// adamw.cu: one fused AdamW step over one parameter tensor (torch.optim.AdamW semantics).
//
// Shapes: param, grad, m, v, shadow [n]; each float tensor F32 or BF16.
//   g = grad * grad_scale
//   m = m + w1*(g - m);  v = beta2*v + w2*g*g          (torch: exp_avg.lerp_(g, 1-beta1))
//   p = p*decay;  p = p - step_size*m / (sqrt(v)/bc2_sqrt + eps)
// with w1 = 1-beta1, w2 = 1-beta2, decay = 1 - lr*wd, step_size = lr/(1-beta1^step) and
// bc2_sqrt = sqrt(1-beta2^step) computed on the host exactly as the CPU backend does (or taken
// from backend.AdamWArgs' precise fields). The operations and their order are the CPU
// backend's (engine/backend/cpu/adamw.go), each rounded once.
// param, m, v are read and written (=); shadow (optional) = the new param in shadow's dtype.
// BF16 stores round to nearest even, or stochastically with the bits of SRBits(seed, step,
// param_index, role, element) (role 0 param, 1 m, 2 v, 3 shadow), the same stream the CPU backend
// uses, so bf16 training is reproducible across backends. This is an optimizer update, not an op
// with a backward.

__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

__device__ __forceinline__ unsigned int srbits(unsigned long long seed, unsigned long long step,
                                               unsigned int param, unsigned int role, unsigned long long elem) {
    unsigned long long h = mix64(seed);
    h = mix64(h ^ step);
    h = mix64(h ^ (((unsigned long long)param << 8) | role));
    h = mix64(h ^ elem);
    return (unsigned int)(h >> 32);
}

__device__ __forceinline__ bf16 f2bf_sr(float f, unsigned int r) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u) return f2bf(f);
    u += r & 0xffffu;
    return (bf16)(u >> 16);
}

// One element of the update: every operation rounds once, in the CPU backend's order (no fused
// multiply-add), so fp32 results match it bit for bit. Returns the new p, m, v (stochastically
// rounded values are exact bf16 numbers, so the nearest-even store keeps them).
__device__ __forceinline__ void adamw_one(float& p, float& mi, float& vi, float gr, int dtp, int dtm, int dtv,
                                          float w1, float beta2, float w2, float eps, float decay,
                                          float step_size, float bc2_sqrt, float grad_scale, int stochastic,
                                          unsigned long long seed, unsigned long long step, unsigned int param_index,
                                          unsigned long long e) {
    float g = __fmul_rn(gr, grad_scale);
    float m0 = mi;
    mi = __fadd_rn(m0, __fmul_rn(w1, __fsub_rn(g, m0)));
    vi = __fadd_rn(__fmul_rn(beta2, vi), __fmul_rn(__fmul_rn(w2, g), g));
    p = __fmul_rn(p, decay);
    float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
    p = __fsub_rn(p, __fdiv_rn(__fmul_rn(step_size, mi), den));
    if (stochastic) {
        if (dtp == DT_BF16) p = bf2f(f2bf_sr(p, srbits(seed, step, param_index, 0, e)));
        if (dtm == DT_BF16) mi = bf2f(f2bf_sr(mi, srbits(seed, step, param_index, 1, e)));
        if (dtv == DT_BF16) vi = bf2f(f2bf_sr(vi, srbits(seed, step, param_index, 2, e)));
    }
}

struct alignas(16) aw_f4 { float x[4]; };
struct alignas(8) aw_b4 { bf16 x[4]; };

// aw_ld4 / aw_st4 move elements 4k..4k+3 of an F32 (16-byte aligned) or BF16 (8-byte aligned)
// tensor in one access.
__device__ __forceinline__ aw_f4 aw_ld4(const void* p, int dt, long long k) {
    aw_f4 r;
    if (dt == DT_F32) return ((const aw_f4*)p)[k];
    aw_b4 b = ((const aw_b4*)p)[k];
#pragma unroll
    for (int j = 0; j < 4; j++) r.x[j] = bf2f(b.x[j]);
    return r;
}

__device__ __forceinline__ void aw_st4(void* p, int dt, long long k, const aw_f4& v) {
    if (dt == DT_F32) {
        ((aw_f4*)p)[k] = v;
        return;
    }
    aw_b4 b;
#pragma unroll
    for (int j = 0; j < 4; j++) b.x[j] = f2bf(v.x[j]);
    ((aw_b4*)p)[k] = b;
}

// adamw_step4 is adamw_step over groups of 4 elements (n % 4 == 0; F32 tensors 16-byte and BF16
// tensors 8-byte aligned): the same arithmetic per element, with 8- and 16-byte accesses.
extern "C" __global__ void adamw_step4(void* param, int dtp, const void* grad, int dtg, void* m, int dtm,
                                       void* v, int dtv, void* shadow, int dts, long long n,
                                       float w1, float beta2, float w2, float eps, float decay,
                                       float step_size, float bc2_sqrt, float grad_scale, int stochastic,
                                       unsigned long long seed, unsigned long long step, unsigned int param_index) {
    GRID_STRIDE(k, n >> 2) {
        aw_f4 p = aw_ld4(param, dtp, k), g = aw_ld4(grad, dtg, k), mm = aw_ld4(m, dtm, k), vv = aw_ld4(v, dtv, k);
#pragma unroll
        for (int j = 0; j < 4; j++)
            adamw_one(p.x[j], mm.x[j], vv.x[j], g.x[j], dtp, dtm, dtv, w1, beta2, w2, eps, decay, step_size,
                      bc2_sqrt, grad_scale, stochastic, seed, step, param_index, (unsigned long long)(4 * k + j));
        aw_st4(param, dtp, k, p);
        aw_st4(m, dtm, k, mm);
        aw_st4(v, dtv, k, vv);
        if (shadow) {
            if (stochastic && dts == DT_BF16) {
                aw_b4 b;
#pragma unroll
                for (int j = 0; j < 4; j++) b.x[j] = f2bf_sr(p.x[j], srbits(seed, step, param_index, 3, (unsigned long long)(4 * k + j)));
                ((aw_b4*)shadow)[k] = b;
            } else {
                aw_st4(shadow, dts, k, p);
            }
        }
    }
}

extern "C" __global__ void adamw_step(void* param, int dtp, const void* grad, int dtg, void* m, int dtm,
                                      void* v, int dtv, void* shadow, int dts, long long n,
                                      float w1, float beta2, float w2, float eps, float decay,
                                      float step_size, float bc2_sqrt, float grad_scale, int stochastic,
                                      unsigned long long seed, unsigned long long step, unsigned int param_index) {
    GRID_STRIDE(i, n) {
        float p = ldf(param, dtp, i), mi = ldf(m, dtm, i), vi = ldf(v, dtv, i);
        adamw_one(p, mi, vi, ldf(grad, dtg, i), dtp, dtm, dtv, w1, beta2, w2, eps, decay, step_size, bc2_sqrt,
                  grad_scale, stochastic, seed, step, param_index, (unsigned long long)i);
        stf(param, dtp, i, p);
        stf(m, dtm, i, mi);
        stf(v, dtv, i, vi);
        if (shadow) {
            if (stochastic && dts == DT_BF16) ((bf16*)shadow)[i] = f2bf_sr(p, srbits(seed, step, param_index, 3, (unsigned long long)i));
            else stf(shadow, dts, i, p);
        }
    }
}
