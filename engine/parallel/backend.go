package parallel

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

type T = tensor.Tensor

// tkey identifies a parameter tensor by where it lives.
type tkey struct {
	buf tensor.Buffer
	off int64
}

func keyOf(t T) tkey { return tkey{t.Buffer(), t.Offset()} }

// colInfo is a column-parallel weight: its input gradient is a partial sum over the tensor
// group; the weights sharing one input (q, k, v or gate, up) form a group whose accumulated
// input gradient is all-reduced once, after the last of them.
type colInfo struct {
	group string
	size  int
}

// rankBackend is the backend a rank's model runs on: the rank's device, plus the collectives
// that tensor and context parallelism insert around a few ops. The model does not know it is
// split: it sees fewer heads and a narrower MLP (tensor parallel) or fewer tokens (context
// parallel), and this wrapper completes the math:
//
//   - Linear with a row-parallel weight (o_proj, down_proj): partial products are all-reduced
//     over the tensor group; the bias is added by tensor rank 0 only.
//   - LinearBackward with column-parallel weights (q/k/v, gate/up): the input gradient they
//     accumulate is all-reduced over the tensor group after the last weight of the group.
//   - Attention and AttentionBackward under context parallelism: keys and values are
//     all-gathered over the context group, each local query chunk attends over the keys of its
//     documents up to the chunk's end, and key/value gradients are reduce-scattered back.
type rankBackend struct {
	backend.Backend
	tp  comm.Communicator
	cp  comm.Communicator
	col map[tkey]colInfo
	row map[tkey]bool
	// pending counts, per column group, the weights whose backward has run this pass.
	pending map[string]int
	geom    *cpGeom // context-parallel geometry of the current micro-batch (nil when CP = 1)
	// splitExperts is set when routed experts' weights are split over the tensor group.
	splitExperts bool
}

func newRankBackend(b backend.Backend, tp, cp comm.Communicator) *rankBackend {
	return &rankBackend{Backend: b, tp: tp, cp: cp, col: map[tkey]colInfo{}, row: map[tkey]bool{}, pending: map[string]int{}}
}

// Optional implements backend.Backend: every optional capability of the rank's device is
// forwarded, none needs a collective. AddRMSNorm works per token across the whole hidden width,
// and every plan keeps that width whole on every rank: tensor parallelism splits heads and the
// MLP, whose row-parallel outputs Linear has all-reduced before the residual add; context
// parallelism splits tokens; FSDP gathers the parameters (norm gains included) before the step.
// AdamW updates one tensor elementwise (a shard or a replica alike) and the Timer only marks the
// device's queue. The mixture-of-experts members (GroupedGEMM, the MoE routing ops, the packed
// SwiGLU) are forwarded as they are, which is right for the rank's own experts on whole rows,
// with one exception: when the experts' weights are split over the tensor group (expert tensor
// parallelism), GroupedGEMM is dropped, since its partial products would need the collectives
// that Linear and LinearBackward add for those weights; MoE blocks then run their composition
// of Linear ops (nn.MoE), which this wrapper completes. DecodeAttention is dropped under
// context parallelism for the same reason. A capability that reads across ranks is
// wrapped here, as Linear and Attention are.
func (r *rankBackend) Optional() backend.Optional {
	o := r.Backend.Optional()
	if r.splitExperts {
		o.GroupedGEMM = nil
	}
	if r.cp != nil && r.cp.Size() > 1 {
		// A rank holds only its chunk of each document's keys, and DecodeAttention would
		// attend over those alone; decoding then takes the fallback through Attention, which
		// this wrapper completes.
		o.DecodeAttention = nil
	}
	return o
}

// Linear implements backend.Ops.
func (r *rankBackend) Linear(out, x, w, bias T) error {
	if !r.row[keyOf(w)] {
		return r.Backend.Linear(out, x, w, bias)
	}
	if r.tp.Rank() != 0 {
		bias = T{}
	}
	if err := r.Backend.Linear(out, x, w, bias); err != nil {
		return err
	}
	return r.tp.AllReduce(out, comm.Sum)
}

// LinearBackward implements backend.Ops.
func (r *rankBackend) LinearBackward(a backend.LinearBackwardArgs) error {
	if err := r.Backend.LinearBackward(a); err != nil {
		return err
	}
	ci, ok := r.col[keyOf(a.W)]
	if !ok || a.DX.IsNil() {
		return nil
	}
	r.pending[ci.group]++
	if r.pending[ci.group] < ci.size {
		return nil
	}
	delete(r.pending, ci.group)
	return r.tp.AllReduce(a.DX, comm.Sum)
}

