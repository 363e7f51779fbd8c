// dsv4_pool.cu: DeepSeek-V4's window pooling (the compressors) and the lightning indexer's
// scores (backend.DSV4Ops.WindowPool, WindowPoolBackward and IndexScores; engine/backend/dsv4.go
// states the contract, nn.HostTape.WindowPool and DSV4.index the arithmetic).
//
// Window pooling. Shapes: kv, gate [N,W], dkv, dgate [N,W] (+=; either may be null); ape [m,W]
// (m the rate), gape [m,W] (+=); out [windows,D] (=), dout [windows,D], with windows = N/m and
// D = W (W/2 with overlap). Cell (w,d) pools the slots
//   without overlap: rows w*m+i at column d                          (i < m)
//   with overlap:    rows (w-1)*m+i at column d (none for w = 0), then rows w*m+i at column D+d
// each slot (row, col) with logit gate[row,col] + ape[row % m, col]:
//   out[w,d] = sum_slots p * kv,  p the softmax of the cell's logits
//   dkv += dout * p,  dgate += dl,  gape[row % m, col] += dl,  dl = dout * p * (kv - out)
// Every element of kv and gate is a slot of at most one cell, so the forward and the cell
// backward are one thread per cell that writes its own slots; neighbouring threads take
// neighbouring channels of one window, so their reads are coalesced. gape sums over the
// windows: the cell backward leaves each cell's softmax statistics (max, sum, value) in a
// scratch buffer, one thread per (chunk of WP_CHUNK windows, ape element) sums its chunk in
// order into a partial, and one thread per ape element adds the partials in chunk order:
// deterministic, without atomics.
//
// Index scores. Shapes: q [N,Hi*Di], keys [n,Di], wts [N,Hi], out [N,n] f32 (=):
//   out[t,w] = scale * sum_h relu(q[t,h]·keys[w]) * wts[t,h]   w < (t+1)/rate, else -Inf
// with scale = 1/sqrt(Di*Hi). A block of 256 threads takes a tile of IS_T queries by IS_T
// keys, each thread 4x4 of them (queries ty+16i, keys tx+16j); per head the tile's dot
// products are a small matrix product staged through shared memory IS_K head dims at a time.
// A tile no query of which sees any of its keys is written -Inf without computing.
//
// Float tensors are f32 or bf16, each its own dtype; arithmetic is fp32.

#define WP_CHUNK 32
#define IS_T 64
#define IS_K 16

// wp_slot returns the row of slot j of cell (w,d) and sets *col to its column.
__device__ __forceinline__ long long wp_slot(long long w, long long d, int j, int m, long long D, int overlap,
                                             long long* col) {
    if (!overlap) {
        *col = d;
        return w * m + j;
    }
    if (w > 0) {
        if (j < m) {
            *col = d;
            return (w - 1) * m + j;
        }
        j -= m;
    }
    *col = D + d;
    return w * m + j;
}

// wp_logit is the slot's logit gate[row,col] + ape[row % m, col].
__device__ __forceinline__ float wp_logit(const void* gate, int dtg, const void* ape, int dta, long long row,
                                          long long col, int m, long long W) {
    return ldf(gate, dtg, row * W + col) + ldf(ape, dta, (row % m) * W + col);
}

// wp_softmax computes cell (w,d)'s softmax: its max logit *mx, the sum of exp(logit - max) *sum,
// and returns the pooled value.
__device__ __forceinline__ float wp_softmax(const void* kv, int dtk, const void* gate, int dtg, const void* ape,
                                            int dta, long long w, long long d, int m, long long W, long long D,
                                            int overlap, float* mx, float* sum) {
    int k = overlap && w > 0 ? 2 * m : m;
    float hi = __int_as_float(0xff800000);
    for (int j = 0; j < k; j++) {
        long long col, row = wp_slot(w, d, j, m, D, overlap, &col);
        hi = fmaxf(hi, wp_logit(gate, dtg, ape, dta, row, col, m, W));
    }
    float s = 0.f, acc = 0.f;
    for (int j = 0; j < k; j++) {
        long long col, row = wp_slot(w, d, j, m, D, overlap, &col);
        float p = expf(wp_logit(gate, dtg, ape, dta, row, col, m, W) - hi);
        s += p;
        acc += p * ldf(kv, dtk, row * W + col);
    }
    *mx = hi;
    *sum = s;
    return acc / s;
}

