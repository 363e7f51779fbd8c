package cpu

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// Blocking of the packed GEMM: tasks of tileM x tileN outputs, the reduction dimension in
// blocks of kc so a B micro-panel stays in L1 while the A tile sits in L2.
const (
	smallM = 4 // at most this many rows of A use the unpacked dot-product path (x @ w^T)
	tileM  = 96
	tileN  = 128
	kc     = 256
)

// microKernel computes an mr x nr tile acc[r*nr+j] = sum_p a[p*mr+r]*b[p*nr+j], p < k.
// direct, when set, computes the same tile from unpacked rows of A (row r at a[r*lda:]), so
// untransposed A needs no packing.
//
// runC and directC, when set, are the same kernels storing a full mr x nr tile straight into C
// (C = alpha*acc + beta*C) instead of through acc.
type microKernel struct {
	mr, nr  int
	run     func(k int, a, b, acc []float32)
	direct  func(k int, a []float32, lda int, b, acc []float32)
	runC    func(k int, a, b, c []float32, ldc int, alpha, beta float32)
	directC func(k int, a []float32, lda int, b, c []float32, ldc int, alpha, beta float32)
}

// pickKernel returns the AVX2/FMA 6x16 kernel where the CPU has it, else a portable 4x4 one.
func pickKernel() microKernel {
	if useAVX2 {
		return microKernel{6, 16, kernel6x16, kernel6x16Strided, kernel6x16C, kernel6x16StridedC}
	}
	return microKernel{mr: 4, nr: 4, run: kernel4x4}
}

var gemmKernel = pickKernel()

// sgemm computes C = alpha*op(A)@op(B) + beta*C on row-major float32 slices, op(A) [m,k],
// op(B) [k,n], C [m,n] with leading dimension ldc. A[i,p] is a[i*lda+p] (or a[p*lda+i] when
// transA); B[p,j] is b[p*ldb+j] (or b[j*ldb+p] when transB). beta == 0 overwrites C.
//
// Both operands are packed into zero-padded micro-panels (A: mr rows x k, B: k x nr columns) so
// the inner kernel streams contiguous memory; output tiles are spread over the worker pool. The
// order of additions for each output element is fixed by the shapes alone, so results do not
// depend on the number of workers.
func (be *Backend) sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int,
	b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	if k == 0 || alpha == 0 {
		be.pool.rows(m, 16, func(lo, hi int) { scaleRows(c, ldc, lo, hi, n, beta) })
		return
	}
	if !transA && transB && m <= smallM {
		// A few rows (decoding): dot products straight from the operands; packing would read
		// and write B once more than the product itself needs.
		be.pool.rows(n, 64, func(lo, hi int) {
			for j := lo; j < hi; j++ {
				wr := b[j*ldb : j*ldb+k]
				for i := 0; i < m; i++ {
					s := dot(a[i*lda:i*lda+k], wr)
					if idx := i*ldc + j; beta == 0 {
						c[idx] = alpha * s
					} else {
						c[idx] = alpha*s + beta*c[idx]
					}
				}
			}
		})
		return
	}
	kern := gemmKernel
	mr, nr := kern.mr, kern.nr
	mp := (m + mr - 1) / mr
	np := (n + nr - 1) / nr
	ad := aDirect(kern, transA, m, mr)
	paBuf, pbBuf := getScratch(mp*mr*k), getScratch(np*nr*k)
	defer putScratch(paBuf)
	defer putScratch(pbBuf)
	pa, pb := *paBuf, *pbBuf
	be.pool.rows(mp, 8, func(lo, hi int) {
		for q := max(lo, ad); q < hi; q++ {
			packA(pa[q*mr*k:(q+1)*mr*k], a, lda, transA, m, k, q*mr, mr)
		}
	})
	be.pool.rows(np, 8, func(lo, hi int) {
		for q := lo; q < hi; q++ {
			packB(pb[q*nr*k:(q+1)*nr*k], b, ldb, transB, n, k, q*nr, nr)
		}
	})
	// Tiles of tileM rows, made shorter (a multiple of mr) when that is needed to give every
	// worker at least two tasks.
	th := tileM
	tn := (n + tileN - 1) / tileN
	for th > mr && ((m+th-1)/th)*tn < 2*be.pool.n {
		th = max(mr, (th/2+mr-1)/mr*mr)
	}
	tm := (m + th - 1) / th
	be.pool.run(tm*tn, func(t int) {
		ti, tj := t/tn, t%tn
		i0, j0 := ti*th, tj*tileN
		var acc [96]float32
		gemmTile(kern, a, lda, ad, pa, pb, k, i0, min(i0+th, m), j0, min(j0+tileN, n), m, n, alpha, beta, c, ldc, acc[:mr*nr])
	})
}

