// nf4.cu: dequantisation of 4-bit NormalFloat weights (QLoRA's frozen base) into bf16.
//
// Shapes: out [N] bf16; packed [ceil(N/2)] u8, element 2i in the high nibble of byte i;
// absmax [B] f32 (B = ceil(N/64)), or under double quantisation qabsmax [B] u8 with
// absmax2 [ceil(B/256)] f32, map2 [256] f32 and offset:
//   scale[b] = map2[qabsmax[b]] * absmax2[b/256] + offset
//   out[e]   = bf16(nf4_code[code(e)] * scale[e/64])                      (=)
// Products and sums are rounded one by one (__fmul_rn, __fadd_rn: no fused multiply-add), as
// bitsandbytes computes them, so the result equals the CPU backend's bit for bit.
// Forward only: the base weight is frozen, nothing flows back into it.

__device__ __forceinline__ float nf4_value(unsigned int c) {
    // bitsandbytes' NF4 code book, indexed by the 4-bit code.
    const float code[16] = {
        -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
        -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
        0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
        0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};
    return code[c & 15u];
}

// One thread per packed byte: it writes elements 2i and 2i+1 (the second only when 2i+1 < N).
// qabsmax is null for plain f32 scales.
extern "C" __global__ void nf4_dequant(bf16* out, const unsigned char* packed, const float* absmax,
                                       const unsigned char* qabsmax, const float* absmax2,
                                       const float* map2, float offset, long long n) {
    GRID_STRIDE(i, (n + 1) / 2) {
        long long e = 2 * i;
        long long blk = e / 64;  // 2i and 2i+1 share a block: 64 is even
        float scale;
        if (qabsmax) {
            scale = __fadd_rn(__fmul_rn(map2[qabsmax[blk]], absmax2[blk / 256]), offset);
        } else {
            scale = absmax[blk];
        }
        unsigned int byte = packed[i];
        out[e] = f2bf(__fmul_rn(nf4_value(byte >> 4), scale));
        if (e + 1 < n) out[e + 1] = f2bf(__fmul_rn(nf4_value(byte & 15u), scale));
    }
}
