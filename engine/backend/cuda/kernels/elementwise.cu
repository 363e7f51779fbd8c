// elementwise.cu: elementwise arithmetic, dtype conversion and reductions used by the optimizer
// and the residual stream.
//
// Gradient contract: none of these is an op with a backward; they are the building blocks
// (Add, Axpy, Scale, Copy with conversion, SumSquares) and the bias helpers of Linear:
//   bias_rows_out:  out[m, o] = acc[m, o] + bias[o]             (=; acc fp32, rounded once)
//   bias_grad:      dbias[o] += sum_m dy[m, o]                 (+=, parameter gradient)
// Nothing is cached.

extern "C" __global__ void ew_add(void* out, int dto, const void* a, int dta, const void* b, int dtb, long long n) {
    GRID_STRIDE(i, n) stf(out, dto, i, ldf(a, dta, i) + ldf(b, dtb, i));
}

// y += alpha * x
extern "C" __global__ void ew_axpy(void* y, int dty, float alpha, const void* x, int dtx, long long n) {
    GRID_STRIDE(i, n) stf(y, dty, i, ldf(y, dty, i) + alpha * ldf(x, dtx, i));
}

// The fold after a GEMM computed into fp32 scratch: y = beta * y + sum_{j < s} parts[j * n + i],
// summed in fp32 in order j = 0, 1, ... and rounded once to y's dtype. parts holds s partial
// products (split-K slices) of n elements each. With beta = 0, y is not read (it may hold
// anything, NaN included). ew_fold_parts4 is the same over groups of 4 (n % 4 == 0, parts
// 16-byte aligned, y 16-byte (fp32) or 8-byte (bf16) aligned).
__device__ __forceinline__ float fold_one(const float* parts, int s, long long n, long long i) {
    float t = parts[i];
    for (int j = 1; j < s; j++) t += parts[(long long)j * n + i];
    return t;
}

extern "C" __global__ void ew_fold_parts(void* y, int dty, float beta, const float* parts, int s, long long n) {
    GRID_STRIDE(i, n) {
        float t = fold_one(parts, s, n, i);
        stf(y, dty, i, beta == 0.f ? t : beta * ldf(y, dty, i) + t);
    }
}

struct alignas(16) fold_f4 { float x, y, z, w; };
struct alignas(8) fold_b4 { unsigned short x, y, z, w; };

extern "C" __global__ void ew_fold_parts4(void* y, int dty, float beta, const float* parts, int s, long long n) {
    const fold_f4* p4 = (const fold_f4*)parts;
    long long n4 = n >> 2;
    GRID_STRIDE(i, n4) {
        fold_f4 t = p4[i];
        for (int j = 1; j < s; j++) {
            fold_f4 u = p4[(long long)j * n4 + i];
            t.x += u.x; t.y += u.y; t.z += u.z; t.w += u.w;
        }
        if (dty == DT_F32) {
            fold_f4* y4 = (fold_f4*)y;
            if (beta != 0.f) {
                fold_f4 o = y4[i];
                t.x += beta * o.x; t.y += beta * o.y; t.z += beta * o.z; t.w += beta * o.w;
            }
            y4[i] = t;
        } else {
            fold_b4* y4 = (fold_b4*)y;
            if (beta != 0.f) {
                fold_b4 o = y4[i];
                t.x += beta * bf2f(o.x); t.y += beta * bf2f(o.y); t.z += beta * bf2f(o.z); t.w += beta * bf2f(o.w);
            }
            fold_b4 r = {f2bf(t.x), f2bf(t.y), f2bf(t.z), f2bf(t.w)};
            y4[i] = r;
        }
    }
}

extern "C" __global__ void ew_scale(void* t, int dt, float alpha, long long n) {
    GRID_STRIDE(i, n) stf(t, dt, i, alpha * ldf(t, dt, i));
}

// t[r, :] *= w[r] for rows of c elements (the routing weight of an expert's output row).
extern "C" __global__ void ew_scale_rows(void* t, int dt, const float* w, long long c, long long n) {
    GRID_STRIDE(i, n) stf(t, dt, i, w[i / c] * ldf(t, dt, i));
}

