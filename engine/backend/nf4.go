package backend

// NF4 dequantisation, Optional.DequantNF4: a QLoRA base weight is kept on the device as 4-bit
// NormalFloat codes with per-block scales (engine/quant describes the format, bitsandbytes'
// own) and turned into a bf16 weight in a scratch tensor right before the product that reads
// it, so that only one layer's bf16 weight exists at a time.
//
// For a weight of N elements (any shape, row-major), and B = ceil(N/64) blocks:
//
//	Packed       [ceil(N/2)] U8   two codes per byte, element 2i in the high nibble
//	Absmax       [B] F32          the block scales, or
//	Absmax       [B] U8           8-bit codes of the block scales (double quantisation), with
//	NestedAbsmax [ceil(B/256)] F32 and NestedMap [256] F32:
//	             scale[b] = NestedMap[Absmax[b]] * NestedAbsmax[b/256] + Offset
//	Out          [N] BF16 (=)     NF4Code[code] * scale, in fp32, rounded to nearest even
//
// with NF4Code = quant.NF4Code, blocks of quant.Blocksize (64) and nested blocks of
// quant.NestedBlocksize (256). The fp32 products and the sum are rounded separately (no fused
// multiply-add), as bitsandbytes' kernels compute them, so every backend writes the same bits
// as quant.Weight.DequantizeBF16.
//
// Fallback: none at the Ops level; without the member the weight is dequantised on the host
// (quant.Weight.DequantizeBF16) and uploaded, one transfer per use.

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/quant"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// NF4Blocksize and NF4NestedBlocksize are the block sizes of the format.
const (
	NF4Blocksize       = quant.Blocksize
	NF4NestedBlocksize = quant.NestedBlocksize
)

// NF4Code is the NF4 code book, quant.NF4Code.
var NF4Code = quant.NF4Code

// DequantNF4Args are the operands of Optional.DequantNF4 (shapes above).
type DequantNF4Args struct {
	Out          T // [N] BF16 (=)
	Packed       T // [ceil(N/2)] U8
	Absmax       T // [B] F32, or U8 under double quantisation
	NestedAbsmax T // [ceil(B/256)] F32, double quantisation only
	NestedMap    T // [256] F32, double quantisation only
	Offset       float32
}

// Nested reports whether the block scales are double-quantised (Absmax holds U8 codes).
func (a DequantNF4Args) Nested() bool { return !a.Absmax.IsNil() && a.Absmax.DType() == tensor.U8 }

// Validate checks the operands' dtypes and sizes against each other and returns N and B.
func (a DequantNF4Args) Validate() (n, blocks int, err error) {
	if a.Out.IsNil() || a.Packed.IsNil() || a.Absmax.IsNil() {
		return 0, 0, fmt.Errorf("DequantNF4: Out, Packed and Absmax are required")
	}
	if a.Out.DType() != tensor.BF16 {
		return 0, 0, fmt.Errorf("DequantNF4: Out %v must be bf16", a.Out)
	}
	if a.Packed.DType() != tensor.U8 {
		return 0, 0, fmt.Errorf("DequantNF4: Packed %v must be u8", a.Packed)
	}
	n = a.Out.Numel()
	blocks = (n + NF4Blocksize - 1) / NF4Blocksize
	if want := (n + 1) / 2; a.Packed.Numel() != want {
		return 0, 0, fmt.Errorf("DequantNF4: Packed %v has %d bytes; Out's %d elements need %d", a.Packed, a.Packed.Numel(), n, want)
	}
	if a.Absmax.Numel() != blocks {
		return 0, 0, fmt.Errorf("DequantNF4: Absmax %v has %d elements; Out's %d elements make %d blocks of %d", a.Absmax, a.Absmax.Numel(), n, blocks, NF4Blocksize)
	}
	switch a.Absmax.DType() {
	case tensor.F32:
		if !a.NestedAbsmax.IsNil() || !a.NestedMap.IsNil() {
			return 0, 0, fmt.Errorf("DequantNF4: NestedAbsmax and NestedMap are for u8 (double-quantised) Absmax; Absmax %v is f32", a.Absmax)
		}
	case tensor.U8:
		nb := (blocks + NF4NestedBlocksize - 1) / NF4NestedBlocksize
		if a.NestedAbsmax.IsNil() || a.NestedAbsmax.DType() != tensor.F32 || a.NestedAbsmax.Numel() != nb {
			return 0, 0, fmt.Errorf("DequantNF4: double-quantised Absmax needs NestedAbsmax [%d] f32, got %v", nb, a.NestedAbsmax)
		}
		if a.NestedMap.IsNil() || a.NestedMap.DType() != tensor.F32 || a.NestedMap.Numel() != 256 {
			return 0, 0, fmt.Errorf("DequantNF4: double-quantised Absmax needs NestedMap [256] f32, got %v", a.NestedMap)
		}
	default:
		return 0, 0, fmt.Errorf("DequantNF4: Absmax %v must be f32 (plain) or u8 (double-quantised)", a.Absmax)
	}
	return n, blocks, nil
}

// UploadNF4 allocates the state of an NF4 weight on b and uploads it: the operands of
// DequantNF4 without Out. FreeNF4 releases them.
func UploadNF4(b Backend, w *quant.Weight) (DequantNF4Args, error) {
	if err := w.Validate(); err != nil {
		return DequantNF4Args{}, err
	}
	var a DequantNF4Args
	fail := func(err error) (DequantNF4Args, error) {
		FreeNF4(b, a)
		return DequantNF4Args{}, fmt.Errorf("backend: uploading an NF4 weight of shape %v: %w", w.Shape, err)
	}
	var err error
	if a.Packed, err = fromBytes(b, tensor.U8, w.Packed, len(w.Packed)); err != nil {
		return fail(err)
	}
	if w.Nested == nil {
		if a.Absmax, err = FromFloat32(b, w.Absmax, tensor.F32, len(w.Absmax)); err != nil {
			return fail(err)
		}
		return a, nil
	}
	nd := w.Nested
	if a.Absmax, err = fromBytes(b, tensor.U8, nd.Codes, len(nd.Codes)); err != nil {
		return fail(err)
	}
	if a.NestedAbsmax, err = FromFloat32(b, nd.Absmax, tensor.F32, len(nd.Absmax)); err != nil {
		return fail(err)
	}
	if a.NestedMap, err = FromFloat32(b, nd.Map[:], tensor.F32, len(nd.Map)); err != nil {
		return fail(err)
	}
	a.Offset = nd.Offset
	return a, nil
}

// FreeNF4 frees the tensors UploadNF4 allocated (not Out).
func FreeNF4(b Backend, a DequantNF4Args) {
	for _, t := range []T{a.Packed, a.Absmax, a.NestedAbsmax, a.NestedMap} {
		if !t.IsNil() {
			_ = b.Free(t)
		}
	}
}

func fromBytes(b Backend, dt tensor.DType, raw []byte, shape ...int) (T, error) {
	t, err := b.Alloc(dt, shape...)
	if err != nil {
		return T{}, err
	}
	if err := b.Upload(t, raw); err != nil {
		_ = b.Free(t)
		return T{}, err
	}
	return t, nil
}
