package nn

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// MoA is JetMoE's mixture of attention heads (transformers' JetMoeAttention with its
// JetMoeMoA experts and JetMoeTopKGating router), run by Attention in place of its own
// projections when Attention.MoA is set. Letters: E experts, K = TopK, NKV key/value heads of
// HD, Q = NKV*HD, NH = K*NKV query heads.
//
//	logits = x · Router^T                       [N, E]  (fp32 on the host)
//	e_t,i  = the K experts of token t by logit, in torch.topk's descending order
//	g_t,i  = softmax over i of logits[t, e_t,i]
//	q_t,i  = WQ[e_t,i] · x_t                     [Q]     query of token t: the K slots in order,
//	                                                      head h = i*NKV + j
//	k, v   = the two halves of KV · x            [N, Q] each
//	o      = causal attention of RoPE(q), RoPE(k), v per document, scale 1/sqrt(HD); query
//	         head h attends with key/value head h % NKV (transformers' repeat)
//	out_t  = sum_i g_t,i · WO[e_t,i] · o_t,i + Bias
//
// The backend's grouped attention pairs query head h with key head h / (NH/NKV), so the query
// heads are reordered to [j, i] (head j*K + i) before it and its output back after it, with
// CopyColumns. Routing is on the host (the logits are downloaded once per forward); each
// expert's query and output products run on its rows, gathered with Embedding and
// scatter-added back with EmbeddingBackward, as the MoE host path does; the gates are applied
// with ScaleRows and their gradient read with RowDot.
//
// Gradients (+=): GWQ, GWO and GBias (zero tensors: frozen), the router's and KV's as Linear's.
// The top-k choice has no gradient; the gates carry one into the chosen logits and so into
// the router and x. Cached for backward (keep): x (not owned), the routing, per expert its
// gathered input, attention output rows and unweighted output; the rotated queries (in the
// attention's head order), keys, values, the attention output and its log-sum-exp.
//
// Decoding (Pass.Cache, Pass.Slots) is not supported.
type MoA struct {
	Name   string
	Router Linear // W [E, C]
	KV     Linear // W [2*NKV*HD, C]: keys, then values
	// WQ [E, NKV*HD, C] and WO [E, C, NKV*HD] are the experts' query and output weights; GWQ
	// and GWO their gradients (+=; zero tensors: frozen).
	WQ, WO, GWQ, GWO T
	// Bias [C] (optional) is added to the output; GBias its gradient.
	Bias, GBias T
	E, TopK     int
	NKV, HD     int
	// Layer is the index of the layer (for errors and, later, its cache).
	Layer int

	c moaCache
}

type moaExpert struct {
	tokens, slots []int32 // source token and assignment (t*K+i) of each row
	tok, slot     T       // the same on the device, [M] I32
	gate          T       // [M] F32
	xe            T       // [M, C] gathered input
	oe            T       // [M, Q] gathered attention output
	ye            T       // [M, C] unweighted output
}

type moaCache struct {
	x                 T
	sel               []int32   // [N*K] chosen experts
	gates             []float32 // [N*K]
	ex                []moaExpert
	q, k, v, out, lse T // q and out in the attention's head order [j, i]
	live              bool
}

func (m *MoA) q() int  { return m.NKV * m.HD }
func (m *MoA) nh() int { return m.TopK * m.NKV }

func (m *MoA) name() string {
	if m.Name != "" {
		return m.Name
	}
	return fmt.Sprintf("layer %d attention experts", m.Layer)
}

func (m *MoA) errorf(format string, args ...any) error {
	return fmt.Errorf("nn: %s (layer %d): %s", m.name(), m.Layer, fmt.Sprintf(format, args...))
}

func (m *MoA) wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("nn: %s (layer %d)%s: %w", m.name(), m.Layer, what, err)
}

// expertW returns expert e's [rows, cols] block of a stacked [E, rows, cols] tensor (zero when
// t is).
func expertW(t T, e, rows, cols int) (T, error) {
	if t.IsNil() {
		return T{}, nil
	}
	return t.View(e*rows*cols, rows, cols)
}

