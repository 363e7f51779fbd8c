//go:build !amd64

package cpu

var useAVX2 = false

func kernel6x16(k int, a, b, acc []float32) { kernel6x16Go(k, a, b, acc) }

// expVec sets dst[i] = exp(clamp(src[i], expLo, expHi)); see the amd64 version.
func expVec(dst, src []float32) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = expScalar(v)
	}
}

func kernel6x16Strided(k int, a []float32, lda int, b, acc []float32) {
	kernel6x16StridedGo(k, a, lda, b, acc)
}

func kernel6x16C(k int, a, b, c []float32, ldc int, alpha, beta float32) {
	var acc [96]float32
	kernel6x16Go(k, a, b, acc[:])
	epilogueGo(acc[:], c, ldc, alpha, beta)
}

func kernel6x16StridedC(k int, a []float32, lda int, b, c []float32, ldc int, alpha, beta float32) {
	var acc [96]float32
	kernel6x16StridedGo(k, a, lda, b, acc[:])
	epilogueGo(acc[:], c, ldc, alpha, beta)
}
