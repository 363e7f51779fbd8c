// dsv4_softmax_check.cc: runs the kernels of kernels/dsv4_softmax.cu (and dsv4_attention.cu's
// dsv4_sink_attn_bwd_sinks, which the backward's launcher runs for GSinks) on the host
// (through emu.h) for TestSinkSoftmaxKernelsOnHost, which passes both sources as kernels.inc
// (static shared arrays made function statics) and compares the results with the CPU
// backend's SinkSoftmax and SinkSoftmaxBackward. A block's threads are fibers, so the block
// reductions run as barriers.
//
// Input on stdin, one case after another:
//
//	N C H window rate has_mask dt vec threads
//	x (N*H*S values, S = N+C) sinks (H) mask (N*C ints, when has_mask) lse_in (N*H)
//	dp (N*H*S) gsinks (H)
//
// with x, dp, lse_in in f32 and sinks, gsinks, p and ds in dtype dt (1 f32, 2 bf16; the values
// exact in it); vec picks the 4-column kernels, threads is the block size. gsinks is the
// gradient's value before the backward adds to it.
// Output per case, one line each (values as fp32, %.9g): "p", "lse" (the forward writing
// lse), "p_uselse" (the forward reading lse_in), "ds", "gsinks" (the backward from p and lse
// into a ds of its own), "ds_alias" (the backward into p itself, no gsinks).
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

// launch runs body over a grid of gx blocks of threads fibers.
static void launch(unsigned gx, unsigned threads, const std::function<void()>& body) {
    gridDim = {gx, 1, 1};
    emu_launch(gx, 1, threads, 0, body);
}

int main() {
    int N, C, H, window, rate, hasMask, dt, vec, threads;
    while (scanf("%d %d %d %d %d %d %d %d %d", &N, &C, &H, &window, &rate, &hasMask, &dt, &vec, &threads) == 9) {
        int S = N + C, R = N * H;
        size_t RS = (size_t)R * S;
        tensor x(DT_F32, RS), sinks(dt, H), lsein(DT_F32, R), dp(DT_F32, RS), gs(dt, H);
        tensor p(dt, RS), pu(dt, RS), ds(dt, RS), pa(dt, RS), lse(DT_F32, R), delta(DT_F32, R);
        std::vector<int> mask(hasMask ? (size_t)N * C : 0);
        bool ok = read(x) && read(sinks);
        for (auto& m : mask) ok = ok && scanf("%d", &m) == 1;
        ok = ok && read(lsein) && read(dp) && read(gs);
        if (!ok) {
            fprintf(stderr, "dsv4_softmax_check: truncated case\n");
            return 1;
        }
        // Unwritten outputs and scratch stay NaN, so that a result read before it is written
        // shows.
        for (auto& v : lse.f) v = NAN;
        for (auto& v : delta.f) v = NAN;
        for (size_t i = 0; i < RS; i++) p.set(i, NAN), pu.set(i, NAN), ds.set(i, NAN);
        const int* pm = hasMask ? mask.data() : nullptr;
        auto fwd = vec ? dsv4_sink_softmax_fwd4 : dsv4_sink_softmax_fwd;
        auto bwd = vec ? dsv4_sink_softmax_bwd4 : dsv4_sink_softmax_bwd;
        launch(R, threads, [&] {
            fwd(p.ptr(), dt, lse.fp(), x.fp(), sinks.ptr(), dt, pm, N, C, H, S, window, rate, 0);
        });
        launch(R, threads, [&] {
            fwd(pu.ptr(), dt, lsein.fp(), x.fp(), sinks.ptr(), dt, pm, N, C, H, S, window, rate, 1);
        });
        launch(R, threads, [&] { bwd(ds.ptr(), dt, delta.fp(), p.ptr(), dt, dp.fp(), S); });
        launch(H, 256, [&] { dsv4_sink_attn_bwd_sinks(gs.ptr(), dt, sinks.ptr(), dt, delta.fp(), lse.fp(), N, H); });
        for (size_t i = 0; i < RS; i++) pa.set(i, p.get(i));
        launch(R, threads, [&] { bwd(pa.ptr(), dt, nullptr, pa.ptr(), dt, dp.fp(), S); });
        print("p", p);
        print("lse", lse);
        print("p_uselse", pu);
        print("ds", ds);
        print("gsinks", gs);
        print("ds_alias", pa);
    }
    return 0;
}
