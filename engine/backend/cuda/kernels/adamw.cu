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

extern "C" __global__ void adamw_step(void* param, int dtp, const void* grad, int dtg, void* m, int dtm,
                                      void* v, int dtv, void* shadow, int dts, long long n,
                                      float w1, float beta2, float w2, float eps, float decay,
                                      float step_size, float bc2_sqrt, float grad_scale, int stochastic,
                                      unsigned long long seed, unsigned long long step, unsigned int param_index) {
    GRID_STRIDE(i, n) {
        // Every operation rounds once, in the CPU backend's order (no fused multiply-add), so
        // fp32 results match it bit for bit.
        float g = __fmul_rn(ldf(grad, dtg, i), grad_scale);
        float m0 = ldf(m, dtm, i);
        float mi = __fadd_rn(m0, __fmul_rn(w1, __fsub_rn(g, m0)));
        float vi = __fadd_rn(__fmul_rn(beta2, ldf(v, dtv, i)), __fmul_rn(__fmul_rn(w2, g), g));
        float p = __fmul_rn(ldf(param, dtp, i), decay);
        float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
        p = __fsub_rn(p, __fdiv_rn(__fmul_rn(step_size, mi), den));
        if (stochastic) {
            unsigned long long e = (unsigned long long)i;
            if (dtp == DT_BF16) p = bf2f(f2bf_sr(p, srbits(seed, step, param_index, 0, e)));
            if (dtm == DT_BF16) mi = bf2f(f2bf_sr(mi, srbits(seed, step, param_index, 1, e)));
            if (dtv == DT_BF16) vi = bf2f(f2bf_sr(vi, srbits(seed, step, param_index, 2, e)));
        }
        // Stochastically rounded values are exact bf16 numbers: the nearest-even store keeps them.
        stf(param, dtp, i, p);
        stf(m, dtm, i, mi);
        stf(v, dtv, i, vi);
        if (shadow) {
            if (stochastic && dts == DT_BF16) ((bf16*)shadow)[i] = f2bf_sr(p, srbits(seed, step, param_index, 3, (unsigned long long)i));
            else stf(shadow, dts, i, p);
        }
    }
}
