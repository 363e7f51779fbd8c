// dsv4_attention_check.cc: runs the kernels of kernels/dsv4_attention.cu on the host (through
// emu.h) for TestSinkAttentionKernelsOnHost, which passes the kernel source as kernels.inc
// (dynamic shared memory read from emu_smem, static shared arrays made function statics) and
// compares the results with the CPU backend's SinkAttention and SinkAttentionBackward. A
// block's threads are fibers, so the warp sums and __syncthreads run as barriers.
//
// Input on stdin, one case after another:
//
//	N C H D window rate has_mask dt warps key_warps scale
//	q (N*H*D values) kv (S*D, S = N+C) sinks (H) mask (N*C ints, when has_mask)
//	dout (N*H*D) dq (N*H*D) dkv (S*D) gsinks (H)
//
// with q, kv, sinks, out, dout, dq, dkv and gsinks in dtype dt (1 f32, 2 bf16; the values exact
// in it) and lse in f32; dq, dkv and gsinks are the gradients' values before the backward adds
// to them. warps is the heads of one forward or dq block, key_warps the warps of one dkv block.
// Output per case, one line each: "out ...", "lse ...", "dq ...", "dkv ...", "gsinks ..."
// (values as fp32, %.9g).
#include <cstdio>
#include <vector>

#include "emu.h"

emu_dim3 threadIdx, blockIdx, blockDim, gridDim;
float* emu_smem;
emu_barrier emu_block, emu_warp[32];
float emu_slot[2][32][32];

#include "kernels.inc"
#include "emu_fibers.h"
#include "emu_tensor.h"

// launch runs body over a gx x gy grid of blocks of threads fibers with shared bytes of
// dynamic shared memory.
static void launch(unsigned gx, unsigned gy, unsigned threads, size_t shared, const std::function<void()>& body) {
    gridDim = {gx, gy, 1};
    emu_launch(gx, gy, threads, shared, body);
}

int main() {
    int N, C, H, D, window, rate, hasMask, dt, warps, kwarps;
    float scale;
    while (scanf("%d %d %d %d %d %d %d %d %d %d %f", &N, &C, &H, &D, &window, &rate, &hasMask, &dt, &warps, &kwarps,
                 &scale) == 11) {
        long long S = N + C, QN = (long long)N * H * D;
        tensor q(dt, QN), kv(dt, S * D), sinks(dt, H), dout(dt, QN), dq(dt, QN), dkv(dt, S * D), gs(dt, H), out(dt, QN),
            lse(DT_F32, (long long)N * H), delta(DT_F32, (long long)N * H);
        std::vector<int> mask(hasMask ? (size_t)N * C : 0);
        bool ok = read(q) && read(kv) && read(sinks);
        for (auto& m : mask) ok = ok && scanf("%d", &m) == 1;
        ok = ok && read(dout) && read(dq) && read(dkv) && read(gs);
        if (!ok) {
            fprintf(stderr, "dsv4_attention_check: truncated case\n");
            return 1;
        }
        // Unwritten outputs and scratch stay NaN, so that a result read before it is written
        // shows.
        for (auto& x : lse.f) x = NAN;
        for (auto& x : delta.f) x = NAN;
        for (size_t i = 0; i < out.size(); i++) out.set(i, NAN);
        const int* pm = hasMask ? mask.data() : nullptr;
        unsigned gy = (unsigned)((H + warps - 1) / warps);
        size_t shared = 4 * (size_t)SA_TK * (D + 1);
        launch(N, gy, 32 * warps, shared, [&] {
            dsv4_sink_attn_fwd(out.ptr(), dt, lse.fp(), q.ptr(), dt, kv.ptr(), dt, sinks.ptr(), dt, pm, N, C, H, D,
                               window, rate, scale);
        });
        launch(N, gy, 32 * warps, shared, [&] {
            dsv4_sink_attn_bwd_dq(dq.ptr(), dt, delta.fp(), dout.ptr(), dt, out.ptr(), dt, lse.fp(), q.ptr(), dt,
                                  kv.ptr(), dt, pm, N, C, H, D, window, rate, scale);
        });
        launch(S, 1, 32 * kwarps, 4 * (size_t)kwarps * D, [&] {
            dsv4_sink_attn_bwd_dkv(dkv.ptr(), dt, dout.ptr(), dt, delta.fp(), lse.fp(), q.ptr(), dt, kv.ptr(), dt, pm,
                                   N, C, H, D, window, rate, scale);
        });
        launch(H, 1, 256, 0, [&] {
            dsv4_sink_attn_bwd_sinks(gs.ptr(), dt, sinks.ptr(), dt, delta.fp(), lse.fp(), N, H);
        });
        print("out", out);
        print("lse", lse);
        print("dq", dq);
        print("dkv", dkv);
        print("gsinks", gs);
    }
    return 0;
}
