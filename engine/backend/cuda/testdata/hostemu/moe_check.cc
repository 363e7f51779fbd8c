// moe_check.cc: runs kernels of kernels/moe.cu on the host (through emu.h) for
// TestMoEKernelsOnHost, which passes the kernel source as kernels.inc (dynamic shared memory
// read from emu_smem, static shared arrays made function statics) and compares the results with
// the CPU backend's ops. A block's threads are fibers, so the router's warp shuffles and
// __syncwarp and the column sums' __syncthreads run as barriers.
//
// Input on stdin, one case after another, each starting with its kind:
//
//	geglu R I dt vec    gu (R*2I values) dout (R*I values)
//	route N E K sigmoid norm scaling    logits (N*E) escale (E) dweights (N*K)
//
// geglu runs geglu_packed_fwd and geglu_packed_bwd in place over a copy of gu (vec 1: their
// bf16x8 forms, for dt 2 and I a multiple of 8) with gu, dout, out and dgu in dtype dt (1 f32,
// 2 bf16; the values exact in it) and prints "out ...", "dgu ...". route runs moe_route_fwd
// with the expert scale, moe_route_bwd with it and the dscale terms, and the column sums
// (moe_prob_sum_part, moe_prob_sum) into dscale, all f32, and prints "probs ...", "sel ...",
// "weights ...", "dlogits ...", "dscale ..." (values as fp32, %.9g).
#include <cstdio>
#include <cstring>
#include <vector>

#include "emu.h"

emu_dim3 threadIdx, blockIdx, blockDim, gridDim;
float* emu_smem;
emu_barrier emu_block, emu_warp[32];
float emu_slot[2][32][32];

#include "kernels.inc"
#include "emu_fibers.h"
#include "emu_tensor.h"

// launch runs body over a gx x gy grid of tx x ty threads as fibers (emu_launch_xy), with
// gridDim set for the kernels' grid-stride loops.
static void launch(unsigned gx, unsigned gy, unsigned tx, unsigned ty, size_t shared, const std::function<void()>& body) {
    gridDim = {gx, gy, 1};
    emu_launch_xy(gx, gy, tx, ty, shared, body);
}

static int geglu_case() {
    long long R;
    int I, dt, vec;
    if (scanf("%lld %d %d %d", &R, &I, &dt, &vec) != 4) return 1;
    tensor gu(dt, R * 2 * I), dout(dt, R * I), out(dt, R * I);
    if (!read(gu) || !read(dout)) return 1;
    tensor dgu = gu;  // the backward runs in place
    if (vec) {
        int I8 = I / 8;
        launch(3, 1, 32, 1, 0, [&] {
            geglu_packed_fwd_bf16x8((moe_v16*)out.ptr(), (const moe_v16*)gu.ptr(), R, I8);
        });
        launch(3, 1, 32, 1, 0, [&] {
            geglu_packed_bwd_bf16x8((moe_v16*)dgu.ptr(), (const moe_v16*)dout.ptr(), (const moe_v16*)dgu.ptr(), R, I8);
        });
    } else {
        launch(3, 1, 32, 1, 0, [&] { geglu_packed_fwd(out.ptr(), dt, gu.ptr(), dt, R, I); });
        launch(3, 1, 32, 1, 0, [&] { geglu_packed_bwd(dgu.ptr(), dt, dout.ptr(), dt, dgu.ptr(), dt, R, I); });
    }
    print("out", out);
    print("dgu", dgu);
    return 0;
}

static int route_case() {
    int N, E, K, sigmoid, norm;
    float scaling;
    if (scanf("%d %d %d %d %d %f", &N, &E, &K, &sigmoid, &norm, &scaling) != 6) return 1;
    tensor logits(DT_F32, N * E), escale(DT_F32, E), dw(DT_F32, N * K);
    if (!read(logits) || !read(escale) || !read(dw)) return 1;
    tensor probs(DT_F32, N * E), weights(DT_F32, N * K), dlogits(DT_F32, N * E), gq(DT_F32, N * E), dscale(DT_F32, E),
        sel(DT_F32, N * K);
    std::vector<int> isel(N * K);
    // Two warps per block and two blocks: each warp takes several tokens (the grid-stride loop).
    const int warps = 2;
    launch(2, 1, 32 * warps, 1, warps * 4 * 2 * E, [&] {
        moe_route_fwd(logits.ptr(), DT_F32, nullptr, probs.f.data(), isel.data(), weights.f.data(), nullptr,
                      escale.f.data(), N, E, K, sigmoid, norm, scaling, 0, 0);
    });
    launch(2, 1, 32 * warps, 1, warps * 4 * E, [&] {
        moe_route_bwd(probs.f.data(), isel.data(), weights.f.data(), dw.f.data(), nullptr, dlogits.ptr(), DT_F32,
                      escale.f.data(), gq.f.data(), N, E, K, sigmoid, norm, scaling);
    });
    // The launcher's column sum (columnSumOnThread).
    int r = std::min(128, (N + 31) / 32), per = (N + r - 1) / r;
    std::vector<float> part(r * E);
    launch((E + 31) / 32, r, 32, 8, 0, [&] { moe_prob_sum_part(gq.f.data(), part.data(), N, E, per); });
    launch((E + 255) / 256, 1, 256, 1, 0, [&] { moe_prob_sum(part.data(), dscale.f.data(), r, E); });
    for (int i = 0; i < N * K; i++) sel.set(i, (float)isel[i]);
    print("probs", probs);
    print("sel", sel);
    print("weights", weights);
    print("dlogits", dlogits);
    print("dscale", dscale);
    return 0;
}

int main() {
    char kind[16];
    while (scanf("%15s", kind) == 1) {
        int bad = strcmp(kind, "geglu") == 0 ? geglu_case() : strcmp(kind, "route") == 0 ? route_case() : 1;
        if (bad) {
            fprintf(stderr, "moe_check: bad or truncated case of kind %s\n", kind);
            return 1;
        }
    }
    return 0;
}