// wp_fwd writes out: one thread per cell.
extern "C" __global__ void wp_fwd(void* out, int dto, const void* kv, int dtk, const void* gate, int dtg,
                                  const void* ape, int dta, long long windows, long long W, long long D, int m,
                                  int overlap) {
    GRID_STRIDE(c, windows * D) {
        float mx, sum;
        stf(out, dto, c, wp_softmax(kv, dtk, gate, dtg, ape, dta, c / D, c % D, m, W, D, overlap, &mx, &sum));
    }
}

// wp_bwd_cells adds each cell's gradients to its slots of dkv and dgate (either may be null)
// and, with stats, leaves its max, sum and value at stats[c], stats[cells+c], stats[2*cells+c].
extern "C" __global__ void wp_bwd_cells(void* dkv, int dtdk, void* dgate, int dtdg, float* stats,
                                        const void* dout, int dtd, const void* kv, int dtk, const void* gate, int dtg,
                                        const void* ape, int dta, long long windows, long long W, long long D, int m,
                                        int overlap) {
    long long cells = windows * D;
    GRID_STRIDE(c, cells) {
        long long w = c / D, d = c % D;
        float mx, sum;
        float v = wp_softmax(kv, dtk, gate, dtg, ape, dta, w, d, m, W, D, overlap, &mx, &sum);
        if (stats) {
            stats[c] = mx;
            stats[cells + c] = sum;
            stats[2 * cells + c] = v;
        }
        if (!dkv && !dgate) continue;
        float g = ldf(dout, dtd, c), inv = 1.f / sum;
        int k = overlap && w > 0 ? 2 * m : m;
        for (int j = 0; j < k; j++) {
            long long col, row = wp_slot(w, d, j, m, D, overlap, &col);
            long long e = row * W + col;
            float gp = g * (expf(wp_logit(gate, dtg, ape, dta, row, col, m, W) - mx) * inv);
            if (dkv) stf(dkv, dtdk, e, ldf(dkv, dtdk, e) + gp);
            if (dgate) stf(dgate, dtdg, e, ldf(dgate, dtdg, e) + gp * (ldf(kv, dtk, e) - v));
        }
    }
}

// wp_bwd_ape_part writes part[k*m*W + i*W + c]: the sum over the windows of chunk k, in order,
// of the logit gradient of row (window's first row + i) at column c, from wp_bwd_cells' stats.
extern "C" __global__ void wp_bwd_ape_part(float* part, const float* stats, const void* dout, int dtd,
                                           const void* kv, int dtk, const void* gate, int dtg, const void* ape,
                                           int dta, long long windows, long long W, long long D, int m, int overlap) {
    long long mw = (long long)m * W, cells = windows * D;
    long long chunks = (windows + WP_CHUNK - 1) / WP_CHUNK;
    GRID_STRIDE(e, chunks * mw) {
        long long k = e / mw, r = e % mw;
        long long i = r / W, c = r % W;
        float a = ldf(ape, dta, r), acc = 0.f;
        long long end = (k + 1) * WP_CHUNK < windows ? (k + 1) * WP_CHUNK : windows;
        for (long long w = k * WP_CHUNK; w < end; w++) {
            // The cell that pools row w*m+i at column c: with overlap, its first D columns are
            // the previous-window slots of window w+1 (none past the last window).
            long long cw = w, d = c;
            if (overlap) {
                if (c < D) cw = w + 1;
                else d = c - D;
            }
            if (cw >= windows) break;
            long long cell = cw * D + d, el = (w * m + i) * W + c;
            float p = expf(ldf(gate, dtg, el) + a - stats[cell]) / stats[cells + cell];
            acc += ldf(dout, dtd, cell) * p * (ldf(kv, dtk, el) - stats[2 * cells + cell]);
        }
        part[e] = acc;
    }
}