func (m *MoA) shape(p *Pass) backend.AttentionShape {
	return backend.AttentionShape{CuSeqlens: p.CuSeqlens, MaxSeqLen: p.MaxSeqLen, NH: m.nh(), NKV: m.NKV, HD: m.HD}
}

func (m *MoA) rope(p *Pass, heads int) backend.RoPEArgs {
	return backend.RoPEArgs{Positions: p.Positions, InvFreq: p.InvFreq, Heads: heads, HeadDim: m.HD,
		AttentionScaling: p.AttentionScaling}
}

// check validates the geometry against x [N, C].
func (m *MoA) check(p *Pass, x T) error {
	if m.E < 1 || m.TopK < 1 || m.TopK > m.E || m.NKV < 1 || m.HD < 1 {
		return m.errorf("top-%d of %d experts with %d key/value heads of %d is not a valid geometry", m.TopK, m.E, m.NKV, m.HD)
	}
	if x.Rank() != 2 || x.Dim(0) != p.N {
		return m.errorf("input %v must be [%d, C]", x, p.N)
	}
	c, q := x.Dim(1), m.q()
	if m.WQ.Numel() != m.E*q*c || m.WO.Numel() != m.E*c*q {
		return m.errorf("WQ %v and WO %v must be [%d, %d, %d] and [%d, %d, %d]", m.WQ, m.WO, m.E, q, c, m.E, c, q)
	}
	if !m.Bias.IsNil() && m.Bias.Numel() != c {
		return m.errorf("bias %v must be [%d]", m.Bias, c)
	}
	if o, i := m.Router.Shape(); o != m.E || i != c {
		return m.errorf("router [%d, %d] must be [%d, %d]", o, i, m.E, c)
	}
	if o, i := m.KV.Shape(); o != 2*q || i != c {
		return m.errorf("kv projection [%d, %d] must be [%d, %d]", o, i, 2*q, c)
	}
	return nil
}

// route chooses each token's experts and gates from the router logits [N*E].
func (m *MoA) route(logits []float32, n int) {
	e, k := m.E, m.TopK
	c := &m.c
	c.sel, c.gates = make([]int32, n*k), make([]float32, n*k)
	row := make([]float64, e)
	for t := 0; t < n; t++ {
		for j := range row {
			row[j] = float64(logits[t*e+j])
		}
		top := torchTopK(row, k)
		mx := row[top[0]]
		for _, j := range top {
			mx = math.Max(mx, row[j])
		}
		s := 0.0
		ex := make([]float64, k)
		for i, j := range top {
			ex[i] = math.Exp(row[j] - mx)
			s += ex[i]
		}
		for i, j := range top {
			c.sel[t*k+i] = int32(j)
			c.gates[t*k+i] = float32(ex[i] / s)
		}
	}
	c.ex = make([]moaExpert, e)
	for a, x := range c.sel {
		ec := &c.ex[x]
		ec.tokens = append(ec.tokens, int32(a/k))
		ec.slots = append(ec.slots, int32(a))
	}
}

// permute copies the heads of src into dst [N, K*NKV*HD]: toAttn moves slot-major heads
// (i*NKV + j) to the attention's order (j*K + i), !toAttn moves them back.
func (m *MoA) permute(p *Pass, dst, src T, toAttn bool) error {
	k, nkv, hd := m.TopK, m.NKV, m.HD
	for i := 0; i < k; i++ {
		a := backend.ColumnCopyArgs{Dst: dst, Src: src, Groups: nkv, Width: hd,
			DstOffset: i * hd, DstStride: k * hd, SrcOffset: i * nkv * hd, SrcStride: hd}
		if !toAttn {
			a.DstOffset, a.DstStride, a.SrcOffset, a.SrcStride = a.SrcOffset, a.SrcStride, a.DstOffset, a.DstStride
		}
		if err := p.B.CopyColumns(a); err != nil {
			return m.wrap(" heads", err)
		}
	}
	return nil
}

