// swiglu.cu: SwiGLU forward and backward.
//
// Shapes: gate, up, out, dout, dgate, dup [N, F].
// Forward:  out = silu(gate) * up, silu(g) = g * sigmoid(g).            (=)
// Backward: dgate = dout * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))) (=, may alias gate)
//           dup   = dout * silu(g)                                      (=, may alias up)
// Nothing is cached; backward recomputes sigmoid from gate.

extern "C" __global__ void swiglu_fwd(void* out, int dto, const void* gate, int dtg, const void* up, int dtu, long long n) {
    GRID_STRIDE(i, n) {
        float g = ldf(gate, dtg, i);
        float sg = 1.f / (1.f + expf(-g));
        stf(out, dto, i, g * sg * ldf(up, dtu, i));
    }
}

extern "C" __global__ void swiglu_bwd(void* dgate, int dtdg, void* dup, int dtdu, const void* dout, int dtdo,
                                      const void* gate, int dtg, const void* up, int dtu, long long n) {
    GRID_STRIDE(i, n) {
        float g = ldf(gate, dtg, i), u = ldf(up, dtu, i), d = ldf(dout, dtdo, i);
        float sg = 1.f / (1.f + expf(-g));
        // read both inputs before writing: dgate may alias gate and dup may alias up
        stf(dgate, dtdg, i, d * u * sg * (1.f + g * (1.f - sg)));
        stf(dup, dtdu, i, d * g * sg);
    }
}

// Vectorised bf16 forms of the two kernels above, for bf16 tensors whose element count is a
// multiple of 8 and whose addresses are 16-byte aligned: each thread moves 8 elements per 16-byte
// access. Same arithmetic, so the results are identical to the scalar kernels'.
struct alignas(16) sw_bf8 { unsigned int u[4]; };

__device__ __forceinline__ float sw_lo(unsigned int u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float sw_hi(unsigned int u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ unsigned int sw_pack(float lo, float hi) {
    return (unsigned int)f2bf(lo) | ((unsigned int)f2bf(hi) << 16);
}

__device__ __forceinline__ float sw_fwd(float g, float u) {
    float sg = 1.f / (1.f + expf(-g));
    return g * sg * u;
}

// n8 = n / 8 vectors.
extern "C" __global__ void swiglu_fwd_bf16x8(sw_bf8* out, const sw_bf8* gate, const sw_bf8* up, long long n8) {
    GRID_STRIDE(i, n8) {
        sw_bf8 g = gate[i], u = up[i], o;
#pragma unroll
        for (int k = 0; k < 4; k++)
            o.u[k] = sw_pack(sw_fwd(sw_lo(g.u[k]), sw_lo(u.u[k])), sw_fwd(sw_hi(g.u[k]), sw_hi(u.u[k])));
        out[i] = o;
    }
}

extern "C" __global__ void swiglu_bwd_bf16x8(sw_bf8* dgate, sw_bf8* dup, const sw_bf8* dout, const sw_bf8* gate,
                                             const sw_bf8* up, long long n8) {
    GRID_STRIDE(i, n8) {
        sw_bf8 g8 = gate[i], u8 = up[i], d8 = dout[i], dg, du;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            unsigned int gw = g8.u[k >> 1], uw = u8.u[k >> 1], dw = d8.u[k >> 1];
            float g = (k & 1) ? sw_hi(gw) : sw_lo(gw);
            float u = (k & 1) ? sw_hi(uw) : sw_lo(uw);
            float d = (k & 1) ? sw_hi(dw) : sw_lo(dw);
            float sg = 1.f / (1.f + expf(-g));
            unsigned int a = f2bf(d * u * sg * (1.f + g * (1.f - sg)));
            unsigned int b = f2bf(d * g * sg);
            if (k & 1) {
                dg.u[k >> 1] |= a << 16;
                du.u[k >> 1] |= b << 16;
            } else {
                dg.u[k >> 1] = a;
                du.u[k >> 1] = b;
            }
        }
        // all loads of element i happened above: dgate/dup may alias gate/up
        dgate[i] = dg;
        dup[i] = du;
    }
}

// gpt-oss's clamped SwiGLU over interleaved gate|up columns.
// Shapes: gu, dgu [R, 2I] (gate_i at column 2i, up_i at 2i+1); out, dout [R, I]; n = R*I.
// Forward:  g = min(gate, limit), u = clamp(up, -limit, limit), out = (u + 1) * g * sigmoid(alpha g)   (=)
// Backward: dgate = dout * (u + 1) * (s + alpha g s (1 - s)) where gate <= limit, else 0          (=)
//           dup   = dout * g * s where -limit <= up <= limit, else 0; dgu may alias gu.
__device__ __forceinline__ void swc_eval(float gate, float up, float alpha, float limit, float* y, float* dg, float* du) {
    float g = gate, pg = 1.f;
    if (g > limit) { g = limit; pg = 0.f; }
    float u = up, pu = 1.f;
    if (u > limit) { u = limit; pu = 0.f; } else if (u < -limit) { u = -limit; pu = 0.f; }
    float s = 1.f / (1.f + expf(-alpha * g));
    *y = (u + 1.f) * g * s;
    *dg = pg * (u + 1.f) * (s + alpha * g * s * (1.f - s));
    *du = pu * g * s;
}

extern "C" __global__ void swiglu_clamped_fwd(void* out, int dto, const void* gu, int dtg, float alpha, float limit, long long n) {
    GRID_STRIDE(k, n) {
        float y, dg, du;
        swc_eval(ldf(gu, dtg, 2 * k), ldf(gu, dtg, 2 * k + 1), alpha, limit, &y, &dg, &du);
        stf(out, dto, k, y);
    }
}

extern "C" __global__ void swiglu_clamped_bwd(void* dgu, int dtdg, const void* dout, int dtdo, const void* gu, int dtg,
                                              float alpha, float limit, long long n) {
    GRID_STRIDE(k, n) {
        float y, dg, du;
        swc_eval(ldf(gu, dtg, 2 * k), ldf(gu, dtg, 2 * k + 1), alpha, limit, &y, &dg, &du);
        float d = ldf(dout, dtdo, k);
        // both inputs of pair k were read above: dgu may alias gu
        stf(dgu, dtdg, 2 * k, d * dg);
        stf(dgu, dtdg, 2 * k + 1, d * du);
    }
}
