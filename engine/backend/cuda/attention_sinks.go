package cuda

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Host launchers of kernels/attention_sinks.cu: gpt-oss's per-head attention sinks, folded
// into a finished attention (forward) and differentiated (backward).

// sinkShape checks the operands and returns N, NH and HD.
func sinkShape(op string, out, lse, sinks T) (n, nh, hd int, err error) {
	nh = sinks.Numel()
	if nh <= 0 || lse.DType() != tensor.F32 || lse.Numel()%nh != 0 {
		return 0, 0, 0, fmt.Errorf("cuda: %s: LSE %v must be f32 [N, NH] for %d sinks", op, lse, nh)
	}
	n = lse.Numel() / nh
	if n > 0 && out.Numel()%(n*nh) != 0 {
		return 0, 0, 0, fmt.Errorf("cuda: %s: Out %v is not [N, NH*HD] for N=%d, NH=%d", op, out, n, nh)
	}
	if n > 0 {
		hd = out.Numel() / (n * nh)
	}
	return n, nh, hd, nil
}

// AttentionSinks implements backend.Ops.AttentionSinks.
func (b *Backend) AttentionSinks(out, lse, sinks T) error {
	const op = "AttentionSinks"
	n, nh, hd, err := sinkShape(op, out, lse, sinks)
	if err != nil || n == 0 {
		return err
	}
	arg := b.args(op)
	po, co := arg.float("Out", out)
	pl := arg.ptr("LSE", lse)
	ps, cs := arg.float("sinks", sinks)
	if err := arg.err(); err != nil {
		return err
	}
	return b.launch1D("attention_sinks.cu", "attn_sinks_fwd", int64(n)*int64(nh), po, co, pl, ps, cs, int64(n), int32(nh), int32(hd))
}

// AttentionSinksBackward implements backend.Ops.AttentionSinksBackward.
func (b *Backend) AttentionSinksBackward(dSinks, dOut, out, lse, sinks T) error {
	const op = "AttentionSinksBackward"
	n, nh, hd, err := sinkShape(op, out, lse, sinks)
	if err != nil || n == 0 {
		return err
	}
	if dOut.Numel() != out.Numel() || dSinks.Numel() != nh {
		return fmt.Errorf("cuda: %s: dOut %v must match Out %v and dSinks %v have NH=%d entries", op, dOut, out, dSinks, nh)
	}
	arg := b.args(op)
	pg, cg := arg.float("dSinks", dSinks)
	pd, cd := arg.float("dOut", dOut)
	po, co := arg.float("Out", out)
	pl := arg.ptr("LSE", lse)
	ps, cs := arg.float("sinks", sinks)
	if err := arg.err(); err != nil {
		return err
	}
	args := packArgs(pg, cg, pd, cd, po, co, pl, ps, cs, int64(n), int32(nh), int32(hd))
	return b.d.Post(func() error {
		return b.d.launchOnThread("attention_sinks.cu", "attn_sinks_bwd", [3]uint32{uint32(nh), 1, 1}, [3]uint32{256, 1, 1}, 0, args...)
	})
}