// gemmScratch holds reusable packing buffers for gemmSerial; release returns them to the pool.
type gemmScratch struct {
	pa, pb *[]float32
	acc    [96]float32
}

func grow(p **[]float32, n int) []float32 {
	if *p != nil && cap(**p) >= n {
		**p = (**p)[:n]
		return **p
	}
	if *p != nil {
		putScratch(*p)
	}
	*p = getScratch(n)
	return **p
}

func (ws *gemmScratch) release() {
	for _, p := range []**[]float32{&ws.pa, &ws.pb} {
		if *p != nil {
			putScratch(*p)
			*p = nil
		}
	}
}

// gemmSerial is sgemm on the calling goroutine only, for use inside parallel tasks.
func gemmSerial(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int,
	b []float32, ldb int, beta float32, c []float32, ldc int, ws *gemmScratch) {
	if m == 0 || n == 0 {
		return
	}
	if k == 0 || alpha == 0 {
		scaleRows(c, ldc, 0, m, n, beta)
		return
	}
	kern := gemmKernel
	mr, nr := kern.mr, kern.nr
	mp := (m + mr - 1) / mr
	np := (n + nr - 1) / nr
	ad := aDirect(kern, transA, m, mr)
	pa := grow(&ws.pa, mp*mr*k)
	pb := grow(&ws.pb, np*nr*k)
	for q := ad; q < mp; q++ {
		packA(pa[q*mr*k:(q+1)*mr*k], a, lda, transA, m, k, q*mr, mr)
	}
	for q := 0; q < np; q++ {
		packB(pb[q*nr*k:(q+1)*nr*k], b, ldb, transB, n, k, q*nr, nr)
	}
	gemmTile(kern, a, lda, ad, pa, pb, k, 0, m, 0, n, m, n, alpha, beta, c, ldc, ws.acc[:mr*nr])
}

func scaleRows(c []float32, ldc, lo, hi, n int, beta float32) {
	for i := lo; i < hi; i++ {
		row := c[i*ldc : i*ldc+n]
		for j := range row {
			if beta == 0 {
				row[j] = 0
			} else {
				row[j] *= beta
			}
		}
	}
}

// packA writes rows i0..i0+mr of op(A) (zero beyond m) as dst[p*mr + r].
func packA(dst, a []float32, lda int, transA bool, m, k, i0, mr int) {
	rows := min(mr, m-i0)
	if transA {
		// op(A) rows are columns of a: read the mr adjacent elements of each row of a.
		for p := 0; p < k; p++ {
			d := dst[p*mr : (p+1)*mr]
			copy(d, a[p*lda+i0:p*lda+i0+rows])
			clear(d[rows:])
		}
		return
	}
	for r := 0; r < mr; r++ {
		if r >= rows {
			for p := 0; p < k; p++ {
				dst[p*mr+r] = 0
			}
			continue
		}
		i := i0 + r
		for p, v := range a[i*lda : i*lda+k] {
			dst[p*mr+r] = v
		}
	}
}

