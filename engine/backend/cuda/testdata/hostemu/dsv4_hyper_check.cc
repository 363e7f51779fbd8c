// dsv4_hyper_check.cc: runs the kernels of kernels/dsv4_hyper.cu on the host (through emu.h)
// for TestDSV4HyperKernelsOnHost, which passes the kernel source as kernels.inc (static shared
// arrays made function statics) and compares the results with the CPU backend's ops. The
// one-thread-per-row and elementwise kernels are grid-stride loops run thread after thread;
// the stream backwards, one block per row with block_sum, run as fibers (emu_fibers.h).
//
// Input on stdin, one case after another, each starting with its kind (dt: 1 f32, 2 bf16, the
// dtype of the case's float operands; the hyper weights and their gradients, the stream
// weights and the gradients of post and comb are always f32; the values are exact in their
// dtype):
//
//	hyper N n iters head dt eps rows   z (N·M) scale (S) base (M) dpre (N·n) [dpost (N·n)
//	                                    dcomb (N·n·n) unless head] dz (N·M) gscale (S) gbase (M)
//	collapse N n C dt                   w (N·n) x (N·n·C) dout (N·C) dw (N·n) dx (N·n·C)
//	expand N n C dt                     post (N·n) f (N·C) comb (N·n·n) x (N·n·C) dout (N·n·C)
//	                                    dpost (N·n) dcomb (N·n·n) df (N·C) dx (N·n·C)
//	sqrtsp cnt dt                       x dout dx (cnt each)
//	swiglu cnt dt limit                 gate up dout dgate dup (cnt each)
//
// with M = (2+n)·n and S = 3 (M = n and S = 1 with head) and rows the chunk of the parameter
// sums. The gradients start at the values read. Output, one line per result ("name v ..."):
// hyper: pre post comb dz gscale gbase (post and comb empty with head); collapse: out dw dx;
// expand: out dpost dcomb df dx, then "inplace" (the forward with out = x); sqrtsp: out dx;
// swiglu: out dgate dup.
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

// grid runs a barrier-free grid-stride kernel over 3 blocks of 32 threads, so that a thread
// takes several items.
template <class F>
static void grid(F body) {
    emu_grid(3, 1, 32, body);
}

// blocks runs a block-per-row kernel over 2 blocks of 64 threads as fibers.
static void blocks(const std::function<void()>& body) {
    gridDim = {2, 1, 1};
    emu_launch(2, 1, 64, 0, body);
}

static bool read_all(std::vector<tensor*> ts) {
    for (auto* t : ts)
        if (!read(*t)) return false;
    return true;
}

static int hyper_case() {
    long long N, rows;
    int n, iters, head, dt;
    float eps;
    if (scanf("%lld %d %d %d %d %f %lld", &N, &n, &iters, &head, &dt, &eps, &rows) != 7) return 1;
    int M = head ? n : (2 + n) * n, S = head ? 1 : 3;
    long long pn = head ? 0 : N * n, cn = head ? 0 : N * n * n;
    tensor z(dt, N * M), scale(dt, S), base(dt, M), dpre(DT_F32, N * n), dpost(DT_F32, pn), dcomb(DT_F32, cn),
        dz(dt, N * M), gscale(dt, S), gbase(dt, M), pre(DT_F32, N * n), post(DT_F32, pn), comb(DT_F32, cn),
        gzz(DT_F32, N * M);
    if (!read_all({&z, &scale, &base, &dpre, &dpost, &dcomb, &dz, &gscale, &gbase})) return 1;
    long long nb = (N + rows - 1) / rows;
    tensor part(DT_F32, nb * 2 * M);
    float* pp = head ? nullptr : post.fp();
    float* pc = head ? nullptr : comb.fp();
    grid([&] {
        dsv4_hyper_fwd(z.ptr(), dt, scale.ptr(), dt, base.ptr(), dt, pre.fp(), pp, pc, N, n, iters, eps, head);
    });
    grid([&] {
        dsv4_hyper_bwd(dz.ptr(), dt, gzz.fp(), z.ptr(), dt, scale.ptr(), dt, base.ptr(), dt, dpre.fp(),
                       head ? nullptr : dpost.fp(), head ? nullptr : dcomb.fp(), N, n, iters, eps, head);
    });
    grid([&] { dsv4_hyper_part(part.fp(), gzz.fp(), z.ptr(), dt, N, M, rows); });
    grid([&] { dsv4_hyper_fold(gscale.ptr(), dt, gbase.ptr(), dt, part.fp(), nb, n, M, S, head); });
    print("pre", pre);
    print("post", post);
    print("comb", comb);
    print("dz", dz);
    print("gscale", gscale);
    print("gbase", gbase);
    return 0;
}

