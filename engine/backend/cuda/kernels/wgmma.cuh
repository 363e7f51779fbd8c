// wgmma.cuh: Hopper warpgroup-MMA (wgmma) helpers shared by the sm_90a kernel files
// (attention_wg.cu, grouped_gemm_wg.cu): shared-memory matrix descriptors for the 128-byte
// swizzled tile layout, the fences and waits of the async proxy, and the m64n64k16 and
// m64n128k16 bf16 products with fp32 accumulators.
//
// Tile layout (both files): a tile of R rows x C bf16 columns is stored as C / 64 panels of
// R rows x 128 bytes (panel p holds columns [64p, 64p + 64)); in a panel, the 16-byte chunk c
// of row r is at byte r * 128 + ((c ^ (r % 8)) * 16), with every panel on a 1024-byte
// boundary. The K-major descriptor of 16-column slice kk starts at panel kk / 4, byte
// 32 (kk % 4), with 1024 bytes between 8-row groups; the MN-major one of 16-row slice kk starts
// at row 16 kk, with 1024 bytes between 8-row groups and R * 128 between panels.

// wg_desc: a shared address (below 2^18, as every sm_90 shared address is) with its leading and
// stride byte offsets and the 128-byte swizzle, in wgmma's descriptor layout.
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    unsigned lo = (addr >> 4) | ((lbo >> 4) << 16), hi = (sbo >> 4) | (1u << 30);
    return ((unsigned long long)hi << 32) | lo;
}

// wg_desc_plus moves descriptor d by off bytes (a multiple of 16 that keeps the address below
// 2^18): the address field is the low 14 bits, so this is one add; kernels build a tile's
// descriptor once and step it with constants.
__device__ __forceinline__ unsigned long long wg_desc_plus(unsigned long long d, unsigned off) { return d + (off >> 4); }

// wg_kstep: the K-major descriptor d0 of a tile of R rows (slice 0) moved to 16-column slice kk.
template <int R>
__device__ __forceinline__ unsigned long long wg_kstep(unsigned long long d0, int kk) {
    return wg_desc_plus(d0, (kk >> 2) * (R * 128) + (kk & 3) * 32);
}

// wg_mnstep: the MN-major descriptor d0 of a tile (slice 0) moved to 16-row slice kk.
__device__ __forceinline__ unsigned long long wg_mnstep(unsigned long long d0, int kk) { return wg_desc_plus(d0, kk * 2048); }

// wg_desc_k: the tile at base as a K-major operand, slice 0 (wg_kstep moves it).
__device__ __forceinline__ unsigned long long wg_desc_k(unsigned base) { return wg_desc(base, 16, 1024); }

// wg_desc_mn: the tile of R rows at base as an MN-major B operand, slice 0 (wg_mnstep moves it).
template <int R>
__device__ __forceinline__ unsigned long long wg_desc_mn(unsigned base) { return wg_desc(base, R * 128, 1024); }

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// wg_wait_1 waits until at most the most recent group is pending.
__device__ __forceinline__ void wg_wait_1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }

// wg_hold keeps the compiler from moving reads or writes of the n registers d across the wgmma
// issue and wait instructions that use them.
template <int n>
__device__ __forceinline__ void wg_hold(float* d) {
#pragma unroll
    for (int i = 0; i < n; i++) asm volatile("" : "+f"(d[i])::"memory");
}
template <int n>
__device__ __forceinline__ void wg_hold_u(unsigned* d) {
#pragma unroll
    for (int i = 0; i < n; i++) asm volatile("" : "+r"(d[i])::"memory");
}

// Shared memory written by cp.async is read by wgmma (the async proxy): each thread fences its
// copies before the barrier that publishes them.
__device__ __forceinline__ void wg_fence_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// wg_tile_base is the first 1024-byte boundary of the dynamic shared memory (the launch asks
// for 1024 bytes more than the tiles need).
__device__ __forceinline__ unsigned wg_tile_base(const void* smem) { return (smem_addr(smem) + 1023u) & ~1023u; }

// wg_ss_n64: d (64 x 64, fp32) (+)= A . B, A and B K-major in shared memory (descriptors da,
// db); d is overwritten when accumulate is 0.
__device__ __forceinline__ void wg_ss_n64(float* d, unsigned long long da, unsigned long long db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(accumulate));
}

// wg_ss_n128: d (64 x 128, fp32) (+)= A . B, A and B K-major in shared memory (descriptors da,
// db); d is overwritten when accumulate is 0.
__device__ __forceinline__ void wg_ss_n128(float* d, unsigned long long da, unsigned long long db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(accumulate));
}


// wg_rs_n64: d (64 x 64, fp32) += A . B, A (64 x 16 bf16) in registers as the A fragments of
// mma.sync for each warp's 16 rows, B MN-major in shared memory (descriptor db).
__device__ __forceinline__ void wg_rs_n64(float* d, const unsigned* a, unsigned long long db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// wg_rs_n128: d (64 x 128, fp32) += A . B, A (64 x 16 bf16) in registers as the A fragments of
// mma.sync for each warp's 16 rows, B MN-major in shared memory (descriptor db).
__device__ __forceinline__ void wg_rs_n128(float* d, const unsigned* a, unsigned long long db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