// Forward returns a new y [N, C] for x [N, C] (the normed hidden states); keep caches what
// Backward needs.
func (m *MoA) Forward(p *Pass, x T, keep bool) (y T, err error) {
	if m.c.live {
		return T{}, m.errorf("Forward called twice without Backward or Release")
	}
	if p.Cache != nil || p.Slots != nil {
		return T{}, m.errorf("the mixture of attention heads does not decode with a KV cache")
	}
	if err := m.check(p, x); err != nil {
		return T{}, err
	}
	c := &m.c
	c.x, c.live = x, true
	defer func() {
		if err != nil || !keep {
			m.Release(p)
		}
	}()
	n, ch, q, k, nh := p.N, x.Dim(1), m.q(), m.TopK, m.nh()
	logits, err := m.Router.Forward(p, x)
	if err != nil {
		return T{}, m.wrap(" router", err)
	}
	lv, err := backend.ToFloat32(p.B, logits)
	_ = free(p.B, &logits)
	if err != nil {
		return T{}, m.wrap(" router", err)
	}
	m.route(lv, n)

	// Queries, slot-major: row t*K+i of qs [N*K, Q] is slot i of token t.
	qs, err := p.alloc(n*k, q)
	if err != nil {
		return T{}, m.wrap("", err)
	}
	defer func() { _ = free(p.B, &qs) }()
	for e := range c.ex {
		if err = m.expertQuery(p, e, x, qs, ch, keep); err != nil {
			return T{}, err
		}
	}
	qv, err := qs.Reshape(n, nh*m.HD)
	if err != nil {
		return T{}, m.wrap("", err)
	}
	if err = p.B.RoPE(qv, qv, m.rope(p, nh)); err != nil {
		return T{}, m.wrap(" rope q", err)
	}
	if c.q, err = p.out(n, nh*m.HD); err != nil {
		return T{}, m.wrap("", err)
	}
	if err = m.permute(p, c.q, qv, true); err != nil {
		return T{}, err
	}

	kv, err := m.KV.Forward(p, x)
	if err != nil {
		return T{}, m.wrap(" kv projection", err)
	}
	defer func() { _ = free(p.B, &kv) }()
	if c.k, err = p.out(n, q); err != nil {
		return T{}, m.wrap("", err)
	}
	if c.v, err = p.out(n, q); err != nil {
		return T{}, m.wrap("", err)
	}
	if err = p.B.CopyColumns(backend.ColumnCopyArgs{Dst: c.k, Src: kv, Groups: 1, Width: q}); err == nil {
		err = p.B.CopyColumns(backend.ColumnCopyArgs{Dst: c.v, Src: kv, Groups: 1, Width: q, SrcOffset: q})
	}
	if err != nil {
		return T{}, m.wrap(" kv split", err)
	}
	if err = p.B.RoPE(c.k, c.k, m.rope(p, m.NKV)); err != nil {
		return T{}, m.wrap(" rope k", err)
	}

	if c.out, err = p.out(n, nh*m.HD); err != nil {
		return T{}, m.wrap("", err)
	}
	if c.lse, err = p.outF32(n, nh); err != nil {
		return T{}, m.wrap("", err)
	}
	if err = p.B.Attention(backend.AttentionArgs{AttentionShape: m.shape(p), Out: c.out, LSE: c.lse,
		Q: c.q, K: c.k, V: c.v}); err != nil {
		return T{}, m.wrap(" attention", err)
	}
	// The attention output back in slot-major order, [N*K, Q] (qs reused).
	if err = m.permute(p, qv, c.out, false); err != nil {
		return T{}, err
	}

	if y, err = p.alloc(n, ch); err != nil {
		return T{}, m.wrap("", err)
	}
	if !m.Bias.IsNil() {
		if err = m.biasRows(p, func(b, ids T) error { return p.B.Embedding(y, b, ids) }, m.Bias, n); err != nil {
			_ = free(p.B, &y)
			return T{}, err
		}
	}
	for e := range c.ex {
		if err = m.expertOutput(p, e, qs, y, ch, keep); err != nil {
			_ = free(p.B, &y)
			return T{}, err
		}
	}
	return y, nil
}

