// shortconv_check.cc: runs the kernels of kernels/shortconv.cu on the host (through emu.h) for
// TestShortConvKernelsOnHost, which passes the kernel source as kernels.inc and compares the
// results with the CPU backend's ShortConv and ShortConvBackward. The kernels are grid-stride
// loops without barriers or shared memory, so the emulation runs a block's threads one after
// another; the grid is kept small so that every thread takes several elements.
//
// Input on stdin, one case after another:
//
//	N C L has_bias dt
//	bcx (3NC values) w (CL) bias (C, when has_bias) pos (N) dg (NC) gw (CL) gbias (C)
//
// with every float tensor in dtype dt (1 f32, 2 bf16; the values are exact in it). Output per
// case, one line each: "conv ...", "gated ...", "dbcx ...", "gw ...", "gbias ..." (values as
// fp32, %.9g).
#include <cstdio>
#include <vector>

#include "emu.h"

emu_dim3 threadIdx, blockIdx, blockDim, gridDim;
float* emu_smem;
emu_barrier emu_block, emu_warp[32];
float emu_slot[2][32][32];
void emu_yield() {}

#include "kernels.inc"
#include "emu_tensor.h"

// launch runs body over the small grid of the emulation: 3 blocks of 32 threads.
template <class F>
static void launch(F body) {
    emu_grid(3, 1, 32, body);
}

int main() {
    long long N, C;
    int L, hasBias, dt;
    while (scanf("%lld %lld %d %d %d", &N, &C, &L, &hasBias, &dt) == 5) {
        tensor bcx(dt, 3 * N * C), w(dt, C * L), bias(dt, hasBias ? C : 0), dg(dt, N * C), gw(dt, C * L),
            gb(dt, C), conv(dt, N * C), gated(dt, N * C), dbcx(dt, 3 * N * C);
        std::vector<int> pos(N);
        bool ok = read(bcx) && read(w) && read(bias);
        for (auto& p : pos) ok = ok && scanf("%d", &p) == 1;
        ok = ok && read(dg) && read(gw) && read(gb);
        if (!ok) {
            fprintf(stderr, "shortconv_check: truncated case\n");
            return 1;
        }
        void* pb = hasBias ? bias.ptr() : nullptr;
        launch([&] {
            shortconv_fwd(conv.ptr(), dt, gated.ptr(), dt, bcx.ptr(), dt, w.ptr(), dt, pb, dt, pos.data(), N, C, L);
        });
        launch([&] {
            shortconv_bwd_in(dbcx.ptr(), dt, dg.ptr(), dt, bcx.ptr(), dt, w.ptr(), dt, conv.ptr(), dt, pos.data(), N, C,
                             L);
        });
        launch([&] {
            shortconv_bwd_w(gw.ptr(), dt, gb.ptr(), dt, dg.ptr(), dt, bcx.ptr(), dt, pos.data(), dt, N, C, L);
        });
        print("conv", conv);
        print("gated", gated);
        print("dbcx", dbcx);
        print("gw", gw);
        print("gbias", gb);
    }
    return 0;
}
