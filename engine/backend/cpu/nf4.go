package cpu

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// DequantNF4 implements backend.Optional.DequantNF4: the reference the device kernels are
// tested against. Blocks of 64 elements are shared out to the workers; each block's scale is
// dequantised first (double quantisation), then its codes.
func (b *Backend) DequantNF4(a backend.DequantNF4Args) error {
	const op = "dequant-nf4"
	n, blocks, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	out, err := hostBytes(op, "out", a.Out)
	if err != nil {
		return err
	}
	packed, err := hostBytes(op, "packed", a.Packed)
	if err != nil {
		return err
	}
	rawAbsmax, err := hostBytes(op, "absmax", a.Absmax)
	if err != nil {
		return err
	}
	var codes []byte
	var absmax, nested, nmap []float32
	if a.Nested() {
		codes = rawAbsmax
		if nested, err = f32only(op, "nestedAbsmax", a.NestedAbsmax); err != nil {
			return err
		}
		if nmap, err = f32only(op, "nestedMap", a.NestedMap); err != nil {
			return err
		}
	} else {
		absmax = f32alias(rawAbsmax)
	}
	dst := u16alias(out)
	b.pool.rows(blocks, max(1, convChunk/backend.NF4Blocksize), func(lo, hi int) {
		for blk := lo; blk < hi; blk++ {
			var scale float32
			if codes != nil {
				scale = float32(nmap[codes[blk]]*nested[blk/backend.NF4NestedBlocksize]) + a.Offset
			} else {
				scale = absmax[blk]
			}
			end := min((blk+1)*backend.NF4Blocksize, n)
			for i := blk * backend.NF4Blocksize; i < end; i++ {
				c := packed[i/2]
				if i%2 == 0 {
					c >>= 4
				} else {
					c &= 0xF
				}
				dst[i] = tensor.F32ToBF16(float32(backend.NF4Code[c] * scale))
			}
		}
	})
	return nil
}
