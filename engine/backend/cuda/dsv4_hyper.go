package cuda

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Host launchers of kernels/dsv4_hyper.cu: DeepSeek-V4's hyper-connection weights, the
// collapse and expansion of its residual streams, and its sqrt-softplus and split clamped
// SwiGLU activations (backend.DSV4Ops).

const dsv4HyperFile = "dsv4_hyper.cu"

// dsv4MaxStreams is the most hyper-connection streams the kernels take (HC_MAXN): a row's
// n×n mixing matrix is held per thread.
const dsv4MaxStreams = 8

// dsv4HyperRows is the rows per chunk of the parameter gradients' partial sums.
const dsv4HyperRows = 256

// dsv4HyperThreads is the block size of the one-thread-per-row hyper kernels: small, so that
// a few thousand rows still spread over every SM.
const dsv4HyperThreads = 64

func init() {
	dsv4Fills = append(dsv4Fills, func(b *Backend, o *backend.DSV4Ops) {
		o.HyperWeights = b.HyperWeights
		o.HyperWeightsBackward = b.HyperWeightsBackward
		o.StreamCollapse = b.StreamCollapse
		o.StreamCollapseBackward = b.StreamCollapseBackward
		o.StreamExpand = b.StreamExpand
		o.StreamExpandBackward = b.StreamExpandBackward
		o.SqrtSoftplus = b.SqrtSoftplus
		o.SqrtSoftplusBackward = b.SqrtSoftplusBackward
		o.SwiGLUClampedSplit = b.SwiGLUClampedSplit
		o.SwiGLUClampedSplitBackward = b.SwiGLUClampedSplitBackward
	})
}

// hyperMaxStreams refuses more streams than the kernels hold.
func hyperMaxStreams(op string, n int) error {
	if n > dsv4MaxStreams {
		return fmt.Errorf("cuda: %s: %d hyper-connection streams; the kernels take at most %d", op, n, dsv4MaxStreams)
	}
	return nil
}

// launchHyperRows runs a kernel of one thread per row (a grid-stride loop over n rows) in
// blocks of dsv4HyperThreads.
func (b *Backend) launchHyperRows(name string, n int64, args ...any) error {
	if n <= 0 {
		return nil
	}
	blocks := min((n+dsv4HyperThreads-1)/dsv4HyperThreads, int64(max(b.d.info.SMs, 1)*64))
	p := packArgs(args...)
	return b.d.Post(func() error {
		return b.d.launchOnThread(dsv4HyperFile, name, [3]uint32{uint32(blocks), 1, 1}, [3]uint32{dsv4HyperThreads, 1, 1}, 0, p...)
	})
}

// launchHyperBlocks runs a kernel of one 256-thread block per row (a loop over n rows).
func (b *Backend) launchHyperBlocks(name string, n int64, args ...any) error {
	if n <= 0 {
		return nil
	}
	blocks := min(n, 1<<20)
	p := packArgs(args...)
	return b.d.Post(func() error {
		return b.d.launchOnThread(dsv4HyperFile, name, [3]uint32{uint32(blocks), 1, 1}, [3]uint32{256, 1, 1}, 0, p...)
	})
}

func hyperFlag(v bool) int32 {
	if v {
		return 1
	}
	return 0
}

// HyperWeights implements backend.DSV4Ops.HyperWeights.
func (b *Backend) HyperWeights(a backend.HyperWeightsArgs) error {
	const op = "HyperWeights"
	N, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if err := hyperMaxStreams(op, a.Streams); err != nil {
		return err
	}
	arg := b.args(op)
	pz, cz := arg.float("Z", a.Z)
	ps, cs := arg.float("Scale", a.Scale)
	pb, cb := arg.float("Base", a.Base)
	ppre := arg.ptr("Pre", a.Pre)
	ppost, pcomb := arg.opt("Post", a.Post), arg.opt("Comb", a.Comb)
	if err := arg.err(); err != nil {
		return err
	}
	return b.launchHyperRows("dsv4_hyper_fwd", int64(N), pz, cz, ps, cs, pb, cb, ppre, ppost, pcomb, int64(N),
		int32(a.Streams), int32(a.Iters), a.Eps, hyperFlag(a.Head))
}

