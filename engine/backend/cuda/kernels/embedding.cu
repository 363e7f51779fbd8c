// embedding.cu: token embedding gather and its deterministic scatter-add backward.
//
// Shapes: ids [N] i32; weight, dweight [V, C]; out, dout [N, C].
// Forward:  out[n, :] = weight[ids[n], :]                     (=). An id outside [0, V) writes
//           zeros and records the smallest bad n in *bad (initialised to N by the caller).
// Backward: dweight[v, :] += sum over n with ids[n] == v of dout[n, :]   (+=, parameter gradient)
//           The host sorts token indices by id (stable), giving order [N] and, per distinct id
//           u, the range seg[u] .. seg[u+1] of order; each (u, column) sums its rows in
//           increasing n order in fp32 and adds once, so the result is deterministic.

extern "C" __global__ void embedding_fwd(void* out, int dto, const void* weight, int dtw, const int* ids,
                                         long long N, int C, int V, int* bad) {
    GRID_STRIDE(t, N * C) {
        long long n = t / C;
        int c = (int)(t % C);
        int id = ids[n];
        if (id < 0 || id >= V) {
            if (c == 0) atomicMin(bad, (int)n);
            stf(out, dto, t, 0.f);
        } else {
            stf(out, dto, t, ldf(weight, dtw, (long long)id * C + c));
        }
    }
}

// grid (U, ceil(C / blockDim.x)); uniq [U] distinct ids; seg [U+1]; order [N].
extern "C" __global__ void embedding_bwd(void* dweight, int dtw, const void* dout, int dtd, const int* order,
                                         const int* uniq, const int* seg, int C) {
    int u = blockIdx.x;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.f;
    for (int k = seg[u]; k < seg[u + 1]; k++) s += ldf(dout, dtd, (long long)order[k] * C + c);
    long long i = (long long)uniq[u] * C + c;
    stf(dweight, dtw, i, ldf(dweight, dtw, i) + s);
}
