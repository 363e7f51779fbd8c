// dropout.cu: inverted dropout with the keep mask drawn in the kernel (backend.Optional.Dropout).
//
// Shapes: x, out [n] f32 or bf16 (each its own dtype; out may be x).
//   keep(e) = (dropout_bits(seed, key, e) >> 8) >= threshold
//   out[e]  = x[e] * (keep(e) ? scale : 0)   (=; one fp32 product, rounded once to out)
// dropout_bits is backend.DropoutBits (splitmix64 finaliser chained over seed, key, element),
// so the mask equals the CPU backend's and the host fallback's bit for bit. No mask is stored:
// a recomputed forward and the backward call the kernel again with the same (seed, key).

__device__ __forceinline__ unsigned long long dropout_mix64(unsigned long long z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

__device__ __forceinline__ unsigned int dropout_bits(unsigned long long seed, unsigned long long key,
                                                     unsigned long long elem) {
    unsigned long long h = dropout_mix64(seed);
    h = dropout_mix64(h ^ key);
    h = dropout_mix64(h ^ elem);
    return (unsigned int)(h >> 32);
}

extern "C" __global__ void dropout_fwd(void* out, int dto, const void* x, int dtx, unsigned long long seed,
                                       unsigned long long key, unsigned int threshold, float scale, long long n) {
    GRID_STRIDE(e, n) {
        float k = (dropout_bits(seed, key, (unsigned long long)e) >> 8) >= threshold ? scale : 0.f;
        stf(out, dto, e, __fmul_rn(ldf(x, dtx, e), k));
    }
}
