package cpu

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// Dropout implements backend.Optional.Dropout: the reference the device kernel is tested
// against. Runs of elements are shared out to the workers; each draws its keep bits from
// backend.DropoutBits.
func (b *Backend) Dropout(a backend.DropoutArgs) error {
	const op = "dropout"
	n, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	x, err := b.in(op, "X", a.X)
	if err != nil {
		return err
	}
	out, flush, err := b.out(op, "Out", a.Out, false)
	if err != nil {
		return err
	}
	thr, scale := backend.DropoutThreshold(a.P), backend.DropoutScale(a.P)
	b.pool.rows(n, convChunk, func(lo, hi int) {
		for e := lo; e < hi; e++ {
			k := float32(0)
			if backend.DropoutBits(a.Seed, a.Key, uint64(e))>>8 >= thr {
				k = scale
			}
			out[e] = x[e] * k
		}
	})
	flush()
	return nil
}
