// rmsnorm.cu: RMSNorm forward and backward, and the fused residual add + RMSNorm.
//
// Shapes: x, out, dy, dx [N, C]; w [C]; rstd [N] fp32.
// Forward:  rstd[n] = 1/sqrt(mean_c x[n,c]^2 + eps)                  (=, cached for backward)
//           out[n,c] = x[n,c] * rstd[n] * w[c]                         (=)
// Fused:    h = x + residual (= into resid_out, rounded to its dtype), then the forward on h.
// Backward: xhat = x * rstd; g = w * dy
//           dx[n,c] = rstd[n] * (g[c] - xhat[c] * mean_c(g * xhat))   (=, or += when accumulate)
//           dw[c]  += sum_n dy[n,c] * xhat[n,c]                        (+=, parameter gradient,
//           summed per block in shared memory into the fp32 accumulator dw_acc [C], which the
//           caller zeroes and then adds into dw)
// Nothing of size [N, C] is cached: backward re-reads x and the fp32 rstd.

extern "C" __global__ void rmsnorm_fwd(void* out, int dto, float* rstd, const void* x, int dtx,
                                       const void* w, int dtw, int C, float eps) {
    __shared__ float scratch[32];
    long long row = blockIdx.x;
    long long base = row * C;
    float ss = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float v = ldf(x, dtx, base + c);
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    float r = rsqrtf(ss / (float)C + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        stf(out, dto, base + c, ldf(x, dtx, base + c) * r * ldf(w, dtw, c));
}

// resid_out [N, C] = x + residual (may alias residual); then rmsnorm of resid_out.
extern "C" __global__ void add_rmsnorm_fwd(void* resid_out, int dtro, void* out, int dto, float* rstd,
                                           const void* x, int dtx, const void* residual, int dtr,
                                           const void* w, int dtw, int C, float eps) {
    __shared__ float scratch[32];
    long long row = blockIdx.x;
    long long base = row * C;
    float ss = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        stf(resid_out, dtro, base + c, ldf(x, dtx, base + c) + ldf(residual, dtr, base + c));
        float v = ldf(resid_out, dtro, base + c);  // the rounded value, as the unfused Add gives
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    float r = rsqrtf(ss / (float)C + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        stf(out, dto, base + c, ldf(resid_out, dtro, base + c) * r * ldf(w, dtw, c));
}

// Grid-stride over rows; dynamic shared memory holds C floats of the block's dw partial sums
// (dw_acc may be null when no weight gradient is wanted).
extern "C" __global__ void rmsnorm_bwd(void* dx, int dtdx, float* dw_acc, const void* dy, int dtdy,
                                       const void* x, int dtx, const void* w, int dtw,
                                       const float* rstd, long long N, int C, int accumulate) {
    extern __shared__ float dw_s[];
    __shared__ float scratch[32];
    if (dw_acc)
        for (int c = threadIdx.x; c < C; c += blockDim.x) dw_s[c] = 0.f;
    for (long long row = blockIdx.x; row < N; row += gridDim.x) {
        long long base = row * C;
        float r = rstd[row];
        float dot = 0.f;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float xh = ldf(x, dtx, base + c) * r;
            float g = ldf(w, dtw, c) * ldf(dy, dtdy, base + c);
            dot += g * xh;
        }
        dot = block_sum(dot, scratch) / (float)C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float xh = ldf(x, dtx, base + c) * r;
            float d = ldf(dy, dtdy, base + c);
            float v = r * (ldf(w, dtw, c) * d - xh * dot);
            if (accumulate) v += ldf(dx, dtdx, base + c);
            stf(dx, dtdx, base + c, v);
            if (dw_acc) dw_s[c] += d * xh;
        }
    }
    if (dw_acc) {
        __syncthreads();
        for (int c = threadIdx.x; c < C; c += blockDim.x) atomicAdd(&dw_acc[c], dw_s[c]);
    }
}
