// rope.cu: rotary position embedding, forward and backward (HF rotate-half convention).
//
// Shapes: x, out [N, H*HD] (out may alias x); pos [N] i32; inv_freq [R/2] fp32.
// Forward (sign = +1): for i < R/2, angle = float(pos[n]) * inv_freq[i] (fp32),
//   c = cos(angle) * s, sn = sin(angle) * s:
//   out[i] = x[i]*c - x[i+R/2]*sn;  out[i+R/2] = x[i+R/2]*c + x[i]*sn;  dims R..HD-1 copied (=).
// Backward (sign = -1) is the transpose rotation, dx = R(-angle) dy, same scaling s.
// With inter = 1 the pair of frequency i is (2i, 2i+1) instead of (i, i+R/2) (GLM's interleaved
// convention); the arithmetic is the same.
// Gradient contract: dx = (overwritten). Nothing is cached.

extern "C" __global__ void rope(void* out, int dto, const void* x, int dtx, const int* pos,
                                const float* inv_freq, long long N, int H, int HD, int R,
                                float s, float sign, int inter) {
    int half = R / 2;
    int per_head = HD - half;  // threads per head: half rotation pairs + pass-through dims
    long long total = N * H * per_head;
    GRID_STRIDE(t, total) {
        long long nh = t / per_head;
        int i = (int)(t % per_head);
        long long n = nh / H;
        long long base = nh * HD;
        if (i < half) {
            float sn, c;
            sincosf((float)pos[n] * inv_freq[i], &sn, &c);
            c *= s;
            sn *= s * sign;
            long long j1 = inter ? base + 2 * i : base + i;
            long long j2 = inter ? j1 + 1 : base + i + half;
            float x1 = ldf(x, dtx, j1), x2 = ldf(x, dtx, j2);
            stf(out, dto, j1, x1 * c - x2 * sn);
            stf(out, dto, j2, x2 * c + x1 * sn);
        } else {
            int d = i + half;  // R .. HD-1
            stf(out, dto, base + d, ldf(x, dtx, base + d));
        }
    }
}

// rope_bf16x4 is the kernel above for bf16 x and out with the whole head rotated (R = HD) and
// HD/2 a multiple of 4: one thread per (n, 4 consecutive rotation pairs) computes its 4 angles
// once and applies them to every head, with 8-byte accesses. Same arithmetic as rope.
struct alignas(8) rp_bf4 { unsigned int u[2]; };

__device__ __forceinline__ float rp_at(const rp_bf4& v, int j) {
    unsigned int w = v.u[j >> 1];
    return (j & 1) ? __uint_as_float(w & 0xffff0000u) : __uint_as_float(w << 16);
}

extern "C" __global__ void rope_bf16x4(bf16* out, const bf16* x, const int* pos, const float* inv_freq,
                                       long long N, int H, int HD, float s, float sign) {
    int half = HD / 2;
    int G = half / 4;
    GRID_STRIDE(t, N * G) {
        long long n = t / G;
        int i = (int)(t % G) * 4;
        float c[4], sn[4];
        float p = (float)pos[n];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            sincosf(p * inv_freq[i + j], &sn[j], &c[j]);
            c[j] *= s;
            sn[j] *= s * sign;
        }
        for (int h = 0; h < H; h++) {
            long long base = (n * H + h) * (long long)HD + i;
            rp_bf4 a = *(const rp_bf4*)(x + base), b = *(const rp_bf4*)(x + base + half), oa, ob;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                float a0 = rp_at(a, 2 * j), a1 = rp_at(a, 2 * j + 1);
                float b0 = rp_at(b, 2 * j), b1 = rp_at(b, 2 * j + 1);
                int k0 = 2 * j, k1 = 2 * j + 1;
                oa.u[j] = (unsigned int)f2bf(a0 * c[k0] - b0 * sn[k0]) | ((unsigned int)f2bf(a1 * c[k1] - b1 * sn[k1]) << 16);
                ob.u[j] = (unsigned int)f2bf(b0 * c[k0] + a0 * sn[k0]) | ((unsigned int)f2bf(b1 * c[k1] + a1 * sn[k1]) << 16);
            }
            *(rp_bf4*)(out + base) = oa;
            *(rp_bf4*)(out + base + half) = ob;
        }
    }
}
