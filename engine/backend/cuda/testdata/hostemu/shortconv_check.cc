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

template <class F>
static void launch(F body) {
    gridDim = {3, 1, 1};
    blockDim = {32, 1, 1};
    for (unsigned b = 0; b < gridDim.x; b++)
        for (unsigned t = 0; t < blockDim.x; t++) {
            blockIdx = {b, 0, 0};
            threadIdx = {t, 0, 0};
            body();
        }
}

// tensor holds a float tensor in dtype dt.
struct tensor {
    int dt;
    std::vector<float> f;
    std::vector<bf16> h;
    tensor(int dt, size_t n) : dt(dt), f(dt == DT_F32 ? n : 0), h(dt == DT_BF16 ? n : 0) {}
    void* ptr() { return dt == DT_F32 ? (void*)f.data() : (void*)h.data(); }
    void set(size_t i, float v) { stf(ptr(), dt, (long long)i, v); }
    float get(size_t i) { return ldf(ptr(), dt, (long long)i); }
    size_t size() { return dt == DT_F32 ? f.size() : h.size(); }
};

static bool read(tensor& t) {
    for (size_t i = 0; i < t.size(); i++) {
        float v;
        if (scanf("%f", &v) != 1) return false;
        t.set(i, v);
    }
    return true;
}

static void print(const char* name, tensor& t) {
    printf("%s", name);
    for (size_t i = 0; i < t.size(); i++) printf(" %.9g", t.get(i));
    printf("\n");
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
