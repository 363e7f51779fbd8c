//go:build amd64

package cpu

import "math"

// cpuid executes the CPUID instruction for leaf eaxArg, subleaf ecxArg.
func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)

// xgetbv reads extended control register 0 (which register states the OS saves).
func xgetbv() (eax, edx uint32)

// kernel6x16AVX2 computes the 6x16 tile acc[r*16+j] = sum_p a[p*6+r] * b[p*16+j] for p < k with
// AVX2 FMA instructions. a points at 6*k packed floats, b at 16*k, acc at 96.
//
//go:noescape
func kernel6x16AVX2(k int, a, b, acc *float32)

// hasAVX2FMA reports whether the CPU and OS support AVX2 and FMA3.
func hasAVX2FMA() bool {
	maxLeaf, _, _, _ := cpuid(0, 0)
	if maxLeaf < 7 {
		return false
	}
	_, _, ecx1, _ := cpuid(1, 0)
	const fma, osxsave, avx = 1 << 12, 1 << 27, 1 << 28
	if ecx1&fma == 0 || ecx1&osxsave == 0 || ecx1&avx == 0 {
		return false
	}
	if xcr0, _ := xgetbv(); xcr0&6 != 6 { // XMM and YMM state enabled by the OS
		return false
	}
	_, ebx7, _, _ := cpuid(7, 0)
	return ebx7&(1<<5) != 0
}

var useAVX2 = hasAVX2FMA()

func kernel6x16(k int, a, b, acc []float32) {
	if k <= 0 {
		clear(acc[:96])
		return
	}
	if useAVX2 {
		_ = a[6*k-1]
		_ = b[16*k-1]
		_ = acc[95]
		kernel6x16AVX2(k, &a[0], &b[0], &acc[0])
		return
	}
	kernel6x16Go(k, a, b, acc)
}

// expAVX2 writes exp of n/8*8 clamped inputs (see expVec); c is &expConsts[0].
//
//go:noescape
func expAVX2(dst, src *float32, n int, c *float32)

// expConsts holds the constants of expAVX2, each repeated 8 times (one YMM register).
var expConsts = func() (t [14 * 8]float32) {
	vals := [14]float32{
		expHi, expLo, 1.44269504088896341, 0.5, 0.693359375, -2.12194440e-4,
		1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1,
		1, math.Float32frombits(127),
	}
	for i, v := range vals {
		for j := 0; j < 8; j++ {
			t[i*8+j] = v
		}
	}
	return t
}()

// expVec sets dst[i] = exp(clamp(src[i], expLo, expHi)), relative error below 3e-7 in the
// normal range. dst may alias src.
func expVec(dst, src []float32) {
	n := len(src)
	dst = dst[:n]
	v := 0
	if useAVX2 && n >= 8 {
		v = n &^ 7
		expAVX2(&dst[0], &src[0], v, &expConsts[0])
	}
	for i := v; i < n; i++ {
		dst[i] = expScalar(src[i])
	}
}

// kernel6x16StridedAVX2 is kernel6x16AVX2 reading the 6 rows of A in place (row r at a+r*lda).
//
//go:noescape
func kernel6x16StridedAVX2(k int, a *float32, lda int, b, acc *float32)

// kernel6x16Strided computes the 6x16 tile with A unpacked: acc[r*16+j] = sum_p
// a[r*lda+p]*b[p*16+j].
func kernel6x16Strided(k int, a []float32, lda int, b, acc []float32) {
	if k <= 0 {
		clear(acc[:96])
		return
	}
	_ = a[5*lda+k-1]
	_ = b[16*k-1]
	_ = acc[95]
	kernel6x16StridedAVX2(k, &a[0], lda, &b[0], &acc[0])
}

// kernel6x16CAVX2 and kernel6x16StridedCAVX2 are the packed and strided kernels with the
// epilogue C = alpha*acc + beta*C done in registers, for full tiles.
//
//go:noescape
func kernel6x16CAVX2(k int, a, b, c *float32, ldc int, alpha, beta float32)

//go:noescape
func kernel6x16StridedCAVX2(k int, a *float32, lda int, b, c *float32, ldc int, alpha, beta float32)

// kernel6x16C computes a full 6x16 tile of C = alpha*op(A)op(B) + beta*C from packed panels.
func kernel6x16C(k int, a, b, c []float32, ldc int, alpha, beta float32) {
	_ = c[5*ldc+15]
	if k <= 0 {
		epilogueGo(make([]float32, 96), c, ldc, alpha, beta)
		return
	}
	_ = a[6*k-1]
	_ = b[16*k-1]
	kernel6x16CAVX2(k, &a[0], &b[0], &c[0], ldc, alpha, beta)
}

// kernel6x16StridedC is kernel6x16C with A read in place (row r at a[r*lda:]).
func kernel6x16StridedC(k int, a []float32, lda int, b, c []float32, ldc int, alpha, beta float32) {
	_ = c[5*ldc+15]
	if k <= 0 {
		epilogueGo(make([]float32, 96), c, ldc, alpha, beta)
		return
	}
	_ = a[5*lda+k-1]
	_ = b[16*k-1]
	kernel6x16StridedCAVX2(k, &a[0], lda, &b[0], &c[0], ldc, alpha, beta)
}