// packB writes columns j0..j0+nr of op(B) (zero beyond n) as dst[p*nr + j].
func packB(dst, b []float32, ldb int, transB bool, n, k, j0, nr int) {
	if !transB && j0+nr <= n {
		for p := 0; p < k; p++ {
			copy(dst[p*nr:(p+1)*nr], b[p*ldb+j0:p*ldb+j0+nr])
		}
		return
	}
	for jj := 0; jj < nr; jj++ {
		j := j0 + jj
		switch {
		case j >= n:
			for p := 0; p < k; p++ {
				dst[p*nr+jj] = 0
			}
		case transB:
			for p, v := range b[j*ldb : j*ldb+k] {
				dst[p*nr+jj] = v
			}
		default:
			for p := 0; p < k; p++ {
				dst[p*nr+jj] = b[p*ldb+j]
			}
		}
	}
}

// aDirect returns how many leading A panels the kernel reads in place (full panels of an
// untransposed A when the kernel can); only the panels from there on are packed.
func aDirect(kern microKernel, transA bool, m, mr int) int {
	if kern.direct == nil || transA {
		return 0
	}
	return m / mr
}

// gemmTile computes C[i0:i1, j0:j1] in reduction blocks of kc, from packed B panels and either
// unpacked A rows (panels below ad) or packed A panels.
func gemmTile(kern microKernel, a []float32, lda, ad int, pa, pb []float32, k, i0, i1, j0, j1, m, n int, alpha, beta float32, c []float32, ldc int, acc []float32) {
	mr, nr := kern.mr, kern.nr
	for p0 := 0; p0 < k; p0 += kc {
		kk := min(kc, k-p0)
		bt := beta
		if p0 > 0 {
			bt = 1
		}
		for j := j0; j < j1; j += nr {
			q := j / nr
			bp := pb[q*nr*k+p0*nr : q*nr*k+(p0+kk)*nr]
			cols := min(nr, n-j)
			for i := i0; i < i1; i += mr {
				qa := i / mr
				rows := min(mr, m-i)
				if rows == mr && cols == nr && kern.runC != nil {
					cc := c[i*ldc+j:]
					if qa < ad {
						kern.directC(kk, a[i*lda+p0:], lda, bp, cc, ldc, alpha, bt)
					} else {
						kern.runC(kk, pa[qa*mr*k+p0*mr:qa*mr*k+(p0+kk)*mr], bp, cc, ldc, alpha, bt)
					}
					continue
				}
				if qa < ad {
					kern.direct(kk, a[i*lda+p0:], lda, bp, acc)
				} else {
					kern.run(kk, pa[qa*mr*k+p0*mr:qa*mr*k+(p0+kk)*mr], bp, acc)
				}
				for r := 0; r < rows; r++ {
					row := c[(i+r)*ldc+j : (i+r)*ldc+j+cols]
					ar := acc[r*nr : r*nr+cols]
					if bt == 0 {
						for x := range row {
							row[x] = alpha * ar[x]
						}
					} else {
						for x := range row {
							row[x] = alpha*ar[x] + bt*row[x]
						}
					}
				}
			}
		}
	}
}

// kernel4x4 is the portable micro-kernel: a 4x4 tile with the accumulators in registers.
func kernel4x4(k int, ap, bp []float32, acc []float32) {
	var c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23, c30, c31, c32, c33 float32
	ap = ap[:4*k]
	bp = bp[:4*k]
	for p := 0; p < 4*k; p += 4 {
		a := ap[p : p+4 : p+4]
		bb := bp[p : p+4 : p+4]
		a0, a1, a2, a3 := a[0], a[1], a[2], a[3]
		b0, b1, b2, b3 := bb[0], bb[1], bb[2], bb[3]
		c00 += a0 * b0
		c01 += a0 * b1
		c02 += a0 * b2
		c03 += a0 * b3
		c10 += a1 * b0
		c11 += a1 * b1
		c12 += a1 * b2
		c13 += a1 * b3
		c20 += a2 * b0
		c21 += a2 * b1
		c22 += a2 * b2
		c23 += a2 * b3
		c30 += a3 * b0
		c31 += a3 * b1
		c32 += a3 * b2
		c33 += a3 * b3
	}
	acc = acc[:16]
	acc[0], acc[1], acc[2], acc[3] = c00, c01, c02, c03
	acc[4], acc[5], acc[6], acc[7] = c10, c11, c12, c13
	acc[8], acc[9], acc[10], acc[11] = c20, c21, c22, c23
	acc[12], acc[13], acc[14], acc[15] = c30, c31, c32, c33
}

