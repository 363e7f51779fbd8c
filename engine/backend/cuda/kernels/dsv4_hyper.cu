// dsv4_hyper.cu: DeepSeek-V4's hyper-connection weights, the collapse and expansion of its
// residual streams, and its two elementwise activations (backend.DSV4Ops; engine/backend's
// dsv4.go states the contract, the CPU backend's dsv4_hyper.go is the reference).
//
// Shapes: n streams (at most HC_MAXN), M mix columns ((2+n)·n, or n for the head's mix),
// z [N,M], scale [3] ([1] for the head), base [M], pre and post [N,n], comb [N,n·n] (all f32),
// x [N,n·C], f and out of a collapse [N,C]. Float tensors are f32 or bf16, each its own
// dtype; arithmetic is fp32.
//
// Hyper weights are one thread per row: zz = z·scale[group] + base; pre = sigmoid + eps,
// post = 2·sigmoid, comb = the Sinkhorn half-steps (the first over the columns, then rows and
// columns in turn) of each row's softmax + eps. The backward recomputes the forward per row:
// the Sinkhorn matrices are kept at checkpoints (every K half-steps, as many as HC_CKPT
// floats hold) and each half-step's input is recomputed from the one before it, so no
// matrix is stored per half-step; the gradient of zz goes to dz (+=) and to a scratch
// gzz [N,M], whose column sums (dsv4_hyper_part over chunks of rows, then dsv4_hyper_fold
// over the chunks in order) are the parameters' gradients: deterministic, no atomics.
//
// Stream collapse and expansion are one thread per (row, channel) for the forwards; their
// backwards are one block per row, the per-row sums over channels reduced by block_sum. The
// expansion reads a position's n inputs before writing its n outputs, so out may be x.

#define HC_MAXN 8
#define HC_CKPT 128

__device__ __forceinline__ float hc_sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// hc_group is the scale of mix column j (0 pre, 1 post, 2 comb).
__device__ __forceinline__ int hc_group(int j, int n, int head) { return head || j < n ? 0 : (j < 2 * n ? 1 : 2); }

// hc_at is element b of line a of an n×n matrix: line a is column a when over (the sums run
// over the rows), row a otherwise. Half-step s is over the rows when s is even.
__device__ __forceinline__ int hc_at(int n, int a, int b, int over) { return over ? b * n + a : a * n + b; }

// hc_step applies Sinkhorn half-step s to the n×n matrix x in place.
__device__ void hc_step(float* x, int n, int s, float eps) {
    int over = (s & 1) == 0;
    for (int a = 0; a < n; a++) {
        float t = 0.f;
        for (int b = 0; b < n; b++) t += x[hc_at(n, a, b, over)];
        t += eps;
        for (int b = 0; b < n; b++) x[hc_at(n, a, b, over)] /= t;
    }
}

// hc_softmax writes the row softmaxes of the comb logits of row zo (soft) and soft + eps (m).
__device__ void hc_softmax(float* soft, float* m, const void* z, int dtz, long long zo, float s2, const void* base,
                           int dtb, int n, float eps) {
    for (int j = 0; j < n; j++) {
        float v[HC_MAXN];
        float mx = __int_as_float(0xff800000);
        for (int k = 0; k < n; k++) {
            int c = 2 * n + j * n + k;
            v[k] = ldf(z, dtz, zo + c) * s2 + ldf(base, dtb, c);
            mx = fmaxf(mx, v[k]);
        }
        float s = 0.f;
        for (int k = 0; k < n; k++) {
            v[k] = expf(v[k] - mx);
            s += v[k];
        }
        for (int k = 0; k < n; k++) {
            soft[j * n + k] = v[k] / s;
            m[j * n + k] = soft[j * n + k] + eps;
        }
    }
}

extern "C" __global__ void dsv4_hyper_fwd(const void* z, int dtz, const void* scale, int dts, const void* base,
                                          int dtb, float* pre, float* post, float* comb, long long N, int n,
                                          int iters, float eps, int head) {
    int M = head ? n : (2 + n) * n;
    GRID_STRIDE(r, N) {
        long long zo = r * M;
        float s0 = ldf(scale, dts, 0);
        for (int k = 0; k < n; k++) pre[r * n + k] = hc_sigmoid(ldf(z, dtz, zo + k) * s0 + ldf(base, dtb, k)) + eps;
        if (head) continue;
        float s1 = ldf(scale, dts, 1), s2 = ldf(scale, dts, 2);
        for (int k = 0; k < n; k++)
            post[r * n + k] = 2.f * hc_sigmoid(ldf(z, dtz, zo + n + k) * s1 + ldf(base, dtb, n + k));
        float soft[HC_MAXN * HC_MAXN], m[HC_MAXN * HC_MAXN];
        hc_softmax(soft, m, z, dtz, zo, s2, base, dtb, n, eps);
        for (int s = 0; s < 2 * iters - 1; s++) hc_step(m, n, s, eps);
        for (int i = 0; i < n * n; i++) comb[r * n * n + i] = m[i];
    }
}