// HyperWeightsBackward implements backend.DSV4Ops.HyperWeightsBackward: the per-row backward
// (dz, and the gradient of the scaled logits into a scratch), then the parameters' sums over
// chunks of rows and their fold, both in a fixed order.
func (b *Backend) HyperWeightsBackward(a backend.HyperWeightsBackwardArgs) error {
	const op = "HyperWeightsBackward"
	N, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if err := hyperMaxStreams(op, a.Streams); err != nil {
		return err
	}
	if N == 0 {
		return nil
	}
	m := a.M()
	gzz, err := b.allocScratch(tensor.F32, N, m) // every element is written
	if err != nil {
		return err
	}
	defer b.Free(gzz)
	nb := (int64(N) + dsv4HyperRows - 1) / dsv4HyperRows
	part, err := b.allocScratch(tensor.F32, int(nb), 2*m) // every partial is written
	if err != nil {
		return err
	}
	defer b.Free(part)
	arg := b.args(op)
	pdz, cdz := arg.float("DZ", a.DZ)
	pg := arg.ptr("scratch", gzz)
	ppart := arg.ptr("scratch", part)
	pz, cz := arg.float("Z", a.Z)
	ps, cs := arg.float("Scale", a.Scale)
	pb, cb := arg.float("Base", a.Base)
	pdpre := arg.ptr("DPre", a.DPre)
	pdpost, pdcomb := arg.opt("DPost", a.DPost), arg.opt("DComb", a.DComb)
	pgs, cgs := arg.float("GScale", a.GScale)
	pgb, cgb := arg.float("GBase", a.GBase)
	if err := arg.err(); err != nil {
		return err
	}
	n, head := int32(a.Streams), hyperFlag(a.Head)
	if err := b.launchHyperRows("dsv4_hyper_bwd", int64(N), pdz, cdz, pg, pz, cz, ps, cs, pb, cb, pdpre, pdpost, pdcomb,
		int64(N), n, int32(a.Iters), a.Eps, head); err != nil {
		return err
	}
	if err := b.launch1D(dsv4HyperFile, "dsv4_hyper_part", nb*2*int64(m), ppart, pg, pz, cz, int64(N), int32(m),
		int64(dsv4HyperRows)); err != nil {
		return err
	}
	return b.launch1D(dsv4HyperFile, "dsv4_hyper_fold", int64(m+a.Scale.Numel()), pgs, cgs, pgb, cgb, ppart, nb, n,
		int32(m), int32(a.Scale.Numel()), head)
}

// StreamCollapse implements backend.DSV4Ops.StreamCollapse.
func (b *Backend) StreamCollapse(out, w, x T) error {
	const op = "StreamCollapse"
	N, n, C, err := backend.StreamDims("stream-collapse", w, x, out)
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	arg := b.args(op)
	po, co := arg.float("Out", out)
	pw := arg.ptr("W", w)
	px, cx := arg.float("X", x)
	if err := arg.err(); err != nil {
		return err
	}
	return b.launch1D(dsv4HyperFile, "dsv4_stream_collapse_fwd", int64(N)*int64(C), po, co, pw, px, cx, int64(N),
		int32(n), int64(C))
}

// StreamCollapseBackward implements backend.DSV4Ops.StreamCollapseBackward (either gradient
// may be nil).
func (b *Backend) StreamCollapseBackward(dW, dX, dOut, w, x T) error {
	const op = "StreamCollapseBackward"
	N, n, C, err := backend.StreamDims("stream-collapse-backward", w, x, dOut)
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if !dW.IsNil() && (dW.Rank() != 2 || dW.Dim(0) != N || dW.Dim(1) != n) {
		return fmt.Errorf("cuda: %s: dW %v must be [%d,%d] like w", op, dW, N, n)
	}
	if !dX.IsNil() && (dX.Rank() != 2 || dX.Dim(0) != N || dX.Dim(1) != n*C) {
		return fmt.Errorf("cuda: %s: dX %v must be [%d,%d] like x", op, dX, N, n*C)
	}
	arg := b.args(op)
	pdw, cdw := arg.optFloat("dW", dW)
	pdx, cdx := arg.optFloat("dX", dX)
	pdo, cdo := arg.float("dOut", dOut)
	pw := arg.ptr("w", w)
	px, cx := arg.float("x", x)
	if err := arg.err(); err != nil {
		return err
	}
	if pdw == 0 && pdx == 0 {
		return nil
	}
	return b.launchHyperBlocks("dsv4_stream_collapse_bwd", int64(N), pdw, cdw, pdx, cdx, pdo, cdo, pw, px, cx, int64(N),
		int32(n), int64(C))
}

// StreamExpand implements backend.DSV4Ops.StreamExpand (Out may be X).
func (b *Backend) StreamExpand(a backend.StreamExpandArgs) error {
	const op = "StreamExpand"
	N, n, C, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if err := hyperMaxStreams(op, n); err != nil {
		return err
	}
	arg := b.args(op)
	po, co := arg.float("Out", a.Out)
	pp := arg.ptr("Post", a.Post)
	pf, cf := arg.float("F", a.F)
	pc := arg.ptr("Comb", a.Comb)
	px, cx := arg.float("X", a.X)
	if err := arg.err(); err != nil {
		return err
	}
	return b.launch1D(dsv4HyperFile, "dsv4_stream_expand_fwd", int64(N)*int64(C), po, co, pp, pf, cf, pc, px, cx,
		int64(N), int32(n), int64(C))
}