// kernel6x16Go is the portable equivalent of the AVX2 6x16 kernel (used where AVX2 is missing
// and to check the assembly).
func kernel6x16Go(k int, a, b, acc []float32) {
	acc = acc[:96]
	clear(acc)
	for p := 0; p < k; p++ {
		br := b[p*16 : p*16+16]
		for r := 0; r < 6; r++ {
			av := a[p*6+r]
			row := acc[r*16 : r*16+16]
			for j, bv := range br {
				row[j] += av * bv
			}
		}
	}
}

// GEMM computes C = Alpha*op(A)@op(B) + Beta*C.
func (b *Backend) GEMM(g backend.GEMMArgs) error {
	const op = "gemm"
	for _, x := range []struct {
		n string
		t T
	}{{"A", g.A}, {"B", g.B}, {"C", g.C}} {
		if x.t.IsNil() || x.t.Rank() != 2 {
			return fmt.Errorf("cpu: gemm: %s %v must be a 2-D tensor", x.n, x.t)
		}
	}
	m, k := g.A.Dim(0), g.A.Dim(1)
	if g.TransA {
		m, k = k, m
	}
	kb, n := g.B.Dim(0), g.B.Dim(1)
	if g.TransB {
		kb, n = n, kb
	}
	if kb != k {
		return fmt.Errorf("cpu: gemm: inner dimensions differ: op(A) %v is [%d,%d], op(B) %v is [%d,%d]", g.A, m, k, g.B, kb, n)
	}
	if g.C.Dim(0) != m || g.C.Dim(1) != n {
		return fmt.Errorf("cpu: gemm: C %v, want [%d %d]", g.C, m, n)
	}
	if err := overlapErr(op, "C", g.C, "A", g.A); err != nil {
		return err
	}
	if err := overlapErr(op, "C", g.C, "B", g.B); err != nil {
		return err
	}
	as, err := b.in(op, "A", g.A)
	if err != nil {
		return err
	}
	bs, err := b.in(op, "B", g.B)
	if err != nil {
		return err
	}
	cs, flush, err := b.out(op, "C", g.C, g.Beta != 0)
	if err != nil {
		return err
	}
	b.sgemm(g.TransA, g.TransB, m, n, k, g.Alpha, as, g.A.Dim(1), bs, g.B.Dim(1), g.Beta, cs, n)
	flush()
	return nil
}

// Linear computes out = x @ w^T + bias.
func (b *Backend) Linear(out, x, w, bias T) error {
	const op = "linear"
	if w.IsNil() || w.Rank() != 2 {
		return fmt.Errorf("cpu: linear: weight %v must be 2-D [out, in]", w)
	}
	o, in := w.Dim(0), w.Dim(1)
	if x.IsNil() || x.Shape().Last() != in {
		return fmt.Errorf("cpu: linear: x %v: last dimension must be in_features = %d (weight %v)", x, in, w)
	}
	m := x.Shape().Rows()
	if err := numel(op, "out", out, m*o, fmt.Sprintf("rows(x)*out_features = %d*%d", m, o)); err != nil {
		return err
	}
	if err := overlapErr(op, "out", out, "x", x); err != nil {
		return err
	}
	xs, err := b.in(op, "x", x)
	if err != nil {
		return err
	}
	ws, err := b.in(op, "weight", w)
	if err != nil {
		return err
	}
	var bs []float32
	if !bias.IsNil() {
		if err := numel(op, "bias", bias, o, "out_features"); err != nil {
			return err
		}
		if bs, err = b.in(op, "bias", bias); err != nil {
			return err
		}
	}
	os, flush, err := b.out(op, "out", out, false)
	if err != nil {
		return err
	}
	b.sgemm(false, true, m, o, in, 1, xs, in, ws, in, 0, os, o)
	if bs != nil {
		b.pool.rows(m, 64, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				row := os[i*o : (i+1)*o]
				for j := range row {
					row[j] += bs[j]
				}
			}
		})
	}
	flush()
	return nil
}

