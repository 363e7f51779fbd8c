// dsv4_pool_check.cc: runs the kernels of kernels/dsv4_pool.cu on the host (through emu.h and
// emu_fibers.h) for TestDSV4PoolKernelsOnHost, which passes the kernel source as kernels.inc
// and compares the results with the CPU backend's WindowPool, WindowPoolBackward and
// IndexScores. The window-pool kernels are grid-stride loops without barriers, run thread after
// thread over a small grid so that every thread takes several elements; index_scores stages
// tiles in shared memory between __syncthreads, so its blocks run as fibers.
//
// Input on stdin, one case after another, each introduced by its kind:
//
//	pool N W m overlap dt
//	kv gate (N*W values each) ape (m*W) dout (windows*D) dkv dgate (N*W) gape (m*W)
//
//	index N n Hi Di rate dt
//	q (N*Hi*Di) keys (n*Di) wts (N*Hi)
//
// with every float tensor in dtype dt (1 f32, 2 bf16; the values are exact in it); dkv, dgate
// and gape are the gradients' values before the backward adds to them. Output per pool case,
// one line each: "out ...", "dkv ...", "dgate ...", "gape ..."; per index case: "scores ..."
// (f32; values as %.9g, -inf where masked).
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

// launch runs a grid-stride kernel over the small grid of the emulation: 3 blocks of 32 threads.
template <class F>
static void launch(F body) {
    emu_grid(3, 1, 32, body);
}

static int pool_case() {
    long long N, W;
    int m, overlap, dt;
    if (scanf("%lld %lld %d %d %d", &N, &W, &m, &overlap, &dt) != 5) return 1;
    long long D = overlap ? W / 2 : W, windows = N / m, cells = windows * D;
    tensor kv(dt, N * W), gate(dt, N * W), ape(dt, m * W), dout(dt, cells), dkv(dt, N * W), dgate(dt, N * W),
        gape(dt, m * W), out(dt, cells);
    if (!(read(kv) && read(gate) && read(ape) && read(dout) && read(dkv) && read(dgate) && read(gape))) return 1;
    long long chunks = (windows + WP_CHUNK - 1) / WP_CHUNK, mw = m * W;
    std::vector<float> stats(3 * cells), part(chunks * mw, NAN);
    launch([&] { wp_fwd(out.ptr(), dt, kv.ptr(), dt, gate.ptr(), dt, ape.ptr(), dt, windows, W, D, m, overlap); });
    launch([&] {
        wp_bwd_cells(dkv.ptr(), dt, dgate.ptr(), dt, stats.data(), dout.ptr(), dt, kv.ptr(), dt, gate.ptr(), dt,
                     ape.ptr(), dt, windows, W, D, m, overlap);
    });
    launch([&] {
        wp_bwd_ape_part(part.data(), stats.data(), dout.ptr(), dt, kv.ptr(), dt, gate.ptr(), dt, ape.ptr(), dt,
                        windows, W, D, m, overlap);
    });
    launch([&] { wp_bwd_ape_sum(gape.ptr(), dt, part.data(), chunks, mw); });
    print("out", out);
    print("dkv", dkv);
    print("dgate", dgate);
    print("gape", gape);
    return 0;
}

static int index_case() {
    long long N, n;
    int Hi, Di, rate, dt;
    if (scanf("%lld %lld %d %d %d %d", &N, &n, &Hi, &Di, &rate, &dt) != 6) return 1;
    tensor q(dt, N * Hi * Di), keys(dt, n * Di), wts(dt, N * Hi), out(DT_F32, N * n);
    if (!(read(q) && read(keys) && read(wts))) return 1;
    for (size_t i = 0; i < out.size(); i++) out.set(i, NAN);
    float scale = 1.f / sqrtf((float)Di * (float)Hi);
    unsigned gx = (unsigned)((n + IS_T - 1) / IS_T), gy = (unsigned)((N + IS_T - 1) / IS_T);
    emu_launch(gx, gy, 256, 0, [&] {
        index_scores(out.fp(), q.ptr(), dt, keys.ptr(), dt, wts.ptr(), dt, N, n, Hi, Di, rate, scale);
    });
    print("scores", out);
    return 0;
}

int main() {
    char kind[16];
    while (scanf("%15s", kind) == 1) {
        int bad = strcmp(kind, "pool") == 0 ? pool_case() : strcmp(kind, "index") == 0 ? index_case() : 1;
        if (bad) {
            fprintf(stderr, "dsv4_pool_check: bad or truncated case (%s)\n", kind);
            return 1;
        }
    }
    return 0;
}
