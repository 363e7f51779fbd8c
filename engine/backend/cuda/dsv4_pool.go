package cuda

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// Host launchers of kernels/dsv4_pool.cu: DeepSeek-V4's window pooling (the compressors),
// forward and backward, and the lightning indexer's scores.

const dsv4PoolFile = "dsv4_pool.cu"

// wpChunk is WP_CHUNK of kernels/dsv4_pool.cu: the windows each partial sum of GAPE covers.
const wpChunk = 32

// isTile is IS_T of kernels/dsv4_pool.cu: the queries and keys of one index_scores block.
const isTile = 64

func init() {
	dsv4Fills = append(dsv4Fills, func(b *Backend, o *backend.DSV4Ops) {
		o.WindowPool = b.WindowPool
		o.WindowPoolBackward = b.WindowPoolBackward
		o.IndexScores = b.IndexScores
	})
}

func boolArg(v bool) int32 {
	if v {
		return 1
	}
	return 0
}

// WindowPool implements backend.DSV4Ops.WindowPool: one thread per (window, channel) cell.
func (b *Backend) WindowPool(a backend.WindowPoolArgs) error {
	const op = "WindowPool"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	arg := b.args(op)
	po, co := arg.float("Out", a.Out)
	pk, ck := arg.float("KV", a.KV)
	pg, cg := arg.float("Gate", a.Gate)
	pa, ca := arg.float("APE", a.APE)
	if err := arg.err(); err != nil {
		return err
	}
	return b.launch1D(dsv4PoolFile, "wp_fwd", int64(d.Windows)*int64(d.D), po, co, pk, ck, pg, cg, pa, ca,
		int64(d.Windows), int64(d.W), int64(d.D), int32(a.Rate), boolArg(a.Overlap))
}

// WindowPoolBackward implements backend.DSV4Ops.WindowPoolBackward: the cells add their
// gradients to DKV and DGate and, when GAPE is wanted, leave their softmax statistics in a
// scratch buffer, from which GAPE is summed over chunks of windows and then over the chunks,
// in order. Out is not read: each cell's value is recomputed with its softmax.
func (b *Backend) WindowPoolBackward(a backend.WindowPoolBackwardArgs) error {
	const op = "WindowPoolBackward"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	arg := b.args(op)
	pd, cd := arg.float("DOut", a.DOut)
	pk, ck := arg.float("KV", a.KV)
	pg, cg := arg.float("Gate", a.Gate)
	pa, ca := arg.float("APE", a.APE)
	pdk, cdk := arg.optFloat("DKV", a.DKV)
	pdg, cdg := arg.optFloat("DGate", a.DGate)
	pga, cga := arg.optFloat("GAPE", a.GAPE)
	if err := arg.err(); err != nil {
		return err
	}
	cells := int64(d.Windows) * int64(d.D)
	if cells == 0 || (pdk == 0 && pdg == 0 && pga == 0) {
		return nil
	}
	windows, W, D, m, ov := int64(d.Windows), int64(d.W), int64(d.D), int32(a.Rate), boolArg(a.Overlap)
	sms := b.d.info.SMs
	return b.d.Post(func() error {
		var stats uintptr
		mw := int64(a.Rate) * W
		chunks := (windows + wpChunk - 1) / wpChunk
		if pga != 0 {
			buf, err := b.d.allocOnThread(uint64(4 * (3*cells + chunks*mw)))
			if err != nil {
				return err
			}
			defer b.d.alloc.Free(buf.ptr) // freed after the kernels: later work is on the same stream
			stats = buf.ptr
		}
		if err := b.d.launchOnThread(dsv4PoolFile, "wp_bwd_cells", grid1D(cells, sms), [3]uint32{256, 1, 1}, 0,
			packArgs(pdk, cdk, pdg, cdg, stats, pd, cd, pk, ck, pg, cg, pa, ca, windows, W, D, m, ov)...); err != nil {
			return err
		}
		if pga == 0 {
			return nil
		}
		part := stats + uintptr(4*3*cells)
		if err := b.d.launchOnThread(dsv4PoolFile, "wp_bwd_ape_part", grid1D(chunks*mw, sms), [3]uint32{256, 1, 1}, 0,
			packArgs(part, stats, pd, cd, pk, ck, pg, cg, pa, ca, windows, W, D, m, ov)...); err != nil {
			return err
		}
		return b.d.launchOnThread(dsv4PoolFile, "wp_bwd_ape_sum", grid1D(mw, sms), [3]uint32{256, 1, 1}, 0,
			packArgs(pga, cga, part, chunks, mw)...)
	})
}

// IndexScores implements backend.DSV4Ops.IndexScores: one block of 256 threads per tile of 64
// queries by 64 keys.
func (b *Backend) IndexScores(a backend.IndexScoresArgs) error {
	const op = "IndexScores"
	N, n, Hi, Di, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	arg := b.args(op)
	po := arg.ptr("Out", a.Out)
	pq, cq := arg.float("Q", a.Q)
	pk, ck := arg.float("Keys", a.Keys)
	pw, cw := arg.float("Weights", a.Weights)
	if err := arg.err(); err != nil {
		return err
	}
	if N == 0 || n == 0 {
		return nil
	}
	grid := [3]uint32{uint32((n + isTile - 1) / isTile), uint32((N + isTile - 1) / isTile), 1}
	if grid[1] > 65535 {
		return fmt.Errorf("cuda: %s: %d queries exceed the grid (at most %d)", op, N, 65535*isTile)
	}
	scale := float32(1 / math.Sqrt(float64(Di)*float64(Hi)))
	args := packArgs(po, pq, cq, pk, ck, pw, cw, int64(N), int64(n), int32(Hi), int32(Di), int32(a.Rate), scale)
	return b.d.Post(func() error {
		return b.d.launchOnThread(dsv4PoolFile, "index_scores", grid, [3]uint32{256, 1, 1}, 0, args...)
	})
}
