// rope.cu: rotary position embedding, forward and backward (HF rotate-half convention).
//
// Shapes: x, out [N, H*HD] (out may alias x); pos [N] i32; inv_freq [R/2] fp32.
// Forward (sign = +1): for i < R/2, angle = float(pos[n]) * inv_freq[i] (fp32),
//   c = cos(angle) * s, sn = sin(angle) * s:
//   out[i] = x[i]*c - x[i+R/2]*sn;  out[i+R/2] = x[i+R/2]*c + x[i]*sn;  dims R..HD-1 copied (=).
// Backward (sign = -1) is the transpose rotation, dx = R(-angle) dy, same scaling s.
// Gradient contract: dx = (overwritten). Nothing is cached.

extern "C" __global__ void rope(void* out, int dto, const void* x, int dtx, const int* pos,
                                const float* inv_freq, long long N, int H, int HD, int R,
                                float s, float sign) {
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
            float x1 = ldf(x, dtx, base + i), x2 = ldf(x, dtx, base + i + half);
            stf(out, dto, base + i, x1 * c - x2 * sn);
            stf(out, dto, base + i + half, x2 * c + x1 * sn);
        } else {
            int d = i + half;  // R .. HD-1
            stf(out, dto, base + d, ldf(x, dtx, base + d));
        }
    }
}
