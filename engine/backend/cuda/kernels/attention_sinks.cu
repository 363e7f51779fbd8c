// attention_sinks.cu: learned per-head attention sinks (gpt-oss), folded into a finished
// attention and differentiated.
//
// Shapes: out, dout [N, NH*HD]; lse [N, NH] fp32; sinks, dsinks [NH].
// Forward (one thread per token and head), in place:
//   lse' = log(exp(lse) + exp(sink[h]));  out[n,h,:] *= exp(lse - lse');  lse = lse'      (=)
// Backward (one block per head, threads over tokens, a block sum, one store per head):
//   dsinks[h] += -sum_n exp(sink[h] - lse'[n,h]) * sum_d dout[n,h,d] * out[n,h,d]      (+=)
// The attention backward kernels take out and lse' unchanged: the sink carries no value, so
// the query, key and value gradients need nothing from this file. Nothing is cached.

extern "C" __global__ void attn_sinks_fwd(void* out, int dto, float* lse, const void* sinks, int dts,
                                          long long n, int nh, int hd) {
    GRID_STRIDE(i, n * nh) {
        int h = (int)(i % nh);
        float l = lse[i], s = ldf(sinks, dts, h);
        float m = fmaxf(l, s);
        float nl = m + logf(expf(l - m) + expf(s - m));
        float f = expf(l - nl);
        long long base = i * (long long)hd;
        for (int d = 0; d < hd; d++) stf(out, dto, base + d, ldf(out, dto, base + d) * f);
        lse[i] = nl;
    }
}

extern "C" __global__ void attn_sinks_bwd(void* dsinks, int dtg, const void* dout, int dtd, const void* out, int dto,
                                          const float* lse, const void* sinks, int dts, long long n, int nh, int hd) {
    __shared__ float scratch[32];
    int h = blockIdx.x;
    float s = ldf(sinks, dts, h);
    float acc = 0.f;
    for (long long t = threadIdx.x; t < n; t += blockDim.x) {
        long long base = (t * nh + h) * (long long)hd;
        float dd = 0.f;
        for (int d = 0; d < hd; d++) dd += ldf(dout, dtd, base + d) * ldf(out, dto, base + d);
        acc -= expf(s - lse[t * nh + h]) * dd;
    }
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) stf(dsinks, dtg, h, ldf(dsinks, dtg, h) + acc);
}
