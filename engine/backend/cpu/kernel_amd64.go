//go:build amd64

package cpu

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
