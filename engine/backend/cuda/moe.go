package cuda

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Host launchers of kernels/moe.cu: the mixture-of-experts router and its backward, the
// counting sort of the routed slots by expert with the row gather, the weighted combine, and
// SwiGLU and GeGLU over packed gate|up rows. No launcher reads anything back from the device.

const moeFile = "moe.cu"

// moeShape checks that t is [rows, cols] (any rank whose last dimension is cols and whose
// element count is rows*cols) and, when dt is valid, of dtype dt.
func moeShape(op, name string, t T, rows, cols int, dt tensor.DType) error {
	if t.IsNil() {
		return fmt.Errorf("cuda: %s: %s is required (want [%d,%d])", op, name, rows, cols)
	}
	if t.Numel() != rows*cols || (t.Rank() > 0 && cols > 0 && t.Dim(-1) != cols) {
		return fmt.Errorf("cuda: %s: %s %v must be [%d,%d]", op, name, t, rows, cols)
	}
	if dt != tensor.Invalid && t.DType() != dt {
		return fmt.Errorf("cuda: %s: %s %v must be %s", op, name, t, dt)
	}
	return nil
}

// moeOptShape is moeShape for an optional tensor.
func moeOptShape(op, name string, t T, rows, cols int, dt tensor.DType) error {
	if t.IsNil() {
		return nil
	}
	return moeShape(op, name, t, rows, cols, dt)
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// moeWarpsPerBlock is how many warps (one token each) a router block runs with perWarp bytes of
// shared memory each: 8, fewer when they would pass 48 KiB; 0 when one warp's does.
func moeWarpsPerBlock(perWarp int) int {
	return min(8, (48<<10)/perWarp)
}

func b2i(v bool) int32 {
	if v {
		return 1
	}
	return 0
}

// MoERoute implements backend.Optional.MoERoute.
func (b *Backend) MoERoute(a backend.MoERouteArgs) error {
	const op = "MoERoute"
	if a.Logits.IsNil() || a.Logits.Rank() != 2 {
		return fmt.Errorf("cuda: %s: logits %v must be [N,E]", op, a.Logits)
	}
	n, e := a.Logits.Dim(0), a.Logits.Dim(1)
	if err := a.Check(op, e); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	k := a.TopK
	if err := firstErr(
		moeShape(op, "probs", a.Probs, n, e, tensor.F32),
		moeShape(op, "sel", a.Sel, n, k, tensor.I32),
		moeShape(op, "weights", a.Weights, n, k, tensor.F32),
		moeOptShape(op, "bias", a.Bias, 1, e, tensor.F32),
		moeOptShape(op, "counts", a.Counts, 1, e, tensor.I32),
		moeOptShape(op, "probSum", a.ProbSum, 1, e, tensor.F32),
		moeOptShape(op, "expertScale", a.ExpertScale, 1, e, tensor.F32),
	); err != nil {
		return err
	}
	if n > math.MaxInt32/max(e, k) {
		return fmt.Errorf("cuda: %s: %d tokens of %d experts exceed the kernel's int32 indices", op, n, e)
	}
	ng := 0
	if a.Grouped() {
		ng = a.NGroup
	}
	perWarp := 4 * (2*e + ng)
	warps := moeWarpsPerBlock(perWarp)
	if warps == 0 {
		return fmt.Errorf("cuda: %s: %d experts need %d bytes of shared memory per token, over the kernel's 48 KiB", op, e, perWarp)
	}
	arg := b.args(op)
	pl, cl := arg.float("logits", a.Logits)
	pb := arg.opt("bias", a.Bias)
	pp := arg.ptr("probs", a.Probs)
	ps := arg.i32("sel", a.Sel)
	pw := arg.ptr("weights", a.Weights)
	pc := arg.opt("counts", a.Counts)
	pps := arg.opt("probSum", a.ProbSum)
	pes := arg.opt("expertScale", a.ExpertScale)
	if err := arg.err(); err != nil {
		return err
	}
	if n == 0 {
		if pps != 0 {
			return b.Fill(a.ProbSum, 0)
		}
		return nil
	}
	sigmoid := b2i(a.Score == backend.RouterSigmoid)
	args := packArgs(pl, cl, pb, pp, ps, pw, pc, pes, int32(n), int32(e), int32(k), sigmoid, b2i(a.NormTopK), a.Scaling(), int32(ng), int32(a.TopKGroup))
	blocks := min((n+warps-1)/warps, 32*max(b.d.info.SMs, 1))
	return b.d.Post(func() error {
		if err := b.d.launchOnThread(moeFile, "moe_route_fwd", [3]uint32{uint32(blocks), 1, 1}, [3]uint32{uint32(32 * warps), 1, 1}, uint32(warps*perWarp), args...); err != nil {
			return err
		}
		if pps == 0 {
			return nil
		}
		return b.columnSumOnThread(pp, pps, n, e)
	})
}

// columnSumOnThread queues sum[e] = sum over the n rows of m[n,e] (both F32 device pointers) in
// a fixed order: partial sums over R row chunks of at least 32 rows, at most 128, then the R
// partials in order. It runs on the device thread (inside Post).
func (b *Backend) columnSumOnThread(m, sum uintptr, n, e int) error {
	r := min(128, (n+31)/32)
	per := (n + r - 1) / r
	part, err := b.d.allocOnThread(uint64(4 * r * e))
	if err != nil {
		return err
	}
	defer b.d.alloc.Free(part.ptr) // freed after the kernels: later work is on the same stream
	if err := b.d.launchOnThread(moeFile, "moe_prob_sum_part", [3]uint32{uint32((e + 31) / 32), uint32(r), 1}, [3]uint32{32, 8, 1}, 0,
		packArgs(m, part.ptr, int32(n), int32(e), int32(per))...); err != nil {
		return err
	}
	return b.d.launchOnThread(moeFile, "moe_prob_sum", [3]uint32{uint32((e + 255) / 256), 1, 1}, [3]uint32{256, 1, 1}, 0,
		packArgs(part.ptr, sum, int32(r), int32(e))...)
}

// MoERouteBackward implements backend.Optional.MoERouteBackward.
func (b *Backend) MoERouteBackward(a backend.MoERouteBackwardArgs) error {
	const op = "MoERouteBackward"
	if a.Probs.IsNil() || a.Probs.Rank() != 2 {
		return fmt.Errorf("cuda: %s: probs %v must be [N,E]", op, a.Probs)
	}
	n, e := a.Probs.Dim(0), a.Probs.Dim(1)
	if err := a.Check(op, e); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	k := a.TopK
	if err := firstErr(
		moeShape(op, "probs", a.Probs, n, e, tensor.F32),
		moeShape(op, "sel", a.Sel, n, k, tensor.I32),
		moeShape(op, "weights", a.Weights, n, k, tensor.F32),
		moeShape(op, "dWeights", a.DWeights, n, k, tensor.F32),
		moeOptShape(op, "auxGrad", a.AuxGrad, 1, e, tensor.F32),
		moeShape(op, "dLogits", a.DLogits, n, e, tensor.Invalid),
		moeOptShape(op, "expertScale", a.ExpertScale, 1, e, tensor.F32),
		moeOptShape(op, "dExpertScale", a.DExpertScale, 1, e, tensor.F32),
	); err != nil {
		return err
	}
	if !a.DExpertScale.IsNil() && a.ExpertScale.IsNil() {
		return fmt.Errorf("cuda: %s: dExpertScale needs the forward's expertScale", op)
	}
	if n > math.MaxInt32/max(e, k) {
		return fmt.Errorf("cuda: %s: %d tokens of %d experts exceed the kernel's int32 indices", op, n, e)
	}
	warps := moeWarpsPerBlock(4 * e)
	if warps == 0 {
		return fmt.Errorf("cuda: %s: %d experts need more than the kernel's 48 KiB of shared memory per token", op, e)
	}
	arg := b.args(op)
	pp := arg.ptr("probs", a.Probs)
	ps := arg.i32("sel", a.Sel)
	pw := arg.ptr("weights", a.Weights)
	pdw := arg.ptr("dWeights", a.DWeights)
	pa := arg.opt("auxGrad", a.AuxGrad)
	pd, cd := arg.float("dLogits", a.DLogits)
	pes := arg.opt("expertScale", a.ExpertScale)
	pdes := arg.opt("dExpertScale", a.DExpertScale)
	if err := arg.err(); err != nil {
		return err
	}
	if n == 0 {
		if pdes != 0 {
			return b.Fill(a.DExpertScale, 0)
		}
		return nil
	}
	blocks := min((n+warps-1)/warps, 32*max(b.d.info.SMs, 1))
	return b.d.Post(func() error {
		// With dExpertScale, the per-token terms go to an [N,E] scratch summed per expert in a
		// fixed order (no atomics): the probability sum's kernels.
		var gq uintptr
		if pdes != 0 {
			s, err := b.d.allocOnThread(uint64(4 * n * e))
			if err != nil {
				return err
			}
			defer b.d.alloc.Free(s.ptr) // freed after the kernels: later work is on the same stream
			gq = s.ptr
		}
		args := packArgs(pp, ps, pw, pdw, pa, pd, cd, pes, gq, int32(n), int32(e), int32(k), b2i(a.Score == backend.RouterSigmoid), b2i(a.NormTopK), a.Scaling())
		if err := b.d.launchOnThread(moeFile, "moe_route_bwd", [3]uint32{uint32(blocks), 1, 1}, [3]uint32{uint32(32 * warps), 1, 1}, uint32(warps*4*e), args...); err != nil {
			return err
		}
		if gq == 0 {
			return nil
		}
		return b.columnSumOnThread(gq, pdes, n, e)
	})
}

// MoEPermute implements backend.Optional.MoEPermute: a histogram per chunk of 1024 slots, one
// block that scans them into every chunk's base and the offsets, a scatter of the slots in
// chunk order, and the row gather.
func (b *Backend) MoEPermute(a backend.MoEPermuteArgs) error {
	const op = "MoEPermute"
	if a.Sel.IsNil() || a.Sel.Rank() != 2 {
		return fmt.Errorf("cuda: %s: sel %v must be [N,K]", op, a.Sel)
	}
	n, k := a.Sel.Dim(0), a.Sel.Dim(1)
	if a.E < 1 {
		return fmt.Errorf("cuda: %s: %d experts", op, a.E)
	}
	if a.X.IsNil() || a.X.Rank() != 2 || a.X.Dim(0) != n {
		return fmt.Errorf("cuda: %s: x %v must be [N=%d,C]", op, a.X, n)
	}
	c, s := a.X.Dim(1), n*k
	if err := firstErr(
		moeShape(op, "sel", a.Sel, n, k, tensor.I32),
		moeShape(op, "offsets", a.Offsets, 1, a.E+1, tensor.I32),
		moeShape(op, "order", a.Order, 1, s, tensor.I32),
		moeShape(op, "slot", a.Slot, n, k, tensor.I32),
		moeShape(op, "xs", a.Xs, s, c, a.X.DType()),
	); err != nil {
		return err
	}
	if int64(s) > math.MaxInt32 || 4*(a.E+1) > 48<<10 {
		return fmt.Errorf("cuda: %s: %d slots over %d experts exceed the kernels' limits (2^31 slots, 12287 experts)", op, s, a.E)
	}
	arg := b.args(op)
	psel := arg.i32("sel", a.Sel)
	px := arg.ptr("x", a.X)
	poff := arg.i32("offsets", a.Offsets)
	pord := arg.i32("order", a.Order)
	pslot := arg.i32("slot", a.Slot)
	pxs := arg.ptr("xs", a.Xs)
	if err := arg.err(); err != nil {
		return err
	}
	chunks := (s + 1023) / 1024
	e := int32(a.E)
	rowBytes := int64(c) * int64(a.X.DType().Size())
	gather, unit := "moe_gather_u16", int64(2)
	switch {
	case rowBytes%16 == 0 && px%16 == 0 && pxs%16 == 0:
		gather, unit = "moe_gather_v16", 16
	case rowBytes%4 == 0 && px%4 == 0 && pxs%4 == 0:
		gather, unit = "moe_gather_u32", 4
	}
	return b.d.Post(func() error {
		hist, err := b.d.allocOnThread(uint64(4 * max(chunks, 1) * a.E))
		if err != nil {
			return err
		}
		defer b.d.alloc.Free(hist.ptr) // freed after the kernels: later work is on the same stream
		if chunks > 0 {
			if err := b.d.launchOnThread(moeFile, "moe_hist", [3]uint32{uint32(chunks), 1, 1}, [3]uint32{1024, 1, 1}, uint32(4*a.E),
				packArgs(psel, hist.ptr, int32(s), e)...); err != nil {
				return err
			}
		}
		if err := b.d.launchOnThread(moeFile, "moe_scan", [3]uint32{1, 1, 1}, [3]uint32{uint32(min(1024, (a.E+31)/32*32)), 1, 1}, uint32(4*(a.E+1)),
			packArgs(hist.ptr, poff, int32(chunks), e)...); err != nil {
			return err
		}
		if chunks == 0 {
			return nil
		}
		if err := b.d.launchOnThread(moeFile, "moe_scatter", [3]uint32{uint32(chunks), 1, 1}, [3]uint32{1024, 1, 1}, 0,
			packArgs(psel, hist.ptr, poff, pord, pslot, int32(s), int32(k), e)...); err != nil {
			return err
		}
		units := rowBytes / unit
		if units == 0 {
			return nil
		}
		return b.d.launchOnThread(moeFile, gather, grid1D(int64(s)*units, b.d.info.SMs), [3]uint32{256, 1, 1}, 0,
			packArgs(pxs, px, pord, int64(s), units)...)
	})
}

// slotArgs checks slot [N,K] against a row-stacked [S,C] tensor st and an [N,C] tensor nt.
func slotArgs(op string, slot T, sname string, st T, nname string, nt T) (n, k, c int, err error) {
	if slot.IsNil() || slot.Rank() != 2 {
		return 0, 0, 0, fmt.Errorf("cuda: %s: slot %v must be [N,K]", op, slot)
	}
	n, k = slot.Dim(0), slot.Dim(1)
	if nt.IsNil() || nt.Rank() != 2 || nt.Dim(0) != n {
		return 0, 0, 0, fmt.Errorf("cuda: %s: %s %v must be [N=%d,C]", op, nname, nt, n)
	}
	c = nt.Dim(1)
	if err = firstErr(moeShape(op, "slot", slot, n, k, tensor.I32), moeShape(op, sname, st, n*k, c, tensor.Invalid)); err != nil {
		return 0, 0, 0, err
	}
	if int64(n)*int64(k)*int64(max(c, 1)) > math.MaxInt64/4 || c > math.MaxInt32 {
		return 0, 0, 0, fmt.Errorf("cuda: %s: [%d,%d] rows are too large", op, n*k, c)
	}
	return n, k, c, nil
}

// MoEPermuteBackward implements backend.Optional.MoEPermuteBackward.
func (b *Backend) MoEPermuteBackward(a backend.MoEPermuteBackwardArgs) error {
	const op = "MoEPermuteBackward"
	n, k, c, err := slotArgs(op, a.Slot, "dXs", a.DXs, "dX", a.DX)
	if err != nil {
		return err
	}
	arg := b.args(op)
	pdx, cdx := arg.float("dX", a.DX)
	pdxs, cdxs := arg.float("dXs", a.DXs)
	pslot := arg.i32("slot", a.Slot)
	if err := arg.err(); err != nil {
		return err
	}
	if vec8(int64(c), []int32{cdx, cdxs}, pdx, pdxs) {
		return b.launch1D(moeFile, "moe_unpermute_bwd_bf16x8", int64(n)*int64(c/8), pdx, pdxs, pslot, int64(n), int32(c/8), int32(k), b2i(a.Accumulate))
	}
	return b.launch1D(moeFile, "moe_unpermute_bwd", int64(n)*int64(c), pdx, cdx, pdxs, cdxs, pslot, int64(n), int32(c), int32(k), b2i(a.Accumulate))
}

// MoECombine implements backend.Optional.MoECombine.
func (b *Backend) MoECombine(a backend.MoECombineArgs) error {
	const op = "MoECombine"
	n, k, c, err := slotArgs(op, a.Slot, "ys", a.Ys, "out", a.Out)
	if err != nil {
		return err
	}
	if err := moeShape(op, "weights", a.Weights, n, k, tensor.F32); err != nil {
		return err
	}
	arg := b.args(op)
	po, co := arg.float("out", a.Out)
	py, cy := arg.float("ys", a.Ys)
	pslot := arg.i32("slot", a.Slot)
	pw := arg.ptr("weights", a.Weights)
	if err := arg.err(); err != nil {
		return err
	}
	if vec8(int64(c), []int32{co, cy}, po, py) {
		return b.launch1D(moeFile, "moe_combine_bf16x8", int64(n)*int64(c/8), po, py, pslot, pw, int64(n), int32(c/8), int32(k), b2i(a.Accumulate))
	}
	return b.launch1D(moeFile, "moe_combine", int64(n)*int64(c), po, co, py, cy, pslot, pw, int64(n), int32(c), int32(k), b2i(a.Accumulate))
}

// MoECombineBackward implements backend.Optional.MoECombineBackward.
func (b *Backend) MoECombineBackward(a backend.MoECombineBackwardArgs) error {
	const op = "MoECombineBackward"
	n, k, c, err := slotArgs(op, a.Slot, "ys", a.Ys, "dOut", a.DOut)
	if err != nil {
		return err
	}
	if err := firstErr(
		moeShape(op, "weights", a.Weights, n, k, tensor.F32),
		moeShape(op, "dWeights", a.DWeights, n, k, tensor.F32),
		moeShape(op, "dYs", a.DYs, n*k, c, tensor.Invalid),
	); err != nil {
		return err
	}
	if tensor.SameBuffer(a.DYs, a.Ys) {
		return fmt.Errorf("cuda: %s: dYs may not alias ys", op)
	}
	if n > math.MaxInt32 {
		return fmt.Errorf("cuda: %s: %d tokens exceed the kernel's grid", op, n)
	}
	arg := b.args(op)
	pdy, cdy := arg.float("dYs", a.DYs)
	pdw := arg.ptr("dWeights", a.DWeights)
	pdo, cdo := arg.float("dOut", a.DOut)
	py, cy := arg.float("ys", a.Ys)
	pslot := arg.i32("slot", a.Slot)
	pw := arg.ptr("weights", a.Weights)
	if err := arg.err(); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	threads := uint32(256)
	if c <= 512 {
		threads = 128
	}
	kernel, args := "moe_combine_bwd", packArgs(pdy, cdy, pdw, pdo, cdo, py, cy, pslot, pw, int32(c), int32(k))
	if vec8(int64(c), []int32{cdy, cdo, cy}, pdy, pdo, py) {
		threads = uint32(min(256, max(32, (c/8+31)/32*32)))
		kernel, args = "moe_combine_bwd_bf16x8", packArgs(pdy, pdw, pdo, py, pslot, pw, int32(c/8), int32(k))
	}
	return b.d.Post(func() error {
		return b.d.launchOnThread(moeFile, kernel, [3]uint32{uint32(n), 1, 1}, [3]uint32{threads, 1, 1}, 0, args...)
	})
}

// packedArgs checks gateUp [R,2I] against a [R,I] tensor.
func packedArgs(op string, gateUp T, hname string, half T) (r, i int, err error) {
	if gateUp.IsNil() || gateUp.Rank() < 1 || gateUp.Dim(-1)%2 != 0 {
		return 0, 0, fmt.Errorf("cuda: %s: gateUp %v must be [R,2I]", op, gateUp)
	}
	i = gateUp.Dim(-1) / 2
	if i == 0 {
		return 0, 0, nil
	}
	r = gateUp.Numel() / (2 * i)
	return r, i, moeShape(op, hname, half, r, i, tensor.Invalid)
}

// packedForward launches kernel (a packed gate|up activation's forward, kernels/moe.cu: the
// name, and name_bf16x8 for bf16 rows of 16-byte aligned eighths) from gateUp [R, 2I] into out
// [R, I].
func (b *Backend) packedForward(op, kernel string, out, gateUp T) error {
	r, i, err := packedArgs(op, gateUp, "out", out)
	if err != nil {
		return err
	}
	arg := b.args(op)
	po, co := arg.float("out", out)
	pg, cg := arg.float("gateUp", gateUp)
	if err := arg.err(); err != nil {
		return err
	}
	if vec8(int64(i), []int32{co, cg}, po, pg) {
		return b.launch1D(moeFile, kernel+"_bf16x8", int64(r)*int64(i/8), po, pg, int64(r), int32(i/8))
	}
	return b.launch1D(moeFile, kernel, int64(r)*int64(i), po, co, pg, cg, int64(r), int32(i))
}

// packedBackward launches kernel (as packedForward, the backward: dGateUp [R, 2I] from dOut
// [R, I] and the forward's gateUp; dGateUp may be gateUp).
func (b *Backend) packedBackward(op, kernel string, dGateUp, dOut, gateUp T) error {
	r, i, err := packedArgs(op, gateUp, "dOut", dOut)
	if err != nil {
		return err
	}
	if dGateUp.Numel() != gateUp.Numel() {
		return fmt.Errorf("cuda: %s: dGateUp %v must match gateUp %v", op, dGateUp, gateUp)
	}
	arg := b.args(op)
	pdg, cdg := arg.float("dGateUp", dGateUp)
	pd, cd := arg.float("dOut", dOut)
	pg, cg := arg.float("gateUp", gateUp)
	if err := arg.err(); err != nil {
		return err
	}
	if vec8(int64(i), []int32{cdg, cd, cg}, pdg, pd, pg) {
		return b.launch1D(moeFile, kernel+"_bf16x8", int64(r)*int64(i/8), pdg, pd, pg, int64(r), int32(i/8))
	}
	return b.launch1D(moeFile, kernel, int64(r)*int64(i), pdg, cdg, pd, cd, pg, cg, int64(r), int32(i))
}

// SwiGLUPacked implements backend.Optional.SwiGLUPacked.
func (b *Backend) SwiGLUPacked(out, gateUp T) error {
	return b.packedForward("SwiGLUPacked", "swiglu_packed_fwd", out, gateUp)
}

// SwiGLUPackedBackward implements backend.Optional.SwiGLUPackedBackward.
func (b *Backend) SwiGLUPackedBackward(dGateUp, dOut, gateUp T) error {
	return b.packedBackward("SwiGLUPackedBackward", "swiglu_packed_bwd", dGateUp, dOut, gateUp)
}

// GeGLUPacked implements backend.Optional.GeGLUPacked.
func (b *Backend) GeGLUPacked(out, gateUp T) error {
	return b.packedForward("GeGLUPacked", "geglu_packed_fwd", out, gateUp)
}

// GeGLUPackedBackward implements backend.Optional.GeGLUPackedBackward.
func (b *Backend) GeGLUPackedBackward(dGateUp, dOut, gateUp T) error {
	return b.packedBackward("GeGLUPackedBackward", "geglu_packed_bwd", dGateUp, dOut, gateUp)
}
