package cuda

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// Host launchers of kernels/gated_delta.cu: the gated delta rule, one block per (value head,
// document) and one thread per value column.

const gatedDeltaFile = "gated_delta.cu"

// gatedDeltaMaxKD is GD_MAXKD of gated_delta.cu: the key head dims a thread's state column
// holds.
const gatedDeltaMaxKD = 256

func gatedDeltaShape(op string, d backend.GatedDeltaDims) error {
	if d.KD > gatedDeltaMaxKD || d.VD > 1024 {
		return fmt.Errorf("cuda: %s: key head dim %d and value head dim %d: the kernel takes at most %d and 1024", op, d.KD, d.VD, gatedDeltaMaxKD)
	}
	if d.Docs > 65535 {
		return fmt.Errorf("cuda: %s: %d documents in one pass, at most 65535", op, d.Docs)
	}
	return nil
}

// GatedDelta implements backend.Optional.GatedDelta.
func (b *Backend) GatedDelta(a backend.GatedDeltaArgs) error {
	const op = "GatedDelta"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if err := gatedDeltaShape(op, d); err != nil {
		return err
	}
	arg := b.args(op)
	po, co := arg.float("Out", a.Out)
	ps := arg.opt("States", a.States)
	pq, cq := arg.float("Q", a.Q)
	pk, ck := arg.float("K", a.K)
	pv, cv := arg.float("V", a.V)
	pb, cb := arg.float("Beta", a.Beta)
	pg, cg := arg.float("G", a.G)
	pcu := arg.i32("CuSeqlens", a.CuSeqlens)
	if err := arg.err(); err != nil {
		return err
	}
	p := packArgs(po, co, ps, pq, cq, pk, ck, pv, cv, pb, cb, pg, cg, pcu,
		int32(d.KH), int32(d.VH), int32(d.KD), int32(d.VD), int32(d.Chunk))
	return b.d.Post(func() error {
		return b.d.launchOnThread(gatedDeltaFile, "gated_delta_fwd", [3]uint32{uint32(d.VH), uint32(d.Docs), 1},
			[3]uint32{uint32(d.VD), 1, 1}, 0, p...)
	})
}

// GatedDeltaBackward implements backend.Optional.GatedDeltaBackward.
func (b *Backend) GatedDeltaBackward(a backend.GatedDeltaBackwardArgs) error {
	const op = "GatedDeltaBackward"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if err := gatedDeltaShape(op, d); err != nil {
		return err
	}
	arg := b.args(op)
	pdq := arg.ptr("DQ", a.DQ)
	pdk := arg.ptr("DK", a.DK)
	pdv, cdv := arg.float("DV", a.DV)
	pdb := arg.ptr("DBeta", a.DBeta)
	pdg := arg.ptr("DG", a.DG)
	ps := arg.ptr("States", a.States)
	pdo, cdo := arg.float("DOut", a.DOut)
	pq, cq := arg.float("Q", a.Q)
	pk, ck := arg.float("K", a.K)
	pv, cv := arg.float("V", a.V)
	pb, cb := arg.float("Beta", a.Beta)
	pg, cg := arg.float("G", a.G)
	pcu := arg.i32("CuSeqlens", a.CuSeqlens)
	if err := arg.err(); err != nil {
		return err
	}
	p := packArgs(pdq, pdk, pdv, cdv, pdb, pdg, ps, pdo, cdo, pq, cq, pk, ck, pv, cv, pb, cb, pg, cg, pcu,
		int32(d.KH), int32(d.VH), int32(d.KD), int32(d.VD), int32(d.Chunk))
	return b.d.Post(func() error {
		return b.d.launchOnThread(gatedDeltaFile, "gated_delta_bwd", [3]uint32{uint32(d.VH), uint32(d.Docs), 1},
			[3]uint32{uint32(d.VD), 1, 1}, 0, p...)
	})
}