// out[r] = sum_j a[r, j] * b[r, j], one warp per row, fp32 accumulation (lanes stride the row,
// then a butterfly sum), rows of c elements; rows * 32 threads in all, grid-strided.
extern "C" __global__ void row_dot(float* out, const void* a, int da, const void* b, int db, long long rows, long long c) {
    int lane = threadIdx.x & 31;
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long r = warp; r < rows; r += warps) {
        float s = 0.f;
        for (long long j = lane; j < c; j += 32) s += ldf(a, da, r * c + j) * ldf(b, db, r * c + j);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) out[r] = s;
    }
}

// dst = src with float conversion (round to nearest even into bf16).
extern "C" __global__ void ew_convert(void* dst, int dtd, const void* src, int dts, long long n) {
    GRID_STRIDE(i, n) stf(dst, dtd, i, ldf(src, dts, i));
}

extern "C" __global__ void ew_fill_bf16(bf16* t, float v, long long n) {
    bf16 b = f2bf(v);
    GRID_STRIDE(i, n) t[i] = b;
}

// out[m, o] = acc[m, o] + bias[o]; out, acc [M, O] (acc fp32, may alias out), bias [O].
extern "C" __global__ void bias_rows_out(void* out, int dto, const float* acc, const void* bias, int dtb, long long M, int O) {
    GRID_STRIDE(i, M * O) stf(out, dto, i, acc[i] + ldf(bias, dtb, i % O));
}

// dbias[o] += sum_m dy[m, o]; dy [M, O]. One thread per column, rows strided by blockIdx.y,
// partial sums combined with atomicAdd on an fp32 accumulator acc [O] (zeroed by the caller).
extern "C" __global__ void bias_grad_partial(float* acc, const void* dy, int dty, long long M, int O) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= O) return;
    float s = 0.f;
    for (long long m = blockIdx.y; m < M; m += gridDim.y) s += ldf(dy, dty, m * O + o);
    atomicAdd(&acc[o], s);
}

// sum of squares of x [n] accumulated in fp64 into *out (zeroed by the caller).
extern "C" __global__ void sum_squares(double* out, const void* x, int dt, long long n) {
    double s = 0.0;
    GRID_STRIDE(i, n) {
        float v = ldf(x, dt, i);
        s += (double)v * (double)v;
    }
    // reduce in fp64 across the warp, then one atomic per warp
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, s);
}

// sum_squares_bf16x8 is sum_squares for a bf16 x read 8 elements per 16-byte access (n8 = n / 8
// vectors, 16-byte aligned): each square is exact in fp32 (a bf16 significand has 8 bits), the
// sums are fp64 as in sum_squares.
struct alignas(16) ss_bf8 { unsigned int u[4]; };

extern "C" __global__ void sum_squares_bf16x8(double* out, const ss_bf8* x, long long n8) {
    double s = 0.0;
    GRID_STRIDE(i, n8) {
        ss_bf8 v = x[i];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float lo = __uint_as_float(v.u[k] << 16), hi = __uint_as_float(v.u[k] & 0xffff0000u);
            s += (double)(lo * lo);
            s += (double)(hi * hi);
        }
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, s);
}

// ew_add_bf16x8 is ew_add for bf16 out, a, b with 8 elements per 16-byte access (n8 = n / 8
// vectors, 16-byte aligned); same arithmetic.
struct alignas(16) ew_bf8 { unsigned int u[4]; };

__device__ __forceinline__ float ew_lo(unsigned int u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float ew_hi(unsigned int u) { return __uint_as_float(u & 0xffff0000u); }

extern "C" __global__ void ew_add_bf16x8(ew_bf8* out, const ew_bf8* a, const ew_bf8* b, long long n8) {
    GRID_STRIDE(i, n8) {
        ew_bf8 x = a[i], y = b[i], o;
#pragma unroll
        for (int k = 0; k < 4; k++)
            o.u[k] = (unsigned int)f2bf(ew_lo(x.u[k]) + ew_lo(y.u[k])) | ((unsigned int)f2bf(ew_hi(x.u[k]) + ew_hi(y.u[k])) << 16);
        out[i] = o;
    }
}
