// gated_delta_stages.cu: the stages of the gated delta-net layers around the recurrence
// (backend.Optional.GatedDeltaPrep, GatedDeltaPrepBackward, GatedRMSNorm and
// GatedRMSNormBackward; engine/backend/gated_delta_stages.go states the contract).
//
// Shapes: mixed, dmixed [N,D] (D = 2·KH·KD + VH·VD: q | k | v), b, a, db, da [N,VH], conv [D,L],
// dt, alog [VH], cu [docs+1] i32; q, k, dq, dk [N,KH,KD], v [N,VH,VD], beta, g, dbeta, dg [N,VH]
// f32; dv [N,VH,VD]. Gated norm: x, z, out, dout, dx, dz [R,W], w [W], rstd [R] f32. Other float
// tensors are f32 or bf16, each its own dtype; arithmetic is fp32.
//   pre = Σ_j conv[c,j]·mixed[t+j-L+1, c] (rows of t's document), u = silu(pre)
//   q = l2(u_q)/√KD, k = l2(u_k), v = u_v, beta = σ(b), g = -e^{alog}·softplus(a + dt)
//   out = x·rstd·w·silu(z), rstd = (mean(x²) + eps)^-½ per row
//
// Every kernel is a grid-stride loop without barriers or shared memory, and no thread reads what
// another writes in the same launch, so a launch's result does not depend on the schedule. The
// per-channel gradients (conv, dt, alog, w) are sums over all tokens (rows), made in two passes:
// each thread of the first sums one stretch of `rows` tokens of one channel, in order, into a
// partial; the fold adds a channel's partials in order, then into the gradient (+=). No float
// atomics: the same inputs give the same bits.