// hc_out stores the gradient g of zz[r, j]: into gzz, and times its scale into dz (+=).
__device__ __forceinline__ void hc_out(void* dz, int dtdz, float* gzz, long long i, float g, float sc) {
    gzz[i] = g;
    stf(dz, dtdz, i, ldf(dz, dtdz, i) + g * sc);
}

extern "C" __global__ void dsv4_hyper_bwd(void* dz, int dtdz, float* gzz, const void* z, int dtz, const void* scale,
                                          int dts, const void* base, int dtb, const float* dpre, const float* dpost,
                                          const float* dcomb, long long N, int n, int iters, float eps, int head) {
    int M = head ? n : (2 + n) * n, nn = n * n;
    int steps = 2 * iters - 1;
    // Checkpoints: the matrix before half-steps 0, K, 2K, ... (as many as HC_CKPT holds).
    int slots = max(1, min(HC_CKPT / max(nn, 1), steps));
    int K = (steps + slots - 1) / slots;
    GRID_STRIDE(r, N) {
        long long zo = r * M;
        float s0 = ldf(scale, dts, 0);
        for (int k = 0; k < n; k++) {
            float s = hc_sigmoid(ldf(z, dtz, zo + k) * s0 + ldf(base, dtb, k));
            hc_out(dz, dtdz, gzz, zo + k, dpre[r * n + k] * s * (1.f - s), s0);
        }
        if (head) continue;
        float s1 = ldf(scale, dts, 1), s2 = ldf(scale, dts, 2);
        for (int k = 0; k < n; k++) {
            float s = hc_sigmoid(ldf(z, dtz, zo + n + k) * s1 + ldf(base, dtb, n + k));
            hc_out(dz, dtdz, gzz, zo + n + k, dpost[r * n + k] * 2.f * s * (1.f - s), s1);
        }
        float soft[HC_MAXN * HC_MAXN], x[HC_MAXN * HC_MAXN], g[HC_MAXN * HC_MAXN], ck[HC_CKPT];
        hc_softmax(soft, x, z, dtz, zo, s2, base, dtb, n, eps);
        for (int s = 0; s < steps; s++) {
            if (s % K == 0)
                for (int i = 0; i < nn; i++) ck[(s / K) * nn + i] = x[i];
            hc_step(x, n, s, eps);
        }
        for (int i = 0; i < nn; i++) g[i] = dcomb[r * nn + i];
        for (int s = steps - 1; s >= 0; s--) {
            int c = s / K;
            for (int i = 0; i < nn; i++) x[i] = ck[c * nn + i];
            for (int q = c * K; q < s; q++) hc_step(x, n, q, eps);  // x: the input of half-step s
            int over = (s & 1) == 0;
            for (int a = 0; a < n; a++) {
                float t = 0.f, dot = 0.f;
                for (int b = 0; b < n; b++) {
                    int i = hc_at(n, a, b, over);
                    t += x[i];
                    dot += g[i] * x[i];
                }
                t += eps;
                for (int b = 0; b < n; b++) {
                    int i = hc_at(n, a, b, over);
                    g[i] = g[i] / t - dot / (t * t);
                }
            }
        }
        for (int j = 0; j < n; j++) {
            float dot = 0.f;
            for (int k = 0; k < n; k++) dot += g[j * n + k] * soft[j * n + k];
            for (int k = 0; k < n; k++)
                hc_out(dz, dtdz, gzz, zo + 2 * n + j * n + k, soft[j * n + k] * (g[j * n + k] - dot), s2);
        }
    }
}

// dsv4_hyper_part sums gzz over chunks of rows rows: part[b, j] = Σ gzz[r, j] and
// part[b, M+j] = Σ gzz[r, j]·z[r, j] over chunk b's rows, in order.
extern "C" __global__ void dsv4_hyper_part(float* part, const float* gzz, const void* z, int dtz, long long N, int M,
                                           long long rows) {
    long long nb = (N + rows - 1) / rows;
    GRID_STRIDE(e, nb * 2 * M) {
        long long b = e / (2 * M);
        int j = (int)(e % (2 * M)), col = j % M;
        long long hi = min(N, (b + 1) * rows);
        float acc = 0.f;
        for (long long r = b * rows; r < hi; r++) {
            float g = gzz[r * M + col];
            acc += j < M ? g : g * ldf(z, dtz, r * M + col);
        }
        part[e] = acc;
    }
}

