// adamw.cu: one fused AdamW step over one parameter tensor (torch.optim.AdamW semantics).
//
// Shapes: param, grad, m, v, shadow [n]; each float tensor F32 or BF16.
//   g = grad * grad_scale
//   m = beta1*m + (1-beta1)*g;  v = beta2*v + (1-beta2)*g*g
//   p = p - lr*wd*p;  p = p - lr/bc1 * m / (sqrt(v)/bc2_sqrt + eps)
// with bc1 = 1 - beta1^step and bc2_sqrt = sqrt(1 - beta2^step) computed on the host.
// param, m, v are read and written (=); shadow (optional) = param rounded to its dtype.
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

__device__ __forceinline__ void st_round(void* p, int dt, long long i, float v, int stochastic,
                                         unsigned long long seed, unsigned long long step,
                                         unsigned int param, unsigned int role) {
    if (dt == DT_F32) ((float*)p)[i] = v;
    else if (stochastic) ((bf16*)p)[i] = f2bf_sr(v, srbits(seed, step, param, role, (unsigned long long)i));
    else ((bf16*)p)[i] = f2bf(v);
}

extern "C" __global__ void adamw_step(void* param, int dtp, const void* grad, int dtg, void* m, int dtm,
                                      void* v, int dtv, void* shadow, int dts, long long n,
                                      float lr, float beta1, float beta2, float eps, float wd,
                                      float grad_scale, float bc1, float bc2_sqrt, int stochastic,
                                      unsigned long long seed, unsigned long long step, unsigned int param_index) {
    GRID_STRIDE(i, n) {
        float g = ldf(grad, dtg, i) * grad_scale;
        float mi = beta1 * ldf(m, dtm, i) + (1.f - beta1) * g;
        float vi = beta2 * ldf(v, dtv, i) + (1.f - beta2) * g * g;
        float p = ldf(param, dtp, i);
        p = p - lr * wd * p;
        p = p - (lr / bc1) * mi / (sqrtf(vi) / bc2_sqrt + eps);
        st_round(param, dtp, i, p, stochastic, seed, step, param_index, 0);
        st_round(m, dtm, i, mi, stochastic, seed, step, param_index, 1);
        st_round(v, dtv, i, vi, stochastic, seed, step, param_index, 2);
        if (shadow) st_round(shadow, dts, i, ldf(param, dtp, i), stochastic, seed, step, param_index, 3);
    }
}