static int collapse_case() {
    long long N, C;
    int n, dt;
    if (scanf("%lld %d %lld %d", &N, &n, &C, &dt) != 4) return 1;
    tensor w(DT_F32, N * n), x(dt, N * n * C), dout(dt, N * C), dw(DT_F32, N * n), dx(dt, N * n * C), out(dt, N * C);
    if (!read_all({&w, &x, &dout, &dw, &dx})) return 1;
    grid([&] { dsv4_stream_collapse_fwd(out.ptr(), dt, w.fp(), x.ptr(), dt, N, n, C); });
    blocks([&] {
        dsv4_stream_collapse_bwd(dw.ptr(), DT_F32, dx.ptr(), dt, dout.ptr(), dt, w.fp(), x.ptr(), dt, N, n, C);
    });
    print("out", out);
    print("dw", dw);
    print("dx", dx);
    return 0;
}

static int expand_case() {
    long long N, C;
    int n, dt;
    if (scanf("%lld %d %lld %d", &N, &n, &C, &dt) != 4) return 1;
    tensor post(DT_F32, N * n), f(dt, N * C), comb(DT_F32, N * n * n), x(dt, N * n * C), dout(dt, N * n * C),
        dpost(DT_F32, N * n), dcomb(DT_F32, N * n * n), df(dt, N * C), dx(dt, N * n * C), out(dt, N * n * C);
    if (!read_all({&post, &f, &comb, &x, &dout, &dpost, &dcomb, &df, &dx})) return 1;
    grid([&] {
        dsv4_stream_expand_fwd(out.ptr(), dt, post.fp(), f.ptr(), dt, comb.fp(), x.ptr(), dt, N, n, C);
    });
    blocks([&] {
        dsv4_stream_expand_bwd(dpost.fp(), dcomb.fp(), df.ptr(), dt, dx.ptr(), dt, dout.ptr(), dt, post.fp(), f.ptr(),
                               dt, comb.fp(), x.ptr(), dt, N, n, C);
    });
    tensor inplace = x;
    grid([&] {
        dsv4_stream_expand_fwd(inplace.ptr(), dt, post.fp(), f.ptr(), dt, comb.fp(), inplace.ptr(), dt, N, n, C);
    });
    print("out", out);
    print("dpost", dpost);
    print("dcomb", dcomb);
    print("df", df);
    print("dx", dx);
    print("inplace", inplace);
    return 0;
}

static int sqrtsp_case() {
    long long cnt;
    int dt;
    if (scanf("%lld %d", &cnt, &dt) != 2) return 1;
    tensor x(dt, cnt), dout(dt, cnt), dx(dt, cnt), out(dt, cnt);
    if (!read_all({&x, &dout, &dx})) return 1;
    grid([&] { dsv4_sqrt_softplus_fwd(out.ptr(), dt, x.ptr(), dt, cnt); });
    grid([&] { dsv4_sqrt_softplus_bwd(dx.ptr(), dt, dout.ptr(), dt, x.ptr(), dt, out.ptr(), dt, cnt); });
    print("out", out);
    print("dx", dx);
    return 0;
}

static int swiglu_case() {
    long long cnt;
    int dt;
    float limit;
    if (scanf("%lld %d %f", &cnt, &dt, &limit) != 3) return 1;
    tensor gate(dt, cnt), up(dt, cnt), dout(dt, cnt), dgate(dt, cnt), dup(dt, cnt), out(dt, cnt);
    if (!read_all({&gate, &up, &dout, &dgate, &dup})) return 1;
    grid([&] { dsv4_swiglu_split_fwd(out.ptr(), dt, gate.ptr(), dt, up.ptr(), dt, limit, cnt); });
    grid([&] {
        dsv4_swiglu_split_bwd(dgate.ptr(), dt, dup.ptr(), dt, dout.ptr(), dt, gate.ptr(), dt, up.ptr(), dt, limit, cnt);
    });
    print("out", out);
    print("dgate", dgate);
    print("dup", dup);
    return 0;
}

int main() {
    char kind[16];
    while (scanf("%15s", kind) == 1) {
        int bad = 1;
        if (!strcmp(kind, "hyper")) bad = hyper_case();
        else if (!strcmp(kind, "collapse")) bad = collapse_case();
        else if (!strcmp(kind, "expand")) bad = expand_case();
        else if (!strcmp(kind, "sqrtsp")) bad = sqrtsp_case();
        else if (!strcmp(kind, "swiglu")) bad = swiglu_case();
        if (bad) {
            fprintf(stderr, "dsv4_hyper_check: bad or truncated %s case\n", kind);
            return 1;
        }
    }
    return 0;
}