// biasRows runs op with the bias seen as a [1, C] table and n zero ids: Embedding broadcasts
// it to every row, EmbeddingBackward sums the rows into it.
func (m *MoA) biasRows(p *Pass, op func(b, ids T) error, b T, n int) error {
	bt, err := b.Reshape(1, b.Numel())
	if err != nil {
		return m.wrap(" bias", err)
	}
	ids, err := backend.FromInt32(p.B, make([]int32, n), n)
	if err != nil {
		return m.wrap(" bias", err)
	}
	defer func() { _ = free(p.B, &ids) }()
	return m.wrap(" bias", op(bt, ids))
}

// expertQuery writes expert e's queries into their slots' rows of qs [N*K, Q].
func (m *MoA) expertQuery(p *Pass, e int, x, qs T, ch int, keep bool) (err error) {
	ec := &m.c.ex[e]
	rows := len(ec.tokens)
	if rows == 0 {
		return nil
	}
	what := fmt.Sprintf(" expert %d", e)
	if ec.tok, err = backend.FromInt32(p.B, ec.tokens, rows); err != nil {
		return m.wrap(what, err)
	}
	if ec.slot, err = backend.FromInt32(p.B, ec.slots, rows); err != nil {
		return m.wrap(what, err)
	}
	if ec.xe, err = p.out(rows, ch); err != nil {
		return m.wrap(what, err)
	}
	if err = p.B.Embedding(ec.xe, x, ec.tok); err != nil {
		return m.wrap(what+" gather", err)
	}
	w, err := expertW(m.WQ, e, m.q(), ch)
	if err != nil {
		return m.wrap(what, err)
	}
	l := Linear{W: w}
	qe, err := l.Forward(p, ec.xe)
	if err != nil {
		return m.wrap(what+" query", err)
	}
	err = p.B.EmbeddingBackward(qs, qe, ec.slot)
	_ = free(p.B, &qe)
	if !keep {
		_ = free(p.B, &ec.xe)
	}
	return m.wrap(what+" query scatter", err)
}

// expertOutput adds expert e's gated output projection of its slots' attention rows (o, [N*K,
// Q]) into y [N, C].
func (m *MoA) expertOutput(p *Pass, e int, o, y T, ch int, keep bool) (err error) {
	ec := &m.c.ex[e]
	rows := len(ec.tokens)
	if rows == 0 {
		return nil
	}
	what := fmt.Sprintf(" expert %d", e)
	if ec.oe, err = p.out(rows, m.q()); err != nil {
		return m.wrap(what, err)
	}
	if err = p.B.Embedding(ec.oe, o, ec.slot); err != nil {
		return m.wrap(what+" gather", err)
	}
	w, err := expertW(m.WO, e, ch, m.q())
	if err != nil {
		return m.wrap(what, err)
	}
	l := Linear{W: w}
	ye, err := l.Forward(p, ec.oe)
	if err != nil {
		return m.wrap(what+" output", err)
	}
	defer func() { _ = free(p.B, &ye) }()
	gv := make([]float32, rows)
	for r, a := range ec.slots {
		gv[r] = m.c.gates[a]
	}
	if ec.gate, err = backend.FromFloat32(p.B, gv, tensor.F32, rows); err != nil {
		return m.wrap(what, err)
	}
	if keep {
		if ec.ye, err = p.out(rows, ch); err == nil {
			err = p.B.Copy(ec.ye, ye)
		}
		if err != nil {
			return m.wrap(what, err)
		}
	}
	if err = p.B.ScaleRows(ye, ec.gate); err != nil {
		return m.wrap(what+" gates", err)
	}
	return m.wrap(what+" combine", p.B.EmbeddingBackward(y, ye, ec.tok))
}

