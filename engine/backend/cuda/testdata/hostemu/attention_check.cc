// attention_check.cc: runs the SIMT attention kernels of kernels/attention.cu on the host
// (through emu.h) and compares them with a float64 reference computed here from the contract
// stated at the top of attention.cu. Built and run by TestAttentionKernelsOnHost, which passes
// the kernel source as kernels.inc and one case per line on stdin:
//
//	HD NH NKV window scale_mul wide lens_q lens_k
//
// (lens comma-separated, lens_k "-" for keys = queries; scale = scale_mul / sqrt(HD); wide 1
// runs the *_wide kernels, 0 the whole-tile ones). For each case and output (out, lse and,
// without separate key boundaries, dq, dk, dv) it prints "case <i> <name> <max |err| / rms(ref)>".
// Tensors are fp32; inputs are uniform in [-1, 1] from a fixed seed.
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "emu.h"

emu_dim3 threadIdx, blockIdx, blockDim;
float* emu_smem;
emu_barrier emu_block, emu_warp[32];
float emu_slot[2][32][32];

#include "kernels.inc"

#include "emu_fibers.h"

// launch runs body for every block of a gx x gy grid of 32 * ROWS threads (emu_launch).
static void launch(unsigned gx, unsigned gy, size_t shared, const std::function<void()>& body) {
    emu_launch(gx, gy, 32 * ROWS, shared, body);
}

static std::vector<int> parse_lens(const std::string& s) {
    std::vector<int> v;
    if (s == "-") return v;
    std::stringstream ss(s);
    std::string x;
    while (std::getline(ss, x, ',')) v.push_back(std::atoi(x.c_str()));
    return v;
}

template <class V>
static double rel_err(const std::vector<float>& got, const V& ref) {
    double ss = 0, worst = 0;
    for (double r : ref) ss += r * r;
    double rms = std::sqrt(ss / ref.size()) + 1e-300;
    for (size_t i = 0; i < ref.size(); i++) {
        double e = std::fabs(got[i] - ref[i]) / rms;
        if (std::isnan(e)) return INFINITY;
        worst = std::max(worst, e);
    }
    return worst;
}

