package backend

import "fmt"

// Dropout, Optional.Dropout: inverted dropout with its keep mask drawn on the device from a
// counter-based stream, so that a LoRA adapter's input dropout needs no mask made on the host
// and uploaded (an [M, I] fp32 mask per adapted layer and pass, 42 MB at 4096 tokens of a
// 2560-wide model, against a kernel that reads x and writes out once).
//
// For element e of X (flattened row-major), with threshold = DropoutThreshold(P) and
// scale = DropoutScale(P):
//
//	keep(e) = DropoutBits(Seed, Key, e) >> 8 >= threshold
//	Out[e]  = X[e] * (keep(e) ? scale : 0)        (fp32 product, rounded once to Out's dtype; =)
//
// so a dropped element is X[e] * 0 (a signed zero, NaN for NaN), exactly what multiplying by a
// 0-or-scale mask gives. Out may be X itself. The same (Seed, Key) draws the same mask for the
// same element count, whatever the dtype or backend: a recomputed forward and the backward
// apply the forward's mask by calling it again.
//
// Fallback: the mask from DropoutMask on the host, uploaded as F32 and applied with ScaleRows
// over X viewed as [numel, 1] (the same bits).

// DropoutArgs are the operands of Optional.Dropout.
type DropoutArgs struct {
	Out, X T       // float, the same element count; Out =
	P      float32 // drop probability, in [0, 1)
	Seed   uint64
	Key    uint64
}

// Validate checks the operands and returns the element count.
func (a DropoutArgs) Validate() (int, error) {
	if a.X.IsNil() || a.Out.IsNil() {
		return 0, fmt.Errorf("Dropout: X and Out are required")
	}
	if !a.X.DType().IsFloat() || !a.Out.DType().IsFloat() {
		return 0, fmt.Errorf("Dropout: X %v and Out %v must be float tensors", a.X, a.Out)
	}
	if a.X.Numel() != a.Out.Numel() {
		return 0, fmt.Errorf("Dropout: X %v and Out %v must have the same element count", a.X, a.Out)
	}
	if !(a.P >= 0 && a.P < 1) {
		return 0, fmt.Errorf("Dropout: P = %v must be in [0, 1)", a.P)
	}
	return a.X.Numel(), nil
}

// DropoutBits is the dropout stream: 32 bits that depend only on (seed, key, elem),
//
//	h = mix64(seed); h = mix64(h ^ key); h = mix64(h ^ elem); return uint32(h >> 32)
//
// with mix64 the splitmix64 finaliser of SRBits.
func DropoutBits(seed, key, elem uint64) uint32 {
	h := mix64(seed)
	h = mix64(h ^ key)
	h = mix64(h ^ elem)
	return uint32(h >> 32)
}

// DropoutThreshold is the 24-bit threshold of drop probability p: floor(p * 2^24), so that an
// element is dropped with probability threshold / 2^24.
func DropoutThreshold(p float32) uint32 { return uint32(float64(p) * (1 << 24)) }

// DropoutScale is the factor kept elements are multiplied by, 1/(1-p) in fp32 (as
// torch.nn.Dropout's inverted dropout).
func DropoutScale(p float32) float32 { return 1 / (1 - p) }

// DropoutMask returns the n mask values of (seed, key, p): DropoutScale(p) where kept, else 0.
func DropoutMask(seed, key uint64, n int, p float32) []float32 {
	thr, scale := DropoutThreshold(p), DropoutScale(p)
	m := make([]float32, n)
	for e := range m {
		if DropoutBits(seed, key, uint64(e))>>8 >= thr {
			m[e] = scale
		}
	}
	return m
}