// Backward returns a new dx [N, C] (=) for dy [N, C], accumulates every parameter gradient
// (+=) and releases the cache.
func (m *MoA) Backward(p *Pass, dy T) (dx T, err error) {
	if !m.c.live {
		return T{}, m.errorf("Backward without a cached Forward")
	}
	c := &m.c
	defer m.Release(p)
	if err := zeroFresh(p, m.name(), m.GWQ, m.GWO, m.GBias); err != nil {
		return T{}, err
	}
	n, ch, q, k, nh, e := p.N, c.x.Dim(1), m.q(), m.TopK, m.nh(), m.E
	if !m.GBias.IsNil() {
		if err = m.biasRows(p, func(b, ids T) error { return p.B.EmbeddingBackward(b, dy, ids) }, m.GBias, n); err != nil {
			return T{}, err
		}
	}
	// Gradient of the slot-major attention output [N*K, Q], and of each assignment's gate.
	do, err := p.alloc(n*k, q)
	if err != nil {
		return T{}, m.wrap("", err)
	}
	defer func() { _ = free(p.B, &do) }()
	dg := make([]float64, n*k)
	for x := range c.ex {
		if err = m.expertOutputBackward(p, x, dy, do, dg, ch); err != nil {
			return T{}, err
		}
	}
	dov, err := do.Reshape(n, nh*m.HD)
	if err != nil {
		return T{}, m.wrap("", err)
	}
	var dattn, dq, dk, dv, dkv T
	defer func() { _ = free(p.B, &dattn, &dq, &dk, &dv, &dkv) }()
	if dattn, err = p.out(n, nh*m.HD); err != nil {
		return T{}, m.wrap("", err)
	}
	if err = m.permute(p, dattn, dov, true); err != nil {
		return T{}, err
	}
	if dq, err = p.out(n, nh*m.HD); err == nil {
		if dk, err = p.out(n, q); err == nil {
			dv, err = p.out(n, q)
		}
	}
	if err != nil {
		return T{}, m.wrap("", err)
	}
	if err = p.B.AttentionBackward(backend.AttentionBackwardArgs{AttentionShape: m.shape(p),
		DQ: dq, DK: dk, DV: dv, DOut: dattn, Q: c.q, K: c.k, V: c.v, Out: c.out, LSE: c.lse}); err != nil {
		return T{}, m.wrap(" attention", err)
	}
	// The query gradient back in slot-major order (do reused), then through RoPE.
	if err = m.permute(p, dov, dq, false); err != nil {
		return T{}, err
	}
	if err = p.B.RoPEBackward(dov, dov, m.rope(p, nh)); err != nil {
		return T{}, m.wrap(" rope q", err)
	}
	if err = p.B.RoPEBackward(dk, dk, m.rope(p, m.NKV)); err != nil {
		return T{}, m.wrap(" rope k", err)
	}
	if dkv, err = p.out(n, 2*q); err != nil {
		return T{}, m.wrap("", err)
	}
	if err = p.B.CopyColumns(backend.ColumnCopyArgs{Dst: dkv, Src: dk, Groups: 1, Width: q}); err == nil {
		err = p.B.CopyColumns(backend.ColumnCopyArgs{Dst: dkv, Src: dv, Groups: 1, Width: q, DstOffset: q})
	}
	if err != nil {
		return T{}, m.wrap(" kv join", err)
	}
	if dx, err = p.out(n, ch); err != nil {
		return T{}, m.wrap("", err)
	}
	defer func() {
		if err != nil {
			_ = free(p.B, &dx)
		}
	}()
	if err = m.KV.Backward(p, dx, dkv, c.x, false); err != nil {
		return T{}, m.wrap(" kv projection", err)
	}
	for x := range c.ex {
		if err = m.expertQueryBackward(p, x, do, dx, ch); err != nil {
			return T{}, err
		}
	}
	// Router: the gates are the softmax of the chosen logits.
	dz := make([]float32, n*e)
	for t := 0; t < n; t++ {
		g, d := c.gates[t*k:(t+1)*k], dg[t*k:(t+1)*k]
		dot := 0.0
		for i := range g {
			dot += float64(g[i]) * d[i]
		}
		for i, x := range c.sel[t*k : (t+1)*k] {
			dz[t*e+int(x)] += float32(float64(g[i]) * (d[i] - dot))
		}
	}
	dlogits, err := p.out(n, e)
	if err != nil {
		return T{}, m.wrap("", err)
	}
	defer func() { _ = free(p.B, &dlogits) }()
	if err = upload(p.B, dlogits, dz); err != nil {
		return T{}, m.wrap(" router", err)
	}
	if err = m.Router.Backward(p, dx, dlogits, c.x, true); err != nil {
		return T{}, m.wrap(" router", err)
	}
	return dx, nil
}