// gds_doc is the document of token t: the last d < docs with cu[d] <= t (empty documents, whose
// boundaries repeat, are passed over).
__device__ __forceinline__ int gds_doc(const int* cu, int docs, long long t) {
    int lo = 0, hi = docs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (cu[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

__device__ __forceinline__ float gds_sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// gds_softplus is torch's softplus (threshold 20: x itself above it).
__device__ __forceinline__ float gds_softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

// gds_pre is the conv's pre-activation of token t (its document starts at lo), channel c.
__device__ __forceinline__ float gds_pre(const void* mixed, int dtm, const void* conv, int dtc, long long t,
                                         long long lo, long long D, long long c, int L) {
    float s = 0.f;
    for (int j = 0; j < L; j++) {
        long long src = t + j - L + 1;
        if (src >= lo) s += ldf(conv, dtc, c * L + j) * ldf(mixed, dtm, src * D + c);
    }
    return s;
}

// gated_delta_prep_fwd: items [0, N·2KH) are (token, q or k head): the thread computes the
// head's KD values of u into its output, then scales them by the inverse norm; then N·VH·VD
// value elements; then N·VH gates.
extern "C" __global__ void gated_delta_prep_fwd(float* q, float* k, float* v, float* beta, float* g, const void* mixed,
                                                int dtm, const void* b, int dtb, const void* a, int dta,
                                                const void* conv, int dtc, const void* dt, int dtdt, const void* alog,
                                                int dtal, const int* cu, int docs, long long N, int KH, int VH, int KD,
                                                int VD, int L) {
    long long D = 2LL * KH * KD + (long long)VH * VD, nh = N * 2 * KH, nv = N * VH * VD;
    GRID_STRIDE(e, nh + nv + N * VH) {
        if (e < nh) {
            long long t = e / (2 * KH);
            int hh = (int)(e % (2 * KH));
            long long lo = cu[gds_doc(cu, docs, t)];
            float* out = hh < KH ? q + (t * KH + hh) * KD : k + (t * KH + hh - KH) * KD;
            float ss = 0.f;
            for (int i = 0; i < KD; i++) {
                float p = gds_pre(mixed, dtm, conv, dtc, t, lo, D, (long long)hh * KD + i, L);
                float u = p * gds_sigmoid(p);
                out[i] = u;
                ss += u * u;
            }
            float inv = 1.f / sqrtf(ss + 1e-6f);
            if (hh < KH) inv /= sqrtf((float)KD);
            for (int i = 0; i < KD; i++) out[i] *= inv;
        } else if (e < nh + nv) {
            long long i = e - nh, t = i / ((long long)VH * VD), c = 2LL * KH * KD + i % ((long long)VH * VD);
            float p = gds_pre(mixed, dtm, conv, dtc, t, cu[gds_doc(cu, docs, t)], D, c, L);
            v[i] = p * gds_sigmoid(p);
        } else {
            long long i = e - nh - nv;
            int h = (int)(i % VH);
            beta[i] = gds_sigmoid(ldf(b, dtb, i));
            g[i] = -expf(ldf(alog, dtal, h)) * gds_softplus(ldf(a, dta, i) + ldf(dt, dtdt, h));
        }
    }
}

// gated_delta_prep_bwd_pre writes dpre [N,D] f32, the gradient of the conv's pre-activation, and
// db, da; items as in gated_delta_prep_fwd. A head's thread first keeps pre in its dpre slots
// (its own) while it sums the norm's terms, then turns them into the gradient.
extern "C" __global__ void gated_delta_prep_bwd_pre(float* dpre, void* db, int dtdb, void* da, int dtda,
                                                    const float* dq, const float* dk, const void* dv, int dtdv,
                                                    const float* dbeta, const float* dg, const void* mixed, int dtm,
                                                    const void* b, int dtb, const void* a, int dta, const void* conv,
                                                    int dtc, const void* dt, int dtdt, const void* alog, int dtal,
                                                    const int* cu, int docs, long long N, int KH, int VH, int KD,
                                                    int VD, int L) {
    long long D = 2LL * KH * KD + (long long)VH * VD, nh = N * 2 * KH, nv = N * VH * VD;
    GRID_STRIDE(e, nh + nv + N * VH) {
        if (e < nh) {
            long long t = e / (2 * KH);
            int hh = (int)(e % (2 * KH));
            long long lo = cu[gds_doc(cu, docs, t)], c0 = (long long)hh * KD;
            const float* gy = hh < KH ? dq + (t * KH + hh) * KD : dk + (t * KH + hh - KH) * KD;
            float* dp = dpre + t * D + c0;
            float ss = 0.f, ug = 0.f;
            for (int i = 0; i < KD; i++) {
                float p = gds_pre(mixed, dtm, conv, dtc, t, lo, D, c0 + i, L);
                float u = p * gds_sigmoid(p);
                dp[i] = p;
                ss += u * u;
                ug += u * gy[i];
            }
            // y = s·u·inv: du = s·inv·(gy - û·(û·gy)), û = u·inv.
            float inv = 1.f / sqrtf(ss + 1e-6f), s = hh < KH ? 1.f / sqrtf((float)KD) : 1.f, dot = ug * inv;
            for (int i = 0; i < KD; i++) {
                float p = dp[i], sg = gds_sigmoid(p);
                float du = s * inv * (gy[i] - p * sg * inv * dot);
                dp[i] = du * sg * (1.f + p * (1.f - sg));
            }
        } else if (e < nh + nv) {
            long long i = e - nh, t = i / ((long long)VH * VD), c = 2LL * KH * KD + i % ((long long)VH * VD);
            float p = gds_pre(mixed, dtm, conv, dtc, t, cu[gds_doc(cu, docs, t)], D, c, L), sg = gds_sigmoid(p);
            dpre[t * D + c] = ldf(dv, dtdv, i) * sg * (1.f + p * (1.f - sg));
        } else {
            long long i = e - nh - nv;
            int h = (int)(i % VH);
            float bt = gds_sigmoid(ldf(b, dtb, i));
            stf(db, dtdb, i, dbeta[i] * bt * (1.f - bt));
            float x = ldf(a, dta, i) + ldf(dt, dtdt, h);
            float ds = x > 20.f ? 1.f : gds_sigmoid(x);
            stf(da, dtda, i, dg[i] * -expf(ldf(alog, dtal, h)) * ds);
        }
    }
}

// gated_delta_prep_bwd_in writes dmixed: each element gathers the taps of the later tokens of
// its document that read it.
extern "C" __global__ void gated_delta_prep_bwd_in(void* dmixed, int dtdm, const float* dpre, const void* conv,
                                                   int dtc, const int* cu, int docs, long long N, long long D, int L) {
    GRID_STRIDE(e, N * D) {
        long long t = e / D, c = e % D, hi = cu[gds_doc(cu, docs, t) + 1];
        float s = 0.f;
        for (int back = 0; back < L && t + back < hi; back++)
            s += ldf(conv, dtc, c * L + (L - 1 - back)) * dpre[(t + back) * D + c];
        stf(dmixed, dtdm, e, s);
    }
}

// gated_delta_prep_bwd_part writes part [ceil(N/rows), P] with P = D·L + 2·VH: column c·L + j
// sums dpre[t,c]·mixed[t+j-L+1, c] (the conv filter's gradient), column D·L + h the gradient of
// dt[h] (dg·-e^{alog}·σ(x), x = a + dt) and D·L + VH + h that of alog[h] (dg·g), each over the
// tokens [blk·rows, (blk+1)·rows) in order.
extern "C" __global__ void gated_delta_prep_bwd_part(float* part, const float* dpre, const void* mixed, int dtm,
                                                     const float* dg, const void* a, int dta, const void* dt, int dtdt,
                                                     const void* alog, int dtal, const int* cu, int docs, long long N,
                                                     long long D, int VH, int L, long long rows) {
    long long P = D * L + 2LL * VH, nb = (N + rows - 1) / rows;
    GRID_STRIDE(e, nb * P) {
        long long blk = e / P, col = e % P, t0 = blk * rows, t1 = t0 + rows < N ? t0 + rows : N;
        float acc = 0.f;
        if (col < D * L) {
            long long c = col / L;
            int j = (int)(col % L), doc = gds_doc(cu, docs, t0);
            for (long long t = t0; t < t1; t++) {
                while (cu[doc + 1] <= t) doc++;
                long long src = t + j - L + 1;
                if (src >= cu[doc]) acc += dpre[t * D + c] * ldf(mixed, dtm, src * D + c);
            }
        } else {
            int h = (int)((col - D * L) % VH);
            bool isDt = col < D * L + VH;
            float ea = -expf(ldf(alog, dtal, h)), dth = ldf(dt, dtdt, h);
            for (long long t = t0; t < t1; t++) {
                float x = ldf(a, dta, t * VH + h) + dth;
                float f = isDt ? (x > 20.f ? 1.f : gds_sigmoid(x)) : gds_softplus(x);
                acc += dg[t * VH + h] * ea * f;
            }
        }
        part[e] = acc;
    }
}

// gated_delta_stages_fold adds to grad[c] (c < cols) the partials part[blk·P + col0 + c] over
// the nb stretches in order.
extern "C" __global__ void gated_delta_stages_fold(void* grad, int dtg, const float* part, long long nb, long long P,
                                                   long long col0, long long cols) {
    GRID_STRIDE(c, cols) {
        float acc = 0.f;
        for (long long blk = 0; blk < nb; blk++) acc += part[blk * P + col0 + c];
        stf(grad, dtg, c, ldf(grad, dtg, c) + acc);
    }
}

// gated_rmsnorm_fwd: one thread per row.
extern "C" __global__ void gated_rmsnorm_fwd(void* out, int dto, float* rstd, const void* x, int dtx, const void* z,
                                             int dtz, const void* w, int dtw, long long R, int W, float eps) {
    GRID_STRIDE(r, R) {
        float ss = 0.f;
        for (int j = 0; j < W; j++) {
            float xj = ldf(x, dtx, r * W + j);
            ss += xj * xj;
        }
        float rs = 1.f / sqrtf(ss / (float)W + eps);
        rstd[r] = rs;
        for (int j = 0; j < W; j++) {
            long long i = r * W + j;
            float zj = ldf(z, dtz, i);
            stf(out, dto, i, ldf(x, dtx, i) * rs * ldf(w, dtw, j) * (zj * gds_sigmoid(zj)));
        }
    }
}

// gated_rmsnorm_bwd writes dx and dz, one thread per row: dn = dout·w·silu(z), dx = rstd·(dn -
// x̂·mean(dn·x̂)) with x̂ = x·rstd, dz = dout·x̂·w·silu'(z).
extern "C" __global__ void gated_rmsnorm_bwd(void* dx, int dtdx, void* dz, int dtdz, const void* dout, int dtdo,
                                             const void* x, int dtx, const void* z, int dtz, const void* w, int dtw,
                                             const float* rstd, long long R, int W) {
    GRID_STRIDE(r, R) {
        float rs = rstd[r], dot = 0.f;
        for (int j = 0; j < W; j++) {
            long long i = r * W + j;
            float zj = ldf(z, dtz, i), sg = gds_sigmoid(zj), g = ldf(dout, dtdo, i), wj = ldf(w, dtw, j);
            float nv = ldf(x, dtx, i) * rs;
            stf(dz, dtdz, i, g * nv * wj * sg * (1.f + zj * (1.f - sg)));
            dot += g * wj * zj * sg * nv;
        }
        dot /= (float)W;
        for (int j = 0; j < W; j++) {
            long long i = r * W + j;
            float zj = ldf(z, dtz, i), nv = ldf(x, dtx, i) * rs;
            float dn = ldf(dout, dtdo, i) * ldf(w, dtw, j) * zj * gds_sigmoid(zj);
            stf(dx, dtdx, i, rs * (dn - nv * dot));
        }
    }
}

// gated_rmsnorm_bwd_part writes part [ceil(R/rows), W]: column j sums dout·x·rstd·silu(z) over
// the rows [blk·rows, (blk+1)·rows) in order (neighbouring threads read neighbouring columns).
extern "C" __global__ void gated_rmsnorm_bwd_part(float* part, const void* dout, int dtdo, const void* x, int dtx,
                                                  const void* z, int dtz, const float* rstd, long long R, int W,
                                                  long long rows) {
    long long nb = (R + rows - 1) / rows;
    GRID_STRIDE(e, nb * W) {
        long long blk = e / W, r0 = blk * rows, r1 = r0 + rows < R ? r0 + rows : R;
        int j = (int)(e % W);
        float acc = 0.f;
        for (long long r = r0; r < r1; r++) {
            long long i = r * W + j;
            float zj = ldf(z, dtz, i);
            acc += ldf(dout, dtdo, i) * ldf(x, dtx, i) * rstd[r] * (zj * gds_sigmoid(zj));
        }
        part[e] = acc;
    }
}
