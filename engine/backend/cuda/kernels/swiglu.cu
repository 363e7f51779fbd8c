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
