package cuda

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// Host launcher of kernels/nf4.cu: NF4 dequantisation.

const nf4File = "nf4.cu"

// DequantNF4 implements backend.Optional.DequantNF4.
func (b *Backend) DequantNF4(a backend.DequantNF4Args) error {
	const op = "DequantNF4"
	n, _, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	arg := b.args(op)
	po := arg.ptr("out", a.Out)
	pp := arg.ptr("packed", a.Packed)
	var pa, pq, pa2, pm uintptr
	if a.Nested() {
		pq = arg.ptr("absmax", a.Absmax)
		pa2 = arg.ptr("nestedAbsmax", a.NestedAbsmax)
		pm = arg.ptr("nestedMap", a.NestedMap)
	} else {
		pa = arg.ptr("absmax", a.Absmax)
	}
	if err := arg.err(); err != nil {
		return err
	}
	return b.launch1D(nf4File, "nf4_dequant", int64(n+1)/2, po, pp, pa, pq, pa2, pm, a.Offset, int64(n))
}
