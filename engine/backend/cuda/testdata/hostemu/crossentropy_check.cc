// crossentropy_check.cc: runs ce_rows of kernels/crossentropy.cu on the host (through emu.h and
// emu_fibers.h) for TestCrossEntropyKernelOnHost, which passes the kernel source as kernels.inc
// and compares the results with a float64 reference. Input on stdin, one case after another:
//
//	R V row0 dtl dtdl alias cap scale
//	logits (R*V values, exact in dtl) targets (row0 + R ints)
//
// dtl and dtdl are the dtype codes of the logits and dlogits (1 f32, 2 bf16); alias 1 writes the
// dlogits over the logits (dtl == dtdl), as the CUDA backend does when their dtypes agree. Output
// per case: "loss ...", "logprob ..." (rows row0 .. row0+R-1), "dlogits ..." (R*V, as fp32) and
// "bad n" (the smallest row with a target outside the vocabulary, or row0+R).
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

int main() {
    long long R, V, row0;
    int dtl, dtdl, alias;
    float cap, scale;
    while (scanf("%lld %lld %lld %d %d %d %f %f", &R, &V, &row0, &dtl, &dtdl, &alias, &cap, &scale) == 8) {
        tensor logits(dtl, R * V), dl(dtdl, alias ? 0 : R * V);
        if (!read(logits)) {
            fprintf(stderr, "crossentropy_check: truncated logits\n");
            return 1;
        }
        std::vector<int> targets(row0 + R);
        for (auto& t : targets)
            if (scanf("%d", &t) != 1) {
                fprintf(stderr, "crossentropy_check: truncated targets\n");
                return 1;
            }
        std::vector<float> loss(row0 + R, -1), logprob(row0 + R, -1);
        int bad = (int)(row0 + R);
        void* out = alias ? logits.ptr() : dl.ptr();
        emu_launch((unsigned)R, 1, 64, 0, [&] {
            ce_rows(logits.ptr(), dtl, targets.data(), loss.data(), logprob.data(), out, dtdl, scale, nullptr, row0, (int)V,
                    -100, &bad, cap);
        });
        printf("loss");
        for (long long i = row0; i < row0 + R; i++) printf(" %.9g", loss[i]);
        printf("\nlogprob");
        for (long long i = row0; i < row0 + R; i++) printf(" %.9g", logprob[i]);
        printf("\ndlogits");
        for (long long i = 0; i < R * V; i++) printf(" %.9g", ldf(out, dtdl, i));
        printf("\nbad %d\n", bad);
    }
    return 0;
}