// StreamExpandBackward implements backend.DSV4Ops.StreamExpandBackward (DPost and DComb must
// be F32; any gradient may be nil).
func (b *Backend) StreamExpandBackward(a backend.StreamExpandBackwardArgs) error {
	const op = "StreamExpandBackward"
	N, n, C, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if err := hyperMaxStreams(op, n); err != nil {
		return err
	}
	for _, g := range []struct {
		name string
		t    T
	}{{"DPost", a.DPost}, {"DComb", a.DComb}} {
		if !g.t.IsNil() && g.t.DType() != tensor.F32 {
			return fmt.Errorf("cuda: %s: %s %v must be F32", op, g.name, g.t)
		}
	}
	arg := b.args(op)
	pdp, pdc := arg.opt("DPost", a.DPost), arg.opt("DComb", a.DComb)
	pdf, cdf := arg.optFloat("DF", a.DF)
	pdx, cdx := arg.optFloat("DX", a.DX)
	pdo, cdo := arg.float("DOut", a.DOut)
	pp := arg.ptr("Post", a.Post)
	pf, cf := arg.float("F", a.F)
	pc := arg.ptr("Comb", a.Comb)
	px, cx := arg.float("X", a.X)
	if err := arg.err(); err != nil {
		return err
	}
	if pdp == 0 && pdc == 0 && pdf == 0 && pdx == 0 {
		return nil
	}
	return b.launchHyperBlocks("dsv4_stream_expand_bwd", int64(N), pdp, pdc, pdf, cdf, pdx, cdx, pdo, cdo, pp, pf, cf,
		pc, px, cx, int64(N), int32(n), int64(C))
}

// SqrtSoftplus implements backend.DSV4Ops.SqrtSoftplus.
func (b *Backend) SqrtSoftplus(out, x T) error {
	const op = "SqrtSoftplus"
	cnt, err := backend.ElementwiseCount(op, []string{"x", "out"}, x, out)
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	n := int64(cnt)
	arg := b.args(op)
	po, co := arg.float("out", out)
	px, cx := arg.float("x", x)
	if err := arg.err(); err != nil {
		return err
	}
	return b.launch1D(dsv4HyperFile, "dsv4_sqrt_softplus_fwd", n, po, co, px, cx, n)
}

// SqrtSoftplusBackward implements backend.DSV4Ops.SqrtSoftplusBackward.
func (b *Backend) SqrtSoftplusBackward(dX, dOut, x, out T) error {
	const op = "SqrtSoftplusBackward"
	cnt, err := backend.ElementwiseCount(op, []string{"x", "out", "dOut", "dX"}, x, out, dOut, dX)
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	n := int64(cnt)
	arg := b.args(op)
	pdx, cdx := arg.float("dX", dX)
	pdo, cdo := arg.float("dOut", dOut)
	px, cx := arg.float("x", x)
	po, co := arg.float("out", out)
	if err := arg.err(); err != nil {
		return err
	}
	return b.launch1D(dsv4HyperFile, "dsv4_sqrt_softplus_bwd", n, pdx, cdx, pdo, cdo, px, cx, po, co, n)
}

// SwiGLUClampedSplit implements backend.DSV4Ops.SwiGLUClampedSplit.
func (b *Backend) SwiGLUClampedSplit(out, gate, up T, limit float32) error {
	const op = "SwiGLUClampedSplit"
	cnt, err := backend.ElementwiseCount(op, []string{"gate", "up", "out"}, gate, up, out)
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	n := int64(cnt)
	arg := b.args(op)
	po, co := arg.float("out", out)
	pg, cg := arg.float("gate", gate)
	pu, cu := arg.float("up", up)
	if err := arg.err(); err != nil {
		return err
	}
	return b.launch1D(dsv4HyperFile, "dsv4_swiglu_split_fwd", n, po, co, pg, cg, pu, cu, limit, n)
}

// SwiGLUClampedSplitBackward implements backend.DSV4Ops.SwiGLUClampedSplitBackward (either
// gradient may be nil).
func (b *Backend) SwiGLUClampedSplitBackward(dGate, dUp, dOut, gate, up T, limit float32) error {
	const op = "SwiGLUClampedSplitBackward"
	cnt, err := backend.SwiGLUClampedSplitBackwardCount(op, dGate, dUp, dOut, gate, up)
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	n := int64(cnt)
	arg := b.args(op)
	pdg, cdg := arg.optFloat("dGate", dGate)
	pdu, cdu := arg.optFloat("dUp", dUp)
	pdo, cdo := arg.float("dOut", dOut)
	pg, cg := arg.float("gate", gate)
	pu, cu := arg.float("up", up)
	if err := arg.err(); err != nil {
		return err
	}
	if pdg == 0 && pdu == 0 {
		return nil
	}
	return b.launch1D(dsv4HyperFile, "dsv4_swiglu_split_bwd", n, pdg, cdg, pdu, cdu, pdo, cdo, pg, cg, pu, cu, limit, n)
}
