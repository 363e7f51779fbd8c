package parallel

import (
	"fmt"
	"sort"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// ExpertRoute is the token exchange of expert parallelism for one MoE layer on one rank of an
// expert-parallel group of EP ranks: E experts are owned in contiguous blocks (rank r owns
// experts [r·E/EP, (r+1)·E/EP)), and each of the rank's N tokens is routed to K experts. The
// N·K (token, slot) assignments are sent to the experts' owners (Dispatch), computed there, and
// returned to their place (Combine); DispatchBackward and CombineBackward run the same
// exchanges for the gradients.
//
// Rows travel in a fixed order (by owner, then expert, then token and slot), so results are
// deterministic. Returned tensors have max(rows, 1) rows: when a rank sends or receives nothing,
// its result has one unused row (devices do not allocate empty tensors). Every rank of the group must build its route and run each exchange in the same
// order (they are collectives).
type ExpertRoute struct {
	c          comm.Communicator
	n, k, e    int
	order      []int32 // [N·K] assignment index (token·K + slot) of each sent row, in send order
	tokens     []int32 // [N·K] token of each sent row
	send, recv []int   // rows to and from each rank
	// RecvExperts[i] is the expert of the i-th received row (rows arrive grouped by source
	// rank, then by expert).
	RecvExperts []int32
}

// ExpertOwner returns the expert-parallel rank that owns expert e of experts over ep ranks.
func ExpertOwner(e, experts, ep int) int { return e / (experts / ep) }

// NewExpertRoute plans the exchange for sel, the [N·K] chosen experts of this rank's tokens
// (token-major), and exchanges the row counts and expert ids with the group of c.
func NewExpertRoute(c comm.Communicator, sel []int32, n, k, experts int) (*ExpertRoute, error) {
	ep := c.Size()
	if experts <= 0 || experts%ep != 0 {
		return nil, fmt.Errorf("parallel: expert route: %d experts do not split over %d ranks", experts, ep)
	}
	if n < 0 || k <= 0 || len(sel) != n*k {
		return nil, fmt.Errorf("parallel: expert route: %d choices for %d tokens x %d slots", len(sel), n, k)
	}
	r := &ExpertRoute{c: c, n: n, k: k, e: experts, send: make([]int, ep), recv: make([]int, ep)}
	r.order = make([]int32, n*k)
	for i, e := range sel {
		if e < 0 || int(e) >= experts {
			return nil, fmt.Errorf("parallel: expert route: token %d slot %d chose expert %d of %d", i/k, i%k, e, experts)
		}
		r.order[i] = int32(i)
		r.send[ExpertOwner(int(e), experts, ep)]++
	}
	sort.SliceStable(r.order, func(a, b int) bool { return sel[r.order[a]] < sel[r.order[b]] })
	r.tokens = make([]int32, n*k)
	sentExperts := make([]int32, n*k)
	for i, a := range r.order {
		r.tokens[i] = a / int32(k)
		sentExperts[i] = sel[a]
	}
	b := c.Backend()
	// Counts: row j of the send tensor is the count for rank j.
	sc := make([]int32, ep)
	for j, v := range r.send {
		sc[j] = int32(v)
	}
	ones := make([]int, ep)
	for j := range ones {
		ones[j] = 1
	}
	got, err := exchangeInts(b, c, sc, ones, ones)
	if err != nil {
		return nil, err
	}
	for j, v := range got {
		r.recv[j] = int(v)
	}
	if r.RecvExperts, err = exchangeInts(b, c, sentExperts, r.send, r.recv); err != nil {
		return nil, err
	}
	return r, nil
}

// exchangeInts runs an all-to-all of int32 rows (one value per row).
func exchangeInts(b backend.Backend, c comm.Communicator, v []int32, send, recv []int) ([]int32, error) {
	total := 0
	for _, x := range recv {
		total += x
	}
	src, err := intRows(b, v)
	if err != nil {
		return nil, err
	}
	defer b.Free(src)
	dst, err := b.Alloc(tensor.I32, max(total, 1), 1)
	if err != nil {
		return nil, err
	}
	defer b.Free(dst)
	d, _ := dst.Rows(0, total)
	s, _ := src.Rows(0, len(v))
	if err := c.AllToAll(d, s, send, recv, comm.Dispatch); err != nil {
		return nil, err
	}
	if total == 0 {
		return nil, nil
	}
	return backend.ToInt32(b, d)
}

// intRows uploads v as an [len(v), 1] I32 tensor (one spare row when v is empty).
func intRows(b backend.Backend, v []int32) (T, error) {
	if len(v) == 0 {
		return b.Alloc(tensor.I32, 1, 1)
	}
	return backend.FromInt32(b, v, len(v), 1)
}

// Received is the number of rows this rank computes (M, the sum of what every rank sends it).
func (r *ExpertRoute) Received() int {
	m := 0
	for _, v := range r.recv {
		m += v
	}
	return m
}

// Dispatch sends each assignment's token row of x [N,C] to its expert's owner and returns the
// received rows [M,C] (the caller frees it); row i goes to expert RecvExperts[i].
func (r *ExpertRoute) Dispatch(x T) (T, error) {
	b := r.c.Backend()
	gathered, err := r.gather(x, r.tokens)
	if err != nil {
		return T{}, err
	}
	defer b.Free(gathered)
	return r.exchange(gathered, r.send, r.recv, comm.Dispatch)
}

// Combine returns the owners' results y [M,C] (rows as Dispatch delivered them) to their
// assignments: out [N·K, C] (token-major, the caller frees it) holds at row token·K+slot the
// result of that token's slot-th expert. Weighting by the router and summing over slots is
// the caller's.
func (r *ExpertRoute) Combine(y T) (T, error) {
	b := r.c.Backend()
	back, err := r.exchange(y, r.recv, r.send, comm.Combine)
	if err != nil {
		return T{}, err
	}
	defer b.Free(back)
	return r.scatter(back, r.order, r.n*r.k)
}

// CombineBackward turns the gradient of Combine's output dOut [N·K, C] into the gradient of its
// input [M,C] (the caller frees it).
func (r *ExpertRoute) CombineBackward(dOut T) (T, error) {
	b := r.c.Backend()
	gathered, err := r.gather(dOut, r.order)
	if err != nil {
		return T{}, err
	}
	defer b.Free(gathered)
	return r.exchange(gathered, r.send, r.recv, comm.Dispatch)
}

// DispatchBackward turns the gradient of Dispatch's output dRecv [M,C] into the gradient of its
// input x: dx [N,C] (the caller frees it), summed over each token's slots.
func (r *ExpertRoute) DispatchBackward(dRecv T) (T, error) {
	b := r.c.Backend()
	back, err := r.exchange(dRecv, r.recv, r.send, comm.Combine)
	if err != nil {
		return T{}, err
	}
	defer b.Free(back)
	return r.scatter(back, r.tokens, r.n)
}

// gather returns rows src[ids[i]] as a new [len(ids), C] tensor.
func (r *ExpertRoute) gather(src T, ids []int32) (T, error) {
	b := r.c.Backend()
	out, err := b.Alloc(src.DType(), max(len(ids), 1), src.Dim(1))
	if err != nil {
		return T{}, err
	}
	if len(ids) == 0 {
		return out, nil
	}
	it, err := backend.FromInt32(b, ids, len(ids))
	if err != nil {
		_ = b.Free(out)
		return T{}, err
	}
	defer b.Free(it)
	if err := b.Embedding(out, src, it); err != nil {
		_ = b.Free(out)
		return T{}, err
	}
	return out, nil
}

// scatter returns a new [n, C] tensor with rows src[i] added at ids[i].
func (r *ExpertRoute) scatter(src T, ids []int32, n int) (T, error) {
	b := r.c.Backend()
	out, err := b.Alloc(src.DType(), max(n, 1), src.Dim(1))
	if err != nil {
		return T{}, err
	}
	if len(ids) == 0 {
		return out, nil
	}
	it, err := backend.FromInt32(b, ids, len(ids))
	if err != nil {
		_ = b.Free(out)
		return T{}, err
	}
	defer b.Free(it)
	rows, _ := src.Rows(0, len(ids))
	if err := b.EmbeddingBackward(out, rows, it); err != nil {
		_ = b.Free(out)
		return T{}, err
	}
	return out, nil
}

// exchange all-to-alls the first sum(send) rows of src and returns the received rows in a new
// tensor.
func (r *ExpertRoute) exchange(src T, send, recv []int, phase comm.Phase) (T, error) {
	b := r.c.Backend()
	ns, nr := 0, 0
	for j := range send {
		ns += send[j]
		nr += recv[j]
	}
	out, err := b.Alloc(src.DType(), max(nr, 1), src.Dim(1))
	if err != nil {
		return T{}, err
	}
	s, err := src.Rows(0, ns)
	if err != nil {
		_ = b.Free(out)
		return T{}, err
	}
	d, _ := out.Rows(0, nr)
	if err := r.c.AllToAll(d, s, send, recv, phase); err != nil {
		_ = b.Free(out)
		return T{}, err
	}
	return out, nil
}
