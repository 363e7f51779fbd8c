// emu_tensor.h: what the host emulations of grid-stride kernels share: a float tensor in either
// dtype, reading one from stdin and printing one, and a launcher that runs every thread of a
// grid one after another (for kernels without barriers or shared memory). Include after
// kernels.inc (it uses the kernels' dtype codes, bf16, ldf and stf).
#include <cstdio>
#include <vector>

// tensor holds a float tensor in dtype dt.
struct tensor {
    int dt;
    std::vector<float> f;
    std::vector<bf16> h;
    tensor(int dt, size_t n) : dt(dt), f(dt == DT_F32 ? n : 0), h(dt == DT_BF16 ? n : 0) {}
    void* ptr() { return dt == DT_F32 ? (void*)f.data() : (void*)h.data(); }
    float* fp() { return f.data(); }
    void set(size_t i, float v) { stf(ptr(), dt, (long long)i, v); }
    float get(size_t i) { return ldf(ptr(), dt, (long long)i); }
    size_t size() { return dt == DT_F32 ? f.size() : h.size(); }
};

// read fills t from stdin; false when the input ends first.
static bool read(tensor& t) {
    for (size_t i = 0; i < t.size(); i++) {
        float v;
        if (scanf("%f", &v) != 1) return false;
        t.set(i, v);
    }
    return true;
}

// print writes name and t's values (as fp32, %.9g) on one line.
static void print(const char* name, tensor& t) {
    printf("%s", name);
    for (size_t i = 0; i < t.size(); i++) printf(" %.9g", t.get(i));
    printf("\n");
}

// emu_grid runs body for every thread of a gx x gy grid of blocks of threads threads, one
// after another.
template <class F>
static void emu_grid(unsigned gx, unsigned gy, unsigned threads, F body) {
    gridDim = {gx, gy, 1};
    blockDim = {threads, 1, 1};
    for (unsigned y = 0; y < gy; y++)
        for (unsigned x = 0; x < gx; x++)
            for (unsigned t = 0; t < threads; t++) {
                blockIdx = {x, y, 0};
                threadIdx = {t, 0, 0};
                body();
            }
}
