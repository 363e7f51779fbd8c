package cuda

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// Host launcher of kernels/dropout.cu: dropout with its mask drawn in the kernel.

const dropoutFile = "dropout.cu"

// Dropout implements backend.Optional.Dropout.
func (b *Backend) Dropout(a backend.DropoutArgs) error {
	const op = "Dropout"
	n, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	arg := b.args(op)
	po, co := arg.float("Out", a.Out)
	px, cx := arg.float("X", a.X)
	if err := arg.err(); err != nil {
		return err
	}
	return b.launch1D(dropoutFile, "dropout_fwd", int64(n), po, co, px, cx, a.Seed, a.Key,
		backend.DropoutThreshold(a.P), backend.DropoutScale(a.P), int64(n))
}
