// shortconv.cu: the gated causal depthwise short convolution (backend.Optional.ShortConv and
// ShortConvBackward; engine/backend/shortconv.go states the contract).
//
// Shapes: bcx [N,3C] (columns B | Cg | X), w [C,L], bias [C] (optional), pos [N] i32 (each
// token's position in its document), conv, gated, dg [N,C], dbcx [N,3C], gw [C,L], gbias [C].
// Float tensors are f32 or bf16, each its own dtype; arithmetic is fp32.
//   bx[n,c]    = rnd(B[n,c] * X[n,c])                   (rnd: to conv's dtype)
//   conv[n,c]  = rnd(bias[c] + sum_k w[c,k] * bx[n-(L-1-k),c])   (=; taps with L-1-k <= pos[n], n)
//   gated[n,c] = Cg[n,c] * conv[n,c]                    (=)
//   dbcx = [dbx * X | dg * conv | dbx * B]              (=; dbx gathers the later taps)
//   gw[c,k] += sum_n dconv[n,c] * bx[n-(L-1-k),c], gbias[c] += sum_n dconv[n,c]   (+=)
// with dconv = dg * Cg.
// The forward and the input gradient are one thread per (token, channel) element; bx of the
// neighbouring tokens is recomputed from bcx, so no thread reads another's result. The filter
// and bias gradients are one thread per (channel, tap) pair (tap L is the bias) that sums over
// every token in order: deterministic, and coalesced, as neighbouring threads read
// neighbouring channels of the same row.

__device__ __forceinline__ float sc_round(float v, int dt) { return dt == DT_BF16 ? bf2f(f2bf(v)) : v; }

__device__ __forceinline__ float sc_bx(const void* bcx, int dtb, long long r, long long C, long long c, int dtc) {
    return sc_round(__fmul_rn(ldf(bcx, dtb, r * 3 * C + c), ldf(bcx, dtb, r * 3 * C + 2 * C + c)), dtc);
}

extern "C" __global__ void shortconv_fwd(void* conv, int dtc, void* gated, int dtg, const void* bcx, int dtb,
                                         const void* w, int dtw, const void* bias, int dtbias, const int* pos,
                                         long long N, long long C, int L) {
    GRID_STRIDE(e, N * C) {
        long long r = e / C, c = e % C;
        float acc = bias ? ldf(bias, dtbias, c) : 0.f;
        int p = pos[r];
        for (int k = 0; k < L; k++) {
            int back = L - 1 - k;
            if (p < back || r < back) continue;
            acc += ldf(w, dtw, c * L + k) * sc_bx(bcx, dtb, r - back, C, c, dtc);
        }
        float cv = sc_round(acc, dtc);
        stf(conv, dtc, e, cv);
        stf(gated, dtg, e, __fmul_rn(ldf(bcx, dtb, r * 3 * C + C + c), cv));
    }
}

// shortconv_bwd_in writes dbcx: dB = dbx * X, dCg = dg * conv, dX = dbx * B, with dbx the sum
// over the later tokens of the document whose taps read this one.
extern "C" __global__ void shortconv_bwd_in(void* dbcx, int dtd, const void* dg, int dtdg, const void* bcx, int dtb,
                                            const void* w, int dtw, const void* conv, int dtc, const int* pos,
                                            long long N, long long C, int L) {
    GRID_STRIDE(e, N * C) {
        long long r = e / C, c = e % C;
        float dbx = 0.f;
        for (int back = 0; back < L && r + back < N; back++) {
            long long q = r + back;
            if (pos[q] < back) continue;
            float dconv = __fmul_rn(ldf(dg, dtdg, q * C + c), ldf(bcx, dtb, q * 3 * C + C + c));
            dbx += ldf(w, dtw, c * L + (L - 1 - back)) * dconv;
        }
        long long row = r * 3 * C;
        stf(dbcx, dtd, row + c, __fmul_rn(dbx, ldf(bcx, dtb, row + 2 * C + c)));
        stf(dbcx, dtd, row + C + c, __fmul_rn(ldf(dg, dtdg, e), ldf(conv, dtc, e)));
        stf(dbcx, dtd, row + 2 * C + c, __fmul_rn(dbx, ldf(bcx, dtb, row + c)));
    }
}

// shortconv_bwd_w adds to gw[c,k] (k < L) and gbias[c] (k == L; either may be null) the sum over
// all tokens of dconv times the tap's input. Thread e is channel e % C and tap e / C, so that a
// warp reads one row's neighbouring channels.
extern "C" __global__ void shortconv_bwd_w(void* gw, int dtgw, void* gbias, int dtgb, const void* dg, int dtdg,
                                           const void* bcx, int dtb, const int* pos, int dtc, long long N,
                                           long long C, int L) {
    GRID_STRIDE(e, (long long)(L + 1) * C) {
        long long c = e % C;
        int k = (int)(e / C);
        if (k == L ? gbias == 0 : gw == 0) continue;
        int back = L - 1 - k;
        float acc = 0.f;
        for (long long r = 0; r < N; r++) {
            if (k < L && (pos[r] < back || r < back)) continue;
            float dconv = __fmul_rn(ldf(dg, dtdg, r * C + c), ldf(bcx, dtb, r * 3 * C + C + c));
            acc += k == L ? dconv : dconv * sc_bx(bcx, dtb, r - back, C, c, dtc);
        }
        if (k == L) stf(gbias, dtgb, c, ldf(gbias, dtgb, c) + acc);
        else stf(gw, dtgw, c * L + k, ldf(gw, dtgw, c * L + k) + acc);
    }
}
