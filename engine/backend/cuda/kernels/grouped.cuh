// grouped.cuh: device code shared by the grouped expert GEMM files (grouped_gemm.cu for every
// arch from sm_80, grouped_gemm_wg.cu for Hopper): the row-tile search over the group offsets
// and a counted cp.async wait. Both files' CTAs own GG_ROWS rows of one group.

#define GG_ROWS 128

// cp_wait_n waits until at most N of this thread's cp.async groups are pending.
template <int N>
__device__ __forceinline__ void cp_wait_n() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// gg_find_row_tile sets *g, *m0 and *m_end for row tile t of the concatenated per-group tiles
// (group g has ceil(M_g / GG_ROWS) of them), or *g = -1 when t is past the last. Warp 0 scans the
// offsets 32 groups at a time; the results are in shared memory after the barrier.
__device__ __forceinline__ void gg_find_row_tile(const int* off, int G, int t, int* g, int* m0, int* m_end) {
    if (threadIdx.x == 0) *g = -1;
    __syncthreads();
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        int base = 0;
        for (int c = 0; c < G; c += 32) {
            int gi = c + lane;
            int n = gi < G ? (off[gi + 1] - off[gi] + GG_ROWS - 1) / GG_ROWS : 0;
            int incl = n;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                int v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += v;
            }
            int lo = base + incl - n;
            unsigned hit = __ballot_sync(0xffffffffu, n > 0 && lo <= t && t < base + incl);
            if (hit) {
                if (lane == __ffs(hit) - 1) {
                    *g = gi;
                    *m0 = off[gi] + (t - lo) * GG_ROWS;
                    *m_end = off[gi + 1];
                }
                break;
            }
            base += __shfl_sync(0xffffffffu, incl, 31);
        }
    }
    __syncthreads();
}
