package cpu

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// groupedChunk is the most rows (GroupedForward, GroupedInputGrad) or output rows of a group's
// weight gradient (GroupedWeightGrad) one parallel task computes, so that uneven groups still
// spread over the pool.
const groupedChunk = 64

// GroupedGEMM is the optional backend.Optional.GroupedGEMM: every group's product in fp32 with
// the packed serial GEMM, tasks of up to groupedChunk rows of one group spread over the worker
// pool. The order of additions of each output element depends only on the shapes and offsets,
// not on the number of workers. Offsets are checked (backend.CheckOffsets) before any work.
func (b *Backend) GroupedGEMM(a backend.GroupedGEMMArgs) error {
	d, err := a.Dims()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	op := "grouped-gemm " + a.Kind.String()
	off, err := ints(op, "Offsets", a.Offsets)
	if err != nil {
		return err
	}
	if err := backend.CheckOffsets(op, off, d.S); err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	as, err := b.in(op, "A", a.A)
	if err != nil {
		return err
	}
	bs, err := b.in(op, "B", a.B)
	if err != nil {
		return err
	}
	outs, flush, err := b.out(op, "Out", a.Out, a.Accumulate)
	if err != nil {
		return err
	}
	beta := float32(0)
	if a.Accumulate {
		beta = 1
	}
	// A task is rows [lo, hi) of group g: rows of A and Out for the row kinds, rows of Out_g
	// (the N_ dimension) for the weight gradient.
	type task struct{ g, lo, hi int }
	var tasks []task
	for g := range d.G {
		lo, hi := int(off[g]), int(off[g+1])
		if a.Kind == backend.GroupedWeightGrad {
			lo, hi = 0, d.N
		}
		for r := lo; r < hi; r += groupedChunk {
			tasks = append(tasks, task{g, r, min(r+groupedChunk, hi)})
		}
	}
	n, k := d.N, d.K
	b.pool.run(len(tasks), func(i int) {
		t := tasks[i]
		var ws gemmScratch
		defer ws.release()
		m := t.hi - t.lo
		switch a.Kind {
		case backend.GroupedForward: // Out[lo:hi] [m,N_] = A[lo:hi] [m,K_] · B_g^T, B_g [N_,K_]
			w := bs[t.g*n*k : (t.g+1)*n*k]
			gemmSerial(false, true, m, n, k, 1, as[t.lo*k:], k, w, k, beta, outs[t.lo*n:], n, &ws)
		case backend.GroupedInputGrad: // Out[lo:hi] [m,K_] = A[lo:hi] [m,N_] · B_g
			w := bs[t.g*n*k : (t.g+1)*n*k]
			gemmSerial(false, false, m, k, n, 1, as[t.lo*n:], n, w, k, beta, outs[t.lo*k:], k, &ws)
		case backend.GroupedWeightGrad: // Out_g[lo:hi] [m,K_] = (A_g^T)[lo:hi] [m,M_g] · B_g [M_g,K_]
			r0, mg := int(off[t.g]), int(off[t.g+1]-off[t.g])
			og := outs[t.g*n*k+t.lo*k:]
			if mg == 0 {
				scaleRows(og, k, 0, m, k, beta)
				return
			}
			gemmSerial(true, false, m, k, mg, 1, as[r0*n+t.lo:], n, bs[r0*k:], k, beta, og, k, &ws)
		}
	})
	flush()
	return nil
}