// LinearBackward computes dX (= or +=), dW += and dB +=.
func (b *Backend) LinearBackward(a backend.LinearBackwardArgs) error {
	const op = "linear-backward"
	if a.W.IsNil() || a.W.Rank() != 2 {
		return fmt.Errorf("cpu: linear-backward: W %v must be 2-D [out, in]", a.W)
	}
	o, in := a.W.Dim(0), a.W.Dim(1)
	if a.DY.IsNil() || a.DY.Shape().Last() != o {
		return fmt.Errorf("cpu: linear-backward: dY %v: last dimension must be out_features = %d", a.DY, o)
	}
	m := a.DY.Shape().Rows()
	dys, err := b.in(op, "dY", a.DY)
	if err != nil {
		return err
	}
	if !a.DX.IsNil() {
		if err := numel(op, "dX", a.DX, m*in, "rows(dY)*in_features"); err != nil {
			return err
		}
		if err := overlapErr(op, "dX", a.DX, "dY", a.DY); err != nil {
			return err
		}
		ws, err := b.in(op, "W", a.W)
		if err != nil {
			return err
		}
		dxs, flush, err := b.out(op, "dX", a.DX, a.AccumulateDX)
		if err != nil {
			return err
		}
		beta := float32(0)
		if a.AccumulateDX {
			beta = 1
		}
		b.sgemm(false, false, m, in, o, 1, dys, o, ws, in, beta, dxs, in)
		flush()
	}
	if !a.DW.IsNil() {
		if err := numel(op, "dW", a.DW, o*in, "numel(W)"); err != nil {
			return err
		}
		if err := numel(op, "X", a.X, m*in, "rows(dY)*in_features"); err != nil {
			return err
		}
		xs, err := b.in(op, "X", a.X)
		if err != nil {
			return err
		}
		dws, flush, err := b.out(op, "dW", a.DW, true)
		if err != nil {
			return err
		}
		b.sgemm(true, false, o, in, m, 1, dys, o, xs, in, 1, dws, in)
		flush()
	}
	if !a.DB.IsNil() {
		if err := numel(op, "dB", a.DB, o, "out_features"); err != nil {
			return err
		}
		dbs, flush, err := b.out(op, "dB", a.DB, true)
		if err != nil {
			return err
		}
		b.pool.rows(o, 256, func(lo, hi int) {
			for i := 0; i < m; i++ {
				row := dys[i*o : (i+1)*o]
				for j := lo; j < hi; j++ {
					dbs[j] += row[j]
				}
			}
		})
		flush()
	}
	return nil
}

// kernel6x16StridedGo is the portable equivalent of the strided AVX2 kernel (A read in place).
func kernel6x16StridedGo(k int, a []float32, lda int, b, acc []float32) {
	acc = acc[:96]
	clear(acc)
	for p := 0; p < k; p++ {
		br := b[p*16 : p*16+16]
		for r := 0; r < 6; r++ {
			av := a[r*lda+p]
			row := acc[r*16 : r*16+16]
			for j, bv := range br {
				row[j] += av * bv
			}
		}
	}
}

// epilogueGo stores a full 6x16 accumulator tile: C = alpha*acc + beta*C (C not read when
// beta == 0).
func epilogueGo(acc, c []float32, ldc int, alpha, beta float32) {
	for r := 0; r < 6; r++ {
		row := c[r*ldc : r*ldc+16]
		ar := acc[r*16 : r*16+16]
		if beta == 0 {
			for x := range row {
				row[x] = alpha * ar[x]
			}
		} else {
			for x := range row {
				row[x] = alpha*ar[x] + beta*row[x]
			}
		}
	}
}