// cpGeom is the context-parallel split of one packed micro-batch of S tokens into 2·CP chunks
// of S/(2·CP): rank r holds chunks r and 2·CP-1-r (in that order), which balances the causal
// attention work.
type cpGeom struct {
	cu    []int32 // global document boundaries [D+1]
	chunk int     // tokens per chunk
	cp    int
}

// chunksOf returns the chunk indices of context rank r.
func (g *cpGeom) chunksOf(r int) [2]int { return [2]int{r, 2*g.cp - 1 - r} }

// span is the attention of one local query chunk: queries [qlo, qhi) (local rows), keys
// [klo, khi) (global rows), and the cu_seqlens of both.
type span struct {
	qlo, qhi, klo, khi int
	cuQ, cuK           []int32
}

// spans describes the two query chunks of context rank r.
func (g *cpGeom) spans(r int) []span {
	var out []span
	for i, c := range g.chunksOf(r) {
		lo, hi := c*g.chunk, (c+1)*g.chunk
		// The documents that intersect [lo, hi): d0 holds lo.
		d0 := 0
		for int(g.cu[d0+1]) <= lo {
			d0++
		}
		s0 := int(g.cu[d0])
		sp := span{qlo: i * g.chunk, qhi: (i + 1) * g.chunk, klo: s0, khi: hi, cuQ: []int32{0}, cuK: []int32{0}}
		for d := d0; d+1 < len(g.cu) && int(g.cu[d]) < hi; d++ {
			end := min(int(g.cu[d+1]), hi)
			sp.cuQ = append(sp.cuQ, int32(end-lo))
			sp.cuK = append(sp.cuK, int32(end-s0))
		}
		out = append(out, sp)
	}
	return out
}

// gatherGlobal all-gathers a local [2·chunk, W] tensor over the context group and returns it in
// global token order [S, W]; the caller frees it.
func (r *rankBackend) gatherGlobal(x T) (T, error) {
	g := r.geom
	w := x.Dim(1)
	s := 2 * g.cp * g.chunk
	rm, err := r.Alloc(x.DType(), s, w)
	if err != nil {
		return T{}, err
	}
	defer r.Free(rm)
	if err := r.cp.AllGather(rm, x); err != nil {
		return T{}, err
	}
	out, err := r.Alloc(x.DType(), s, w)
	if err != nil {
		return T{}, err
	}
	if err := r.reorder(out, rm, false); err != nil {
		_ = r.Free(out)
		return T{}, err
	}
	return out, nil
}