// dsv4_hyper_fold adds the chunks' sums in order: thread j < M to gbase[j], thread M + s to
// gscale[s] (the columns of scale s, chunk by chunk). Either gradient may be null.
extern "C" __global__ void dsv4_hyper_fold(void* gscale, int dtgs, void* gbase, int dtgb, const float* part,
                                           long long nb, int n, int M, int scales, int head) {
    GRID_STRIDE(e, (long long)(M + scales)) {
        float acc = 0.f;
        if (e < M) {
            if (!gbase) continue;
            for (long long b = 0; b < nb; b++) acc += part[b * 2 * M + e];
            stf(gbase, dtgb, e, ldf(gbase, dtgb, e) + acc);
        } else {
            int s = (int)(e - M);
            if (!gscale) continue;
            for (long long b = 0; b < nb; b++)
                for (int j = 0; j < M; j++)
                    if (hc_group(j, n, head) == s) acc += part[b * 2 * M + M + j];
            stf(gscale, dtgs, s, ldf(gscale, dtgs, s) + acc);
        }
    }
}

extern "C" __global__ void dsv4_stream_collapse_fwd(void* out, int dto, const float* w, const void* x, int dtx,
                                                    long long N, int n, long long C) {
    GRID_STRIDE(e, N * C) {
        long long r = e / C, c = e % C;
        float acc = 0.f;
        for (int j = 0; j < n; j++) acc += w[r * n + j] * ldf(x, dtx, (r * n + j) * C + c);
        stf(out, dto, e, acc);
    }
}

// dsv4_stream_collapse_bwd is one block per row: dx[r, j·C+c] += dout[r,c]·w[r,j] and
// dw[r,j] += Σ_c dout[r,c]·x[r, j·C+c] (either may be null).
extern "C" __global__ void dsv4_stream_collapse_bwd(void* dw, int dtdw, void* dx, int dtdx, const void* dout, int dtdo,
                                                    const float* w, const void* x, int dtx, long long N, int n,
                                                    long long C) {
    __shared__ float scratch[32];
    for (long long r = blockIdx.x; r < N; r += gridDim.x) {
        for (int j = 0; j < n; j++) {
            float wj = w[r * n + j], s = 0.f;
            long long xo = (r * n + j) * C;
            for (long long c = threadIdx.x; c < C; c += blockDim.x) {
                float g = ldf(dout, dtdo, r * C + c);
                if (dx) stf(dx, dtdx, xo + c, ldf(dx, dtdx, xo + c) + g * wj);
                s += g * ldf(x, dtx, xo + c);
            }
            if (!dw) continue;
            s = block_sum(s, scratch);
            if (threadIdx.x == 0) stf(dw, dtdw, r * n + j, ldf(dw, dtdw, r * n + j) + s);
        }
    }
}

extern "C" __global__ void dsv4_stream_expand_fwd(void* out, int dto, const float* post, const void* f, int dtf,
                                                  const float* comb, const void* x, int dtx, long long N, int n,
                                                  long long C) {
    GRID_STRIDE(e, N * C) {
        long long r = e / C, c = e % C;
        float xs[HC_MAXN];
        for (int j = 0; j < n; j++) xs[j] = ldf(x, dtx, (r * n + j) * C + c);
        float fv = ldf(f, dtf, e);
        const float* cb = comb + r * n * n;
        for (int k = 0; k < n; k++) {
            float acc = post[r * n + k] * fv;
            for (int j = 0; j < n; j++) acc += cb[j * n + k] * xs[j];
            stf(out, dto, (r * n + k) * C + c, acc);
        }
    }
}