int main() {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> U(-1, 1);
    char buf[4096];
    for (int ci = 0; std::fgets(buf, sizeof buf, stdin); ci++) {
        int HD, NH, NKV, window, wide;
        float scale_mul;
        char lq[2048], lk[2048];
        if (std::sscanf(buf, "%d %d %d %d %f %d %2047s %2047s", &HD, &NH, &NKV, &window, &scale_mul, &wide, lq, lk) != 8) {
            std::fprintf(stderr, "case %d: cannot parse %s", ci, buf);
            return 2;
        }
        std::vector<int> lensQ = parse_lens(lq), lensK = parse_lens(lk);
        bool decode = !lensK.empty();
        if (!decode) lensK = lensQ;
        int D = lensQ.size(), G = NH / NKV;
        std::vector<int> cuq(D + 1, 0), cuk(D + 1, 0);
        for (int d = 0; d < D; d++) {
            cuq[d + 1] = cuq[d] + lensQ[d];
            cuk[d + 1] = cuk[d] + lensK[d];
        }
        long long N = cuq[D], Nk = cuk[D];
        float scale = scale_mul / std::sqrt((float)HD);
        std::vector<float> q(N * NH * HD), k(Nk * NKV * HD), v(Nk * NKV * HD), dout(N * NH * HD);
        for (auto* x : {&q, &k, &v, &dout})
            for (auto& e : *x) e = U(rng);

        // Reference: query iq of document d sees key jk iff jk <= iq + lenK - lenQ and, with a
        // window, (iq + lenK - lenQ) - jk < window.
        std::vector<double> rout(N * NH * HD, 0), rlse(N * NH, 0), rdq(N * NH * HD, 0), rdk(Nk * NKV * HD, 0), rdv(Nk * NKV * HD, 0);
        for (int d = 0; d < D; d++) {
            int lenQ = lensQ[d], lenK = lensK[d];
            for (int h = 0; h < NH; h++) {
                int g = h / G;
                for (int iq = 0; iq < lenQ; iq++) {
                    long long i = cuq[d] + iq;
                    const float* qi = &q[(i * NH + h) * HD];
                    const float* di = &dout[(i * NH + h) * HD];
                    int kpos = iq + lenK - lenQ;
                    std::vector<double> s(lenK, -INFINITY), P(lenK, 0);
                    double m = -INFINITY, l = 0;
                    for (int jk = 0; jk < lenK; jk++) {
                        if (jk > kpos || (window > 0 && kpos - jk >= window)) continue;
                        const float* kj = &k[((cuk[d] + jk) * NKV + g) * HD];
                        double dot = 0;
                        for (int e = 0; e < HD; e++) dot += (double)qi[e] * kj[e];
                        s[jk] = dot * scale;
                        m = std::max(m, s[jk]);
                    }
                    for (int jk = 0; jk < lenK; jk++)
                        if (s[jk] > -INFINITY) l += std::exp(s[jk] - m);
                    rlse[i * NH + h] = m + std::log(l);
                    for (int jk = 0; jk < lenK; jk++)
                        if (s[jk] > -INFINITY) P[jk] = std::exp(s[jk] - m) / l;
                    double Di = 0;
                    for (int e = 0; e < HD; e++) {
                        double o = 0;
                        for (int jk = 0; jk < lenK; jk++) o += P[jk] * v[((cuk[d] + jk) * NKV + g) * HD + e];
                        rout[(i * NH + h) * HD + e] = o;
                        Di += (double)di[e] * o;
                    }
                    if (decode) continue;
                    for (int jk = 0; jk < lenK; jk++) {
                        if (P[jk] == 0) continue;
                        long long j = cuk[d] + jk;
                        const float* kj = &k[(j * NKV + g) * HD];
                        const float* vj = &v[(j * NKV + g) * HD];
                        double dp = 0;
                        for (int e = 0; e < HD; e++) dp += (double)di[e] * vj[e];
                        double ds = P[jk] * (dp - Di);
                        for (int e = 0; e < HD; e++) {
                            rdq[(i * NH + h) * HD + e] += scale * ds * kj[e];
                            rdk[(j * NKV + g) * HD + e] += scale * ds * qi[e];
                            rdv[(j * NKV + g) * HD + e] += P[jk] * di[e];
                        }
                    }
                }
            }
        }

        // The kernels, with the grids and shared memory attention.go launches them with.
        std::vector<float> out(N * NH * HD), lse(N * NH), dq(N * NH * HD), dk(Nk * NKV * HD), dv(Nk * NKV * HD), dvec(N * NH);
        unsigned rows = (N + ROWS - 1) / ROWS;
        size_t P = HD + 1, stage = TILE * WP;
        size_t shF = wide ? 4 * (stage + ROWS * HD) : 4 * (2 * TILE * P + ROWS * HD);
        size_t shB = wide ? 4 * (stage + 2 * ROWS * HD) : 4 * (2 * TILE * P + 2 * ROWS * HD);
        auto fwd = wide ? attn_fwd_wide : attn_fwd;
        launch(rows, NH, shF, [&] {
            fwd(out.data(), lse.data(), q.data(), k.data(), v.data(), DT_F32, cuq.data(), cuk.data(), D, N, NH, NKV, HD, scale, window);
        });
        std::printf("case %d out %.3e\n", ci, rel_err(out, rout));
        std::printf("case %d lse %.3e\n", ci, rel_err(lse, rlse));
        if (decode) continue;
        for (long long r = 0; r < N * NH; r++) {
            float s = 0;
            for (int e = 0; e < HD; e++) s += dout[r * HD + e] * out[r * HD + e];
            dvec[r] = s;
        }
        auto bdq = wide ? attn_bwd_dq_wide : attn_bwd_dq;
        auto bdkv = wide ? attn_bwd_dkv_wide : attn_bwd_dkv;
        launch(rows, NH, shB, [&] {
            bdq(dq.data(), q.data(), k.data(), v.data(), dout.data(), DT_F32, lse.data(), dvec.data(), cuq.data(), D, N, NH, NKV, HD, scale, window);
        });
        launch(rows, NKV, shB, [&] {
            bdkv(dk.data(), dv.data(), q.data(), k.data(), v.data(), dout.data(), DT_F32, lse.data(), dvec.data(), cuq.data(), D, N, NH, NKV, HD, scale, window);
        });
        std::printf("case %d dq %.3e\n", ci, rel_err(dq, rdq));
        std::printf("case %d dk %.3e\n", ci, rel_err(dk, rdk));
        std::printf("case %d dv %.3e\n", ci, rel_err(dv, rdv));
        std::fflush(stdout);
    }
    return 0;
}