// reorder copies between rank-major order (rank j's two chunks at rows [2j·chunk, 2(j+1)·chunk))
// and global order: global = rankMajor when toRankMajor is false, the reverse otherwise.
func (r *rankBackend) reorder(global, rankMajor T, toRankMajor bool) error {
	g := r.geom
	for j := 0; j < g.cp; j++ {
		for i, c := range g.chunksOf(j) {
			a, err := global.Rows(c*g.chunk, (c+1)*g.chunk)
			if err != nil {
				return err
			}
			b, err := rankMajor.Rows((2*j+i)*g.chunk, (2*j+i+1)*g.chunk)
			if err != nil {
				return err
			}
			if toRankMajor {
				err = r.Copy(b, a)
			} else {
				err = r.Copy(a, b)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *rankBackend) ints(v []int32) (T, error) { return backend.FromInt32(r.Backend, v, len(v)) }

// Attention implements backend.Ops.
func (r *rankBackend) Attention(a backend.AttentionArgs) error {
	if r.geom == nil {
		return r.Backend.Attention(a)
	}
	if a.Q.Dim(0) != 2*r.geom.chunk {
		return fmt.Errorf("parallel: context-parallel attention: %d local queries, the plan expects %d", a.Q.Dim(0), 2*r.geom.chunk)
	}
	k, err := r.gatherGlobal(a.K)
	if err != nil {
		return err
	}
	defer r.Free(k)
	v, err := r.gatherGlobal(a.V)
	if err != nil {
		return err
	}
	defer r.Free(v)
	for _, sp := range r.geom.spans(r.cp.Rank()) {
		if err := r.attendSpan(a, sp, k, v); err != nil {
			return err
		}
	}
	return nil
}

func (r *rankBackend) attendSpan(a backend.AttentionArgs, sp span, k, v T) (err error) {
	cuQ, err := r.ints(sp.cuQ)
	if err != nil {
		return err
	}
	defer r.Free(cuQ)
	cuK, err := r.ints(sp.cuK)
	if err != nil {
		return err
	}
	defer r.Free(cuK)
	sub := a
	sub.CuSeqlens, sub.CuSeqlensK, sub.MaxSeqLen = cuQ, cuK, 0
	if sub.Q, err = a.Q.Rows(sp.qlo, sp.qhi); err != nil {
		return err
	}
	if sub.Out, err = a.Out.Rows(sp.qlo, sp.qhi); err != nil {
		return err
	}
	if !a.LSE.IsNil() {
		if sub.LSE, err = a.LSE.Rows(sp.qlo, sp.qhi); err != nil {
			return err
		}
	}
	if sub.K, err = k.Rows(sp.klo, sp.khi); err != nil {
		return err
	}
	if sub.V, err = v.Rows(sp.klo, sp.khi); err != nil {
		return err
	}
	return r.Backend.Attention(sub)
}

// AttentionBackward implements backend.Ops.
func (r *rankBackend) AttentionBackward(a backend.AttentionBackwardArgs) error {
	if r.geom == nil {
		return r.Backend.AttentionBackward(a)
	}
	k, err := r.gatherGlobal(a.K)
	if err != nil {
		return err
	}
	defer r.Free(k)
	v, err := r.gatherGlobal(a.V)
	if err != nil {
		return err
	}
	defer r.Free(v)
	s, w := k.Dim(0), k.Dim(1)
	var dk, dv T // global-order key/value gradients, summed over this rank's queries
	if dk, err = r.Alloc(tensor.F32, s, w); err != nil {
		return err
	}
	defer r.Free(dk)
	if dv, err = r.Alloc(tensor.F32, s, w); err != nil {
		return err
	}
	defer r.Free(dv)
	for _, sp := range r.geom.spans(r.cp.Rank()) {
		if err := r.attendSpanBackward(a, sp, k, v, dk, dv); err != nil {
			return err
		}
	}
	for _, p := range [][2]T{{a.DK, dk}, {a.DV, dv}} {
		if err := r.scatterGrad(p[0], p[1]); err != nil {
			return err
		}
	}
	return nil
}

// scatterGrad sums a global-order gradient over the context group and keeps this rank's rows:
// dst [2·chunk, W] =.
func (r *rankBackend) scatterGrad(dst, global T) error {
	rm, err := r.Alloc(tensor.F32, global.Shape()...)
	if err != nil {
		return err
	}
	defer r.Free(rm)
	if err := r.reorder(global, rm, true); err != nil {
		return err
	}
	mine, err := r.Alloc(tensor.F32, dst.Shape()...)
	if err != nil {
		return err
	}
	defer r.Free(mine)
	if err := r.cp.ReduceScatter(mine, rm, comm.Sum); err != nil {
		return err
	}
	return r.Copy(dst, mine)
}

func (r *rankBackend) attendSpanBackward(a backend.AttentionBackwardArgs, sp span, k, v, dk, dv T) (err error) {
	cuQ, err := r.ints(sp.cuQ)
	if err != nil {
		return err
	}
	defer r.Free(cuQ)
	cuK, err := r.ints(sp.cuK)
	if err != nil {
		return err
	}
	defer r.Free(cuK)
	n := sp.khi - sp.klo
	tk, err := r.Alloc(a.K.DType(), n, k.Dim(1))
	if err != nil {
		return err
	}
	defer r.Free(tk)
	tv, err := r.Alloc(a.V.DType(), n, v.Dim(1))
	if err != nil {
		return err
	}
	defer r.Free(tv)
	sub := a
	sub.CuSeqlens, sub.CuSeqlensK, sub.MaxSeqLen = cuQ, cuK, 0
	sub.DK, sub.DV = tk, tv
	rows := func(t T, lo, hi int) T {
		if err != nil {
			return T{}
		}
		var x T
		x, err = t.Rows(lo, hi)
		return x
	}
	sub.Q, sub.DQ = rows(a.Q, sp.qlo, sp.qhi), rows(a.DQ, sp.qlo, sp.qhi)
	sub.Out, sub.DOut = rows(a.Out, sp.qlo, sp.qhi), rows(a.DOut, sp.qlo, sp.qhi)
	sub.LSE = rows(a.LSE, sp.qlo, sp.qhi)
	sub.K, sub.V = rows(k, sp.klo, sp.khi), rows(v, sp.klo, sp.khi)
	gk, gv := rows(dk, sp.klo, sp.khi), rows(dv, sp.klo, sp.khi)
	if err != nil {
		return err
	}
	if err := r.Backend.AttentionBackward(sub); err != nil {
		return err
	}
	if err := r.Axpy(gk, 1, tk); err != nil {
		return err
	}
	return r.Axpy(gv, 1, tv)
}