// dsv4_stream_expand_bwd is one block per row: df and dx per channel, dpost and dcomb the row's
// sums over channels (each may be null).
extern "C" __global__ void dsv4_stream_expand_bwd(float* dpost, float* dcomb, void* df, int dtdf, void* dx, int dtdx,
                                                  const void* dout, int dtdo, const float* post, const void* f,
                                                  int dtf, const float* comb, const void* x, int dtx, long long N,
                                                  int n, long long C) {
    __shared__ float scratch[32];
    for (long long r = blockIdx.x; r < N; r += gridDim.x) {
        float sp[HC_MAXN], sc[HC_MAXN * HC_MAXN];
        for (int k = 0; k < n; k++) sp[k] = 0.f;
        for (int i = 0; i < n * n; i++) sc[i] = 0.f;
        const float* p = post + r * n;
        const float* cb = comb + r * n * n;
        for (long long c = threadIdx.x; c < C; c += blockDim.x) {
            float g[HC_MAXN];
            for (int k = 0; k < n; k++) g[k] = ldf(dout, dtdo, (r * n + k) * C + c);
            float fv = ldf(f, dtf, r * C + c), gf = 0.f;
            for (int k = 0; k < n; k++) {
                gf += g[k] * p[k];
                sp[k] += g[k] * fv;
            }
            if (df) stf(df, dtdf, r * C + c, ldf(df, dtdf, r * C + c) + gf);
            for (int j = 0; j < n; j++) {
                long long xi = (r * n + j) * C + c;
                float xj = ldf(x, dtx, xi), gx = 0.f;
                for (int k = 0; k < n; k++) {
                    gx += g[k] * cb[j * n + k];
                    sc[j * n + k] += g[k] * xj;
                }
                if (dx) stf(dx, dtdx, xi, ldf(dx, dtdx, xi) + gx);
            }
        }
        if (dpost)
            for (int k = 0; k < n; k++) {
                float v = block_sum(sp[k], scratch);
                if (threadIdx.x == 0) dpost[r * n + k] += v;
            }
        if (dcomb)
            for (int i = 0; i < n * n; i++) {
                float v = block_sum(sc[i], scratch);
                if (threadIdx.x == 0) dcomb[r * n * n + i] += v;
            }
    }
}

// hc_softplus is torch's softplus (beta 1, threshold 20).
__device__ __forceinline__ float hc_softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

extern "C" __global__ void dsv4_sqrt_softplus_fwd(void* out, int dto, const void* x, int dtx, long long n) {
    GRID_STRIDE(i, n) { stf(out, dto, i, sqrtf(hc_softplus(ldf(x, dtx, i)))); }
}

// dsv4_sqrt_softplus_bwd: dx += dout·sigmoid(x) / (2·out), nothing where out is 0.
extern "C" __global__ void dsv4_sqrt_softplus_bwd(void* dx, int dtdx, const void* dout, int dtdo, const void* x, int dtx,
                                                  const void* out, int dto, long long n) {
    GRID_STRIDE(i, n) {
        float o = ldf(out, dto, i);
        if (o == 0.f) continue;
        float d = ldf(dout, dtdo, i) * hc_sigmoid(ldf(x, dtx, i)) / (2.f * o);
        stf(dx, dtdx, i, ldf(dx, dtdx, i) + d);
    }
}

// hc_clamps returns min(g, l) and clamp(u, -l, l) (NaN stays NaN, as torch.clamp keeps it).
__device__ __forceinline__ void hc_clamps(float g, float u, float l, float* gc, float* uc) {
    *gc = g > l ? l : g;
    *uc = u > l ? l : (u < -l ? -l : u);
}

extern "C" __global__ void dsv4_swiglu_split_fwd(void* out, int dto, const void* gate, int dtg, const void* up, int dtu,
                                                 float limit, long long n) {
    GRID_STRIDE(i, n) {
        float gc, uc;
        hc_clamps(ldf(gate, dtg, i), ldf(up, dtu, i), limit, &gc, &uc);
        stf(out, dto, i, gc * hc_sigmoid(gc) * uc);
    }
}

// dsv4_swiglu_split_bwd: dgate += dout·uc·σ(gc)·(1 + gc·(1-σ(gc))) where gate ≤ limit, dup +=
// dout·silu(gc) where |up| ≤ limit (either may be null).
extern "C" __global__ void dsv4_swiglu_split_bwd(void* dgate, int dtdg, void* dup, int dtdu, const void* dout, int dtdo,
                                                 const void* gate, int dtg, const void* up, int dtu, float limit,
                                                 long long n) {
    GRID_STRIDE(i, n) {
        float d = ldf(dout, dtdo, i);
        if (d == 0.f) continue;
        float g = ldf(gate, dtg, i), u = ldf(up, dtu, i), gc, uc;
        hc_clamps(g, u, limit, &gc, &uc);
        float s = hc_sigmoid(gc);
        if (dgate && g <= limit) stf(dgate, dtdg, i, ldf(dgate, dtdg, i) + d * uc * s * (1.f + gc * (1.f - s)));
        if (dup && u >= -limit && u <= limit) stf(dup, dtdu, i, ldf(dup, dtdu, i) + d * gc * s);
    }
}
