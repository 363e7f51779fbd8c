// gated_delta_stages_check.cc: runs the kernels of kernels/gated_delta_stages.cu on the host
// (through emu.h) for TestGatedDeltaStagesKernelsOnHost, which passes the kernel source as
// kernels.inc and compares the results with the CPU backend's GatedDeltaPrep,
// GatedDeltaPrepBackward, GatedRMSNorm and GatedRMSNormBackward. The kernels are grid-stride
// loops without barriers or shared memory, so the emulation runs a block's threads one after
// another; the grid is kept small so that every thread takes several items. The launches follow
// the host launchers of gated_delta_stages.go, with `rows` tokens (rows) per partial.
//
// Input on stdin, one case after another:
//
//	N KH VH KD VD L docs R W rows dt
//	cu (docs+1 ints) mixed (N*D) b a (N*VH) conv (D*L) dtbias alog (VH)
//	dq dk (N*KH*KD) dv (N*VH*VD) dbeta dg (N*VH) gconv (D*L) gdt galog (VH)
//	x z (R*W) w (W) dout (R*W) gw (W)
//
// with D = 2*KH*KD + VH*VD; q, k, v, beta, g, dq, dk, dbeta, dg and rstd in f32, every other
// float tensor in dtype dt (1 f32, 2 bf16; the values exact in it); gconv, gdt, galog and gw
// are the gradients' values before the backward adds to them. Output per case, one line each
// (as fp32, %.9g): q k v beta g dmixed db da gconv gdt galog out rstd dx dz gw.
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
    long long N, R, rows;
    int KH, VH, KD, VD, L, docs, W, dt;
    while (scanf("%lld %d %d %d %d %d %d %lld %d %lld %d", &N, &KH, &VH, &KD, &VD, &L, &docs, &R, &W, &rows, &dt) ==
           11) {
        long long D = 2LL * KH * KD + (long long)VH * VD;
        std::vector<int> cu(docs + 1);
        bool ok = true;
        for (auto& c : cu) ok = ok && scanf("%d", &c) == 1;
        tensor mixed(dt, N * D), b(dt, N * VH), a(dt, N * VH), conv(dt, D * L), dtb(dt, VH), alog(dt, VH);
        tensor dq(DT_F32, N * KH * KD), dk(DT_F32, N * KH * KD), dv(dt, N * VH * VD), dbeta(DT_F32, N * VH),
            dg(DT_F32, N * VH), gconv(dt, D * L), gdt(dt, VH), galog(dt, VH);
        tensor x(dt, R * W), z(dt, R * W), w(dt, W), dout(dt, R * W), gw(dt, W);
        ok = ok && read(mixed) && read(b) && read(a) && read(conv) && read(dtb) && read(alog);
        ok = ok && read(dq) && read(dk) && read(dv) && read(dbeta) && read(dg) && read(gconv) && read(gdt) &&
             read(galog);
        ok = ok && read(x) && read(z) && read(w) && read(dout) && read(gw);
        if (!ok) {
            fprintf(stderr, "gated_delta_stages_check: truncated case\n");
            return 1;
        }
        tensor q(DT_F32, N * KH * KD), k(DT_F32, N * KH * KD), v(DT_F32, N * VH * VD), beta(DT_F32, N * VH),
            g(DT_F32, N * VH), dmixed(dt, N * D), db(dt, N * VH), da(dt, N * VH), out(dt, R * W),
            rstd(DT_F32, R), dx(dt, R * W), dz(dt, R * W);
        // Scratch starts as NaN, as uninitialised device memory might, so that a kernel reading
        // an element no kernel wrote shows.
        long long nb = (N + rows - 1) / rows, P = D * L + 2LL * VH, nbr = (R + rows - 1) / rows;
        std::vector<float> dpre(N * D, NAN), part(nb * P, NAN), partw(nbr * W, NAN);
        launch([&] {
            gated_delta_prep_fwd(q.fp(), k.fp(), v.fp(), beta.fp(), g.fp(), mixed.ptr(), dt, b.ptr(), dt, a.ptr(), dt,
                                 conv.ptr(), dt, dtb.ptr(), dt, alog.ptr(), dt, cu.data(), docs, N, KH, VH, KD, VD, L);
        });
        launch([&] {
            gated_delta_prep_bwd_pre(dpre.data(), db.ptr(), dt, da.ptr(), dt, dq.fp(), dk.fp(), dv.ptr(), dt,
                                     dbeta.fp(), dg.fp(), mixed.ptr(), dt, b.ptr(), dt, a.ptr(), dt, conv.ptr(), dt,
                                     dtb.ptr(), dt, alog.ptr(), dt, cu.data(), docs, N, KH, VH, KD, VD, L);
        });
        launch([&] {
            gated_delta_prep_bwd_in(dmixed.ptr(), dt, dpre.data(), conv.ptr(), dt, cu.data(), docs, N, D, L);
        });
        launch([&] {
            gated_delta_prep_bwd_part(part.data(), dpre.data(), mixed.ptr(), dt, dg.fp(), a.ptr(), dt, dtb.ptr(), dt,
                                      alog.ptr(), dt, cu.data(), docs, N, D, VH, L, rows);
        });
        launch([&] { gated_delta_stages_fold(gconv.ptr(), dt, part.data(), nb, P, 0, D * L); });
        launch([&] { gated_delta_stages_fold(gdt.ptr(), dt, part.data(), nb, P, D * L, VH); });
        launch([&] { gated_delta_stages_fold(galog.ptr(), dt, part.data(), nb, P, D * L + VH, VH); });
        launch([&] {
            gated_rmsnorm_fwd(out.ptr(), dt, rstd.fp(), x.ptr(), dt, z.ptr(), dt, w.ptr(), dt, R, W, 1e-6f);
        });
        launch([&] {
            gated_rmsnorm_bwd(dx.ptr(), dt, dz.ptr(), dt, dout.ptr(), dt, x.ptr(), dt, z.ptr(), dt, w.ptr(), dt,
                              rstd.fp(), R, W);
        });
        launch([&] {
            gated_rmsnorm_bwd_part(partw.data(), dout.ptr(), dt, x.ptr(), dt, z.ptr(), dt, rstd.fp(), R, W, rows);
        });
        launch([&] { gated_delta_stages_fold(gw.ptr(), dt, partw.data(), nbr, W, 0, W); });
        print("q", q);
        print("k", k);
        print("v", v);
        print("beta", beta);
        print("g", g);
        print("dmixed", dmixed);
        print("db", db);
        print("da", da);
        print("gconv", gconv);
        print("gdt", gdt);
        print("galog", galog);
        print("out", out);
        print("rstd", rstd);
        print("dx", dx);
        print("dz", dz);
        print("gw", gw);
    }
    return 0;
}