// expertOutputBackward takes expert e's share of dy: the gates' gradients into dg, GWO's
// block, and the attention output's gradient scattered into do [N*K, Q].
func (m *MoA) expertOutputBackward(p *Pass, e int, dy, do T, dg []float64, ch int) (err error) {
	ec := &m.c.ex[e]
	rows := len(ec.tokens)
	if rows == 0 {
		return nil
	}
	what := fmt.Sprintf(" expert %d", e)
	if ec.ye.IsNil() || ec.oe.IsNil() {
		return m.errorf("expert %d: Backward after a Forward without keep", e)
	}
	var dye, dge, doe T
	defer func() { _ = free(p.B, &dye, &dge, &doe) }()
	if dye, err = p.out(rows, ch); err != nil {
		return m.wrap(what, err)
	}
	if err = p.B.Embedding(dye, dy, ec.tok); err != nil {
		return m.wrap(what+" gather", err)
	}
	if dge, err = p.outF32(rows); err != nil {
		return m.wrap(what, err)
	}
	if err = p.B.RowDot(dge, dye, ec.ye); err != nil {
		return m.wrap(what+" gate gradient", err)
	}
	gv, err := backend.ToFloat32(p.B, dge)
	if err != nil {
		return m.wrap(what+" gate gradient", err)
	}
	for r, a := range ec.slots {
		dg[a] += float64(gv[r])
	}
	if err = p.B.ScaleRows(dye, ec.gate); err != nil {
		return m.wrap(what+" gates", err)
	}
	w, err := expertW(m.WO, e, ch, m.q())
	if err != nil {
		return m.wrap(what, err)
	}
	gw, err := expertW(m.GWO, e, ch, m.q())
	if err != nil {
		return m.wrap(what, err)
	}
	if doe, err = p.out(rows, m.q()); err != nil {
		return m.wrap(what, err)
	}
	l := Linear{W: w, GW: gw}
	if err = l.Backward(p, doe, dye, ec.oe, false); err != nil {
		return m.wrap(what+" output", err)
	}
	return m.wrap(what+" output scatter", p.B.EmbeddingBackward(do, doe, ec.slot))
}

// expertQueryBackward takes expert e's query gradient rows of dq [N*K, Q] (slot-major,
// unrotated) into GWQ's block and dx (+=).
func (m *MoA) expertQueryBackward(p *Pass, e int, dq, dx T, ch int) (err error) {
	ec := &m.c.ex[e]
	rows := len(ec.tokens)
	if rows == 0 {
		return nil
	}
	what := fmt.Sprintf(" expert %d", e)
	if ec.xe.IsNil() {
		return m.errorf("expert %d: Backward after a Forward without keep", e)
	}
	var dqe, dxe T
	defer func() { _ = free(p.B, &dqe, &dxe) }()
	if dqe, err = p.out(rows, m.q()); err != nil {
		return m.wrap(what, err)
	}
	if err = p.B.Embedding(dqe, dq, ec.slot); err != nil {
		return m.wrap(what+" gather", err)
	}
	w, err := expertW(m.WQ, e, m.q(), ch)
	if err != nil {
		return m.wrap(what, err)
	}
	gw, err := expertW(m.GWQ, e, m.q(), ch)
	if err != nil {
		return m.wrap(what, err)
	}
	if dxe, err = p.out(rows, ch); err != nil {
		return m.wrap(what, err)
	}
	l := Linear{W: w, GW: gw}
	if err = l.Backward(p, dxe, dqe, ec.xe, false); err != nil {
		return m.wrap(what+" query", err)
	}
	return m.wrap(what+" combine", p.B.EmbeddingBackward(dx, dxe, ec.tok))
}

// Release frees the cached activations without a backward.
func (m *MoA) Release(p *Pass) {
	c := &m.c
	for i := range c.ex {
		ec := &c.ex[i]
		_ = free(p.B, &ec.tok, &ec.slot, &ec.gate, &ec.xe, &ec.oe, &ec.ye)
	}
	_ = free(p.B, &c.q, &c.k, &c.v, &c.out, &c.lse)
	*c = moaCache{}
}
