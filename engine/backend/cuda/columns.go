package cuda

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Host launcher of kernels/columns.cu: CopyColumns, the column-block copies of multi-head
// latent attention.

// CopyColumns implements backend.Ops.CopyColumns.
func (b *Backend) CopyColumns(a backend.ColumnCopyArgs) error {
	const op = "CopyColumns"
	rows, dc, sc, err := a.Dims()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if rows == 0 {
		return nil
	}
	if tensor.SameBuffer(a.Dst, a.Src) {
		return fmt.Errorf("cuda: %s: Dst and Src overlap; use separate tensors", op)
	}
	arg := b.args(op)
	pd, cd := arg.float("Dst", a.Dst)
	ps, cs := arg.float("Src", a.Src)
	if err := arg.err(); err != nil {
		return err
	}
	var acc int32
	if a.Accumulate {
		acc = 1
	}
	return b.launch1D("columns.cu", "copy_columns", int64(rows)*int64(a.Width), pd, cd, ps, cs, int64(rows),
		int64(dc), int64(sc), int32(a.Groups), int32(a.Width), int64(a.DstOffset), int64(a.DstStride),
		int64(a.SrcOffset), int64(a.SrcStride), acc)
}