// wp_bwd_ape_sum adds to gape[e] the partials of every chunk, in chunk order.
extern "C" __global__ void wp_bwd_ape_sum(void* gape, int dtga, const float* part, long long chunks, long long mw) {
    GRID_STRIDE(e, mw) {
        float s = 0.f;
        for (long long k = 0; k < chunks; k++) s += part[k * mw + e];
        stf(gape, dtga, e, ldf(gape, dtga, e) + s);
    }
}

// index_scores writes out for one tile of IS_T queries (blockIdx.y) by IS_T keys (blockIdx.x);
// blockDim.x is 256.
extern "C" __global__ void index_scores(float* out, const void* q, int dtq, const void* keys, int dtk,
                                        const void* wts, int dtw, long long N, long long n, int Hi, int Di, int rate,
                                        float scale) {
    __shared__ float is_q[IS_K][IS_T + 1];
    __shared__ float is_k[IS_K][IS_T + 1];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const long long t0 = (long long)blockIdx.y * IS_T, w0 = (long long)blockIdx.x * IS_T;
    const float ninf = __int_as_float(0xff800000);
    long long tEnd = t0 + IS_T < N ? t0 + IS_T : N;
    if (w0 >= tEnd / rate) {  // the tile's last query, tEnd-1, sees keys below tEnd/rate
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) {
                long long t = t0 + ty + 16 * i, w = w0 + tx + 16 * j;
                if (t < N && w < n) out[t * n + w] = ninf;
            }
        return;
    }
    float acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = 0.f;
    const long long qw = (long long)Hi * Di;
    for (int h = 0; h < Hi; h++) {
        float dot[4][4];
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) dot[i][j] = 0.f;
        for (int d0 = 0; d0 < Di; d0 += IS_K) {
            for (int s = threadIdx.x; s < IS_T * IS_K; s += blockDim.x) {
                int r = s / IS_K, kk = s % IS_K, dd = d0 + kk;
                long long t = t0 + r, w = w0 + r;
                is_q[kk][r] = t < N && dd < Di ? ldf(q, dtq, t * qw + (long long)h * Di + dd) : 0.f;
                is_k[kk][r] = w < n && dd < Di ? ldf(keys, dtk, w * Di + dd) : 0.f;
            }
            __syncthreads();
            for (int kk = 0; kk < IS_K; kk++) {
                float a[4], b[4];
                for (int i = 0; i < 4; i++) a[i] = is_q[kk][ty + 16 * i];
                for (int j = 0; j < 4; j++) b[j] = is_k[kk][tx + 16 * j];
                for (int i = 0; i < 4; i++)
                    for (int j = 0; j < 4; j++) dot[i][j] += a[i] * b[j];
            }
            __syncthreads();
        }
        for (int i = 0; i < 4; i++) {
            long long t = t0 + ty + 16 * i;
            float wt = t < N ? ldf(wts, dtw, t * Hi + h) : 0.f;
            for (int j = 0; j < 4; j++) acc[i][j] += fmaxf(dot[i][j], 0.f) * wt;
        }
    }
    for (int i = 0; i < 4; i++) {
        long long t = t0 + ty + 16 * i;
        if (t >= N) continue;
        long long limit = (t + 1) / rate;
        for (int j = 0; j < 4; j++) {
            long long w = w0 + tx + 16 * j;
            if (w < n) out[t * n + w] = w < limit ? acc[i][j] * scale : ninf;
        }
    }
}
