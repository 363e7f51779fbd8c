// geglu.cu: GeGLU forward and backward, the gated MLP of the Gemma families.
//
// Shapes: gate, up, out, dout, dgate, dup [N, F].
// Forward:  out = gelu_tanh(g) * up                                     (=)
//           gelu_tanh(g) = g/2 * (1 + t),  t = tanh(c * (g + 0.044715 g^3)),  c = sqrt(2/pi)
// Backward: dgate = dout * up * gelu_tanh'(g)                           (=, may alias gate)
//           dup   = dout * gelu_tanh(g)                                 (=, may alias up)
//           gelu_tanh'(g) = (1 + t)/2 + g/2 * (1 - t^2) * c * (1 + 3 * 0.044715 g^2)
// Nothing is cached; backward recomputes t from gate. All arithmetic in fp32.

#define GEGLU_C 0.7978845608028654f

// gg_eval returns gelu_tanh(g) and writes its derivative to *d.
__device__ __forceinline__ float gg_eval(float g, float* d) {
    float t = tanhf(GEGLU_C * (g + 0.044715f * g * g * g));
    *d = 0.5f * (1.f + t) + 0.5f * g * (1.f - t * t) * GEGLU_C * (1.f + 3.f * 0.044715f * g * g);
    return 0.5f * g * (1.f + t);
}

extern "C" __global__ void geglu_fwd(void* out, int dto, const void* gate, int dtg, const void* up, int dtu, long long n) {
    GRID_STRIDE(i, n) {
        float d;
        float y = gg_eval(ldf(gate, dtg, i), &d);
        stf(out, dto, i, y * ldf(up, dtu, i));
    }
}

extern "C" __global__ void geglu_bwd(void* dgate, int dtdg, void* dup, int dtdu, const void* dout, int dtdo,
                                     const void* gate, int dtg, const void* up, int dtu, long long n) {
    GRID_STRIDE(i, n) {
        float g = ldf(gate, dtg, i), u = ldf(up, dtu, i), o = ldf(dout, dtdo, i);
        float d;
        float y = gg_eval(g, &d);
        // both inputs are read before either output is written: dgate may alias gate, dup up
        stf(dgate, dtdg, i, o * u * d);
        stf(dup, dtdu, i, o * y);
    }
}
