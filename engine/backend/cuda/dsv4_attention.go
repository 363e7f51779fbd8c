package cuda

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Host launchers of kernels/dsv4_attention.cu: DeepSeek-V4's sink attention over a document's
// own keys and its compressed entries, forward and backward.

const sinkAttnFile = "dsv4_attention.cu"

func init() {
	dsv4Fills = append(dsv4Fills, func(b *Backend, o *backend.DSV4Ops) {
		o.SinkAttention = b.SinkAttention
		o.SinkAttentionBackward = b.SinkAttentionBackward
	})
}

const (
	// sinkAttnMaxD is 32·SA_DPL of dsv4_attention.cu: the head dims a warp's lanes hold.
	sinkAttnMaxD = 512
	// sinkAttnTile is SA_TK: the keys a block stages at a time.
	sinkAttnTile = 16
	// sinkAttnHeads is the most heads (warps) of one forward or dq block.
	sinkAttnHeads = 8
	// sinkAttnKeyWarps is the warps of one dkv block.
	sinkAttnKeyWarps = 16
)

// sinkAttnShape checks what the kernels take beyond the contract.
func sinkAttnShape(op string, d backend.SinkAttentionDims) error {
	if d.D > sinkAttnMaxD {
		return fmt.Errorf("cuda: %s: head dim %d: the kernels take at most %d", op, d.D, sinkAttnMaxD)
	}
	if d.H > 65535*sinkAttnHeads {
		return fmt.Errorf("cuda: %s: %d heads, at most %d", op, d.H, 65535*sinkAttnHeads)
	}
	return nil
}

// sinkAttnGrid is the grid and block of the per-query kernels and their shared bytes.
func sinkAttnGrid(d backend.SinkAttentionDims) (grid, block [3]uint32, shared uint32) {
	warps := min(d.H, sinkAttnHeads)
	grid = [3]uint32{uint32(d.N), uint32((d.H + warps - 1) / warps), 1}
	block = [3]uint32{uint32(32 * warps), 1, 1}
	return grid, block, uint32(4 * sinkAttnTile * (d.D + 1))
}

// SinkAttention implements backend.DSV4Ops.SinkAttention.
func (b *Backend) SinkAttention(a backend.SinkAttentionArgs) error {
	const op = "SinkAttention"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if err := sinkAttnShape(op, d); err != nil {
		return err
	}
	arg := b.args(op)
	po, co := arg.float("Out", a.Out)
	pl := arg.ptr("LSE", a.LSE)
	pq, cq := arg.float("Q", a.Q)
	pkv, ckv := arg.float("KV", a.KV)
	ps, cs := arg.float("Sinks", a.Sinks)
	pm := sinkAttnMask(&arg, a, d)
	if err := arg.err(); err != nil {
		return err
	}
	if d.N == 0 {
		return nil
	}
	grid, block, shared := sinkAttnGrid(d)
	p := packArgs(po, co, pl, pq, cq, pkv, ckv, ps, cs, pm, int32(d.N), int32(d.S-d.N), int32(d.H), int32(d.D),
		int32(a.Window), int32(a.Rate), a.Scale)
	return b.d.Post(func() error {
		return b.d.launchOnThread(sinkAttnFile, "dsv4_sink_attn_fwd", grid, block, shared, p...)
	})
}

// sinkAttnMask is the mask's address, 0 without one or without compressed entries.
func sinkAttnMask(arg *opArgs, a backend.SinkAttentionArgs, d backend.SinkAttentionDims) uintptr {
	if a.Mask.IsNil() || d.S == d.N {
		return 0
	}
	return arg.i32("Mask", a.Mask)
}

// SinkAttentionBackward implements backend.DSV4Ops.SinkAttentionBackward: delta and DQ per
// query row, DKV per key row, then GSinks per head (skipped without it).
func (b *Backend) SinkAttentionBackward(a backend.SinkAttentionBackwardArgs) error {
	const op = "SinkAttentionBackward"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if err := sinkAttnShape(op, d); err != nil {
		return err
	}
	if d.N == 0 {
		return nil // no query: every gradient adds 0
	}
	delta, err := b.allocScratch(tensor.F32, d.N, d.H) // the dq kernel writes every element
	if err != nil {
		return err
	}
	defer b.Free(delta)
	arg := b.args(op)
	pdq, cdq := arg.float("DQ", a.DQ)
	pdkv, cdkv := arg.float("DKV", a.DKV)
	pgs, cgs := arg.optFloat("GSinks", a.GSinks)
	pdelta := arg.ptr("scratch", delta)
	pdo, cdo := arg.float("DOut", a.DOut)
	po, co := arg.float("Out", a.Out)
	pl := arg.ptr("LSE", a.LSE)
	pq, cq := arg.float("Q", a.Q)
	pkv, ckv := arg.float("KV", a.KV)
	ps, cs := arg.float("Sinks", a.Sinks)
	pm := sinkAttnMask(&arg, a.SinkAttentionArgs, d)
	if err := arg.err(); err != nil {
		return err
	}
	n, c, h, hd := int32(d.N), int32(d.S-d.N), int32(d.H), int32(d.D)
	win, rate := int32(a.Window), int32(a.Rate)
	grid, block, shared := sinkAttnGrid(d)
	pdqArgs := packArgs(pdq, cdq, pdelta, pdo, cdo, po, co, pl, pq, cq, pkv, ckv, pm, n, c, h, hd, win, rate, a.Scale)
	pkvArgs := packArgs(pdkv, cdkv, pdo, cdo, pdelta, pl, pq, cq, pkv, ckv, pm, n, c, h, hd, win, rate, a.Scale)
	return b.d.Post(func() error {
		if err := b.d.launchOnThread(sinkAttnFile, "dsv4_sink_attn_bwd_dq", grid, block, shared, pdqArgs...); err != nil {
			return err
		}
		if err := b.d.launchOnThread(sinkAttnFile, "dsv4_sink_attn_bwd_dkv", [3]uint32{uint32(d.S), 1, 1},
			[3]uint32{32 * sinkAttnKeyWarps, 1, 1}, uint32(4*sinkAttnKeyWarps*d.D), pkvArgs...); err != nil {
			return err
		}
		if a.GSinks.IsNil() {
			return nil
		}
		return b.d.launchOnThread(sinkAttnFile, "dsv4_sink_attn_bwd_sinks", [3]uint32{uint32(d.H), 1, 1},
			[3]uint32{256, 1, 1}, 0, packArgs(pgs, cgs, ps, cs, pdelta, pl, n, h)...)
	})
}
