// gated_delta_check.cc: runs the kernels of kernels/gated_delta.cu on the host (through emu.h)
// for TestGatedDeltaKernelsOnHost, which passes the kernel source as kernels.inc and compares
// the results with the CPU backend's GatedDelta and GatedDeltaBackward. The kernels have no
// barriers or shared memory (the threads of a block hold independent state columns), so the
// emulation runs the threads of a block one after another.
//
// Input on stdin, one case after another:
//
//	N KH VH KD VD chunk docs dt
//	cu (docs+1 ints) q k (N*KH*KD values each) v (N*VH*VD) beta g (N*VH) dout (N*VH*VD)
//
// with q, k, v, beta, g, out, dout and dv in dtype dt (1 f32, 2 bf16; the values exact in it)
// and states, dq, dk, dbeta and dg in f32. Output per case, one line each: "out ...",
// "states ...", "dq ...", "dk ...", "dv ...", "dbeta ...", "dg ..." (as fp32, %.9g).
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

template <class F>
static void launch(unsigned gx, unsigned gy, unsigned threads, F body) {
    emu_grid(gx, gy, threads, body);
}

int main() {
    long long N;
    int KH, VH, KD, VD, chunk, docs, dt;
    while (scanf("%lld %d %d %d %d %d %d %d", &N, &KH, &VH, &KD, &VD, &chunk, &docs, &dt) == 8) {
        std::vector<int> cu(docs + 1);
        bool ok = true;
        for (auto& c : cu) ok = ok && scanf("%d", &c) == 1;
        long long rows = (N + chunk - 1) / chunk;
        tensor q(dt, N * KH * KD), k(dt, N * KH * KD), v(dt, N * VH * VD), beta(dt, N * VH), g(dt, N * VH),
            dout(dt, N * VH * VD), out(dt, N * VH * VD), dv(dt, N * VH * VD), states(DT_F32, rows * VH * KD * VD),
            dq(DT_F32, N * KH * KD), dk(DT_F32, N * KH * KD), db(DT_F32, N * VH), dg(DT_F32, N * VH);
        ok = ok && read(q) && read(k) && read(v) && read(beta) && read(g) && read(dout);
        if (!ok) {
            fprintf(stderr, "gated_delta_check: truncated case\n");
            return 1;
        }
        // Kept states the forward does not write (rows inside no document) stay NaN, so a
        // backward that reads one shows.
        for (auto& x : states.f) x = NAN;
        // Launch with more threads than VD, as a block rounded up to a warp would.
        unsigned threads = (unsigned)((VD + 31) / 32 * 32);
        launch(VH, docs, threads, [&] {
            gated_delta_fwd(out.ptr(), dt, states.fp(), q.ptr(), dt, k.ptr(), dt, v.ptr(), dt, beta.ptr(), dt, g.ptr(),
                            dt, cu.data(), KH, VH, KD, VD, chunk);
        });
        launch(VH, docs, threads, [&] {
            gated_delta_bwd(dq.fp(), dk.fp(), dv.ptr(), dt, db.fp(), dg.fp(), states.fp(), dout.ptr(), dt, q.ptr(), dt,
                            k.ptr(), dt, v.ptr(), dt, beta.ptr(), dt, g.ptr(), dt, cu.data(), KH, VH, KD, VD, chunk);
        });
        print("out", out);
        print("states", states);
        print("dq", dq);
        print("dk", dk);
        print("dv", dv);
        print("dbeta", db);
        print("dg", dg);
    }
    return 0;
}
