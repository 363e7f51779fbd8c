// columns.cu: block copies between the columns of two row-major matrices (CopyColumns), which
// move the heads of multi-head latent attention between the projections' layout and the
// attention's.
//
// Shapes: dst [N, Cd], src [N, Cs]. For every row n, group g < G and j < W:
//   dst[n, doff + g*dstride + j]  =  src[n, soff + g*sstride + j]          (= or += with acc)
// sstride 0 broadcasts one block to every group; dstride 0 (G > 1) sums the groups in
// increasing g in fp32, then adds dst when acc, and rounds once. One thread per (n, j): each
// destination element has one writer, so there are no atomics and the sums have a fixed order.
// Nothing is cached; the backward of a copy is the copy the other way (a broadcast's is a sum).

extern "C" __global__ void copy_columns(void* dst, int dtd, const void* src, int dts, long long rows,
                                        long long dcols, long long scols, int groups, int width,
                                        long long doff, long long dstride, long long soff,
                                        long long sstride, int acc) {
    long long total = rows * (long long)width;
    GRID_STRIDE(i, total) {
        long long n = i / width, j = i - n * width;
        long long sbase = n * scols + soff + j, dbase = n * dcols + doff + j;
        if (dstride == 0 && groups > 1) {
            float s = 0.f;
            for (int g = 0; g < groups; g++) s += ldf(src, dts, sbase + g * sstride);
            if (acc) s += ldf(dst, dtd, dbase);
            stf(dst, dtd, dbase, s);
            continue;
        }
        for (int g = 0; g < groups; g++) {
            long long di = dbase + g * dstride;
            float v = ldf(src, dts, sbase + g * sstride);
            if (acc) v += ldf(dst, dtd, di);
            stf(dst, dtd, di, v);
        }
    }
}
