// crossentropy.cu: the per-row part of the fused LM head + cross-entropy.
//
// The Go side computes one chunk of logits [R, V] fp32 = hidden[rows] @ weight^T with cuBLASLt,
// calls ce_rows, then (backward) dhidden[rows] = dlogits @ weight (=) and
// dweight += dlogits^T @ hidden[rows] (+=). Only one chunk of logits exists at a time; the full
// [N, V] logits are never materialised.
//
// ce_rows, one block per row r of the chunk (global row n = row0 + r):
//   lse = log(sum_v exp(logits[r, v]));  logprob[n] = logits[r, t] - lse;  loss[n] = -logprob[n]
//   dlogits[r, v] = scale * (softmax[r, v] - [v == t])   (=, written when dlogits is not null)
// Rows whose target is ignore_index get loss = logprob = 0 and zero gradient. A target outside
// [0, V) that is not ignore_index records the smallest bad n in *bad (initialised to N).

extern "C" __global__ void ce_rows(const float* logits, const int* targets, float* loss, float* logprob,
                                   void* dlogits, int dtdl, float scale, long long row0, int V,
                                   int ignore_index, int* bad) {
    __shared__ float scratch[32];
    long long r = blockIdx.x;
    long long n = row0 + r;
    const float* lr = logits + r * (long long)V;
    int t = targets[n];
    bool ignored = (t == ignore_index);
    if (!ignored && (t < 0 || t >= V)) {
        if (threadIdx.x == 0) atomicMin(bad, (int)n);
        ignored = true;
    }
    float m = __int_as_float(0xff800000);
    for (int v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, lr[v]);
    m = block_max(m, scratch);
    float s = 0.f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) s += expf(lr[v] - m);
    s = block_sum(s, scratch);
    float lse = m + logf(s);
    if (threadIdx.x == 0) {
        float lp = ignored ? 0.f : lr[t] - lse;
        if (loss) loss[n] = -lp;
        if (logprob) logprob[n] = lp;
    }
    if (dlogits) {
        for (int v = threadIdx.x; v < V; v += blockDim.x) {
            float g = 0.f;
            if (!ignored) g = scale * (expf(lr[v] - lse) - (v == t ? 1.f : 0.f));
            stf(dlogits, dtdl, r * (long long)V + v, g);
        }
    }
}
