package cuda

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Host launchers of kernels/dsv4_softmax.cu: DeepSeek-V4's sink softmax, sink attention's
// softmax over scores computed by matrix products, forward and backward.

const sinkSoftmaxFile = "dsv4_softmax.cu"

// sinkSoftmaxThreads is the most threads of one row's block.
const sinkSoftmaxThreads = 256

func init() {
	dsv4Fills = append(dsv4Fills, func(b *Backend, o *backend.DSV4Ops) {
		o.SinkSoftmax = b.SinkSoftmax
		o.SinkSoftmaxBackward = b.SinkSoftmaxBackward
	})
}

// sinkSoftmaxLaunch is the grid and block of R rows of S columns, and whether the kernels'
// 4-column variants take them: S a multiple of 4 and every row tensor's address aligned to
// 4 of its elements (ptrs and their element sizes).
func sinkSoftmaxLaunch(R, S int, ptrs []uintptr, sizes []int) (grid, block [3]uint32, vec bool) {
	vec = S%4 == 0
	for i, p := range ptrs {
		if p%uintptr(4*sizes[i]) != 0 {
			vec = false
		}
	}
	groups := S
	if vec {
		groups = S / 4
	}
	threads := min(sinkSoftmaxThreads, max(32, (groups+31)/32*32))
	return [3]uint32{uint32(R), 1, 1}, [3]uint32{uint32(threads), 1, 1}, vec
}

// sinkSoftmaxShape checks what the kernels take beyond the contract.
func sinkSoftmaxShape(op string, d backend.SinkSoftmaxDims) error {
	if int64(d.N)*int64(d.H) > 1<<31-1 || d.S > 1<<30 {
		return fmt.Errorf("cuda: %s: %d rows of %d columns; the kernels take at most 2^31-1 rows of 2^30", op,
			d.N*d.H, d.S)
	}
	return nil
}

func elemSize(t T) int {
	if t.DType() == tensor.BF16 {
		return 2
	}
	return 4
}

// SinkSoftmax implements backend.DSV4Ops.SinkSoftmax: one block per row.
func (b *Backend) SinkSoftmax(a backend.SinkSoftmaxArgs) error {
	const op = "SinkSoftmax"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if err := sinkSoftmaxShape(op, d); err != nil {
		return err
	}
	arg := b.args(op)
	pp, cp := arg.float("P", a.P)
	pl := arg.ptr("LSE", a.LSE)
	px := arg.ptr("X", a.X)
	ps, cs := arg.float("Sinks", a.Sinks)
	var pm uintptr
	if !a.Mask.IsNil() && d.S > d.N {
		pm = arg.i32("Mask", a.Mask)
	}
	if err := arg.err(); err != nil {
		return err
	}
	R := d.N * d.H
	if R == 0 {
		return nil
	}
	use := int32(0)
	if a.UseLSE {
		use = 1
	}
	grid, block, vec := sinkSoftmaxLaunch(R, d.S, []uintptr{pp, px}, []int{elemSize(a.P), 4})
	name := "dsv4_sink_softmax_fwd"
	if vec {
		name += "4"
	}
	p := packArgs(pp, cp, pl, px, ps, cs, pm, int32(d.N), int32(d.S-d.N), int32(d.H), int32(d.S),
		int32(a.Window), int32(a.Rate), use)
	return b.d.Post(func() error {
		return b.d.launchOnThread(sinkSoftmaxFile, name, grid, block, 0, p...)
	})
}

// SinkSoftmaxBackward implements backend.DSV4Ops.SinkSoftmaxBackward: delta and DS per row
// (one block each), then GSinks per head from delta (dsv4_attention.cu's sinks kernel, the
// same sum), skipped without it.
func (b *Backend) SinkSoftmaxBackward(a backend.SinkSoftmaxBackwardArgs) error {
	const op = "SinkSoftmaxBackward"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if err := sinkSoftmaxShape(op, d); err != nil {
		return err
	}
	R := d.N * d.H
	if R == 0 {
		return nil // no row: GSinks adds 0
	}
	var delta T
	if !a.GSinks.IsNil() {
		if delta, err = b.allocScratch(tensor.F32, R); err != nil { // the row kernel writes every element
			return err
		}
		defer b.Free(delta)
	}
	arg := b.args(op)
	pds, cds := arg.float("DS", a.DS)
	pgs, cgs := arg.optFloat("GSinks", a.GSinks)
	pdelta := arg.opt("scratch", delta)
	pp, cp := arg.float("P", a.P)
	pdp := arg.ptr("DP", a.DP)
	pl := arg.ptr("LSE", a.LSE)
	ps, cs := arg.float("Sinks", a.Sinks)
	if err := arg.err(); err != nil {
		return err
	}
	grid, block, vec := sinkSoftmaxLaunch(R, d.S, []uintptr{pds, pp, pdp}, []int{elemSize(a.DS), elemSize(a.P), 4})
	name := "dsv4_sink_softmax_bwd"
	if vec {
		name += "4"
	}
	rowArgs := packArgs(pds, cds, pdelta, pp, cp, pdp, int32(d.S))
	return b.d.Post(func() error {
		if err := b.d.launchOnThread(sinkSoftmaxFile, name, grid, block, 0, rowArgs...); err != nil {
			return err
		}
		if a.GSinks.IsNil() {
			return nil
		}
		return b.d.launchOnThread(sinkAttnFile, "dsv4_sink_attn_bwd_sinks", [3]uint32{uint32(d.H), 1, 1},
			[3]uint32{256, 1, 1}, 0, packArgs(pgs, cgs, ps, cs, pdelta, pl, int32(d.N), int32(d.H))...)
	})
}
