package nn

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// OSSMoE is gpt-oss's mixture-of-experts block (transformers' GptOssMLP), with its weights in
// the checkpoint's own layout:
//
//	logits  = x @ Router.W^T + Router.B                      [N,E]
//	S_n     = the TopK experts of token n by logit (ties to the lower index)
//	w_n,e   = softmax over S_n of the logits (fp32)
//	gu      = x @ GateUp[e] + GateUpBias[e]                  [M_e,2I], gate at 2i, up at 2i+1
//	a       = SwiGLUClamped(gu; Alpha, Limit)                [M_e,I]
//	y       = a @ Down[e] + DownBias[e]                      [M_e,C]
//	out[n]  = sum_{e in S_n} w_n,e * y_e[n]
//
// GateUp [E,C,2I], GateUpBias [E,2I], Down [E,I,C], DownBias [E,C] (the weights are [in, out],
// transposed from Linear's). Where the backend has the MoE ops and the grouped GEMM the block
// runs on the device path of moe_oss_device.go (no host read inside the layer; HALO_MOE_PATH
// =composed turns it off). Otherwise routing runs on the host (the logits are downloaded); each
// expert's rows are gathered with the Embedding op, its biases broadcast to its rows the same
// way (from a row of zeros ids), its products are GEMMs and its weighted output is
// scatter-added with EmbeddingBackward. Gradients of the weights and biases accumulate (+=)
// into the G* views (zero tensors: frozen); the router's through Router.
//
// Cached for backward (keep): x (not owned), the selection and weights [N,K], and per expert
// its token ids, gathered input [M_e,C], gate|up [M_e,2I], activation [M_e,I], unweighted output
// [M_e,C] and weights [M_e]. The load-balancing loss is not computed (the model refuses
// output_router_logits for this block).
type OSSMoE struct {
	Name                                   string
	Router                                 Linear
	GateUp, GateUpBias, Down, DownBias     T
	GGateUp, GGateUpBias, GDown, GDownBias T
	TopK                                   int
	Alpha, Limit                           float32

	c   ossCache
	dev ossDev // the device path's cache (moe_oss_device.go)
}

var _ FFN = (*OSSMoE)(nil)

type ossExpert struct {
	e            int
	tok          []int32 // token rows, increasing
	slot         []int   // each row's position among its token's TopK
	ids, w       T       // [M] I32, [M] F32
	xe, gu, a, y T       // [M,C], [M,2I], [M,I], [M,C] (y unweighted)
}

type ossCache struct {
	x       T
	n       int
	sel     []int32   // [N,K]
	w       []float32 // [N,K]
	experts []*ossExpert
	zeros   T // [N] I32 zeros: the bias rows' ids
	live    bool
}

func (m *OSSMoE) dims() (e, c, i int) {
	e, c = m.GateUp.Dim(0), m.GateUp.Dim(1)
	return e, c, m.GateUp.Dim(2) / 2
}

// view returns expert e's slice [rows, cols] of a stacked tensor t (zero for a zero t).
func view(t T, e, rows, cols int) (T, error) {
	if t.IsNil() {
		return T{}, nil
	}
	return t.View(e*rows*cols, rows, cols)
}

// Forward implements FFN.
func (m *OSSMoE) Forward(p *Pass, x T, keep bool) (out T, err error) {
	c := &m.c
	if c.live {
		return T{}, fmt.Errorf("nn: %s: Forward called twice without Backward or Release", m.Name)
	}
	ne, cw, iw := m.dims()
	n := x.Dim(0)
	if m.TopK < 1 || m.TopK > ne {
		return T{}, fmt.Errorf("nn: %s: top-k %d must be between 1 and the %d experts", m.Name, m.TopK, ne)
	}
	c.x, c.n, c.live = x, n, true
	defer func() {
		if err != nil || !keep {
			m.Release(p)
		}
	}()
	if o, ok := m.deviceOps(p, x); ok {
		if err := m.checkDevice(); err != nil {
			return T{}, err
		}
		return m.deviceForward(p, o, x, keep)
	}
	lg, err := m.Router.Forward(p, x)
	if err != nil {
		return T{}, err
	}
	logits, err := backend.ToFloat32(p.B, lg)
	_ = p.B.Free(lg)
	if err != nil {
		return T{}, wrap(m.Name+" router", err)
	}
	k := m.TopK
	c.sel, c.w = make([]int32, n*k), make([]float32, n*k)
	score := make([]float64, ne)
	rows := make([][]int32, ne)
	slots := make([][]int, ne)
	for t := 0; t < n; t++ {
		row := logits[t*ne : (t+1)*ne]
		for j, v := range row {
			if math.IsNaN(float64(v)) {
				return T{}, fmt.Errorf("nn: %s: router logit of token %d is NaN", m.Name, t)
			}
			score[j] = float64(v)
		}
		sel := c.sel[t*k : (t+1)*k]
		backend.RouteTopK(sel, score, nil)
		top := make([]float32, k)
		for j, e := range sel {
			top[j] = row[e]
		}
		backend.Softmax64(c.w[t*k:(t+1)*k], top)
		for j, e := range sel {
			rows[e] = append(rows[e], int32(t))
			slots[e] = append(slots[e], j)
		}
	}
	if c.zeros, err = p.B.Alloc(tensor.I32, max(n, 1)); err != nil {
		return T{}, wrap(m.Name, err)
	}
	if out, err = p.alloc(n, cw); err != nil {
		return T{}, wrap(m.Name, err)
	}
	for e := 0; e < ne; e++ {
		if len(rows[e]) == 0 {
			continue
		}
		ex := &ossExpert{e: e, tok: rows[e], slot: slots[e]}
		c.experts = append(c.experts, ex)
		if err = m.expertForward(p, ex, out, ne, cw, iw); err != nil {
			_ = free(p.B, &out)
			return T{}, err
		}
		if !keep {
			ex.release(p)
		}
	}
	return out, nil
}

func (m *OSSMoE) expertForward(p *Pass, ex *ossExpert, out T, ne, cw, iw int) (err error) {
	mr := len(ex.tok)
	w := make([]float32, mr)
	for r, t := range ex.tok {
		w[r] = m.c.w[int(t)*m.TopK+ex.slot[r]]
	}
	if ex.ids, err = backend.FromInt32(p.B, ex.tok, mr); err != nil {
		return wrap(m.Name, err)
	}
	if ex.w, err = backend.FromFloat32(p.B, w, tensor.F32, mr); err != nil {
		return wrap(m.Name, err)
	}
	zeros, _ := m.c.zeros.Rows(0, mr)
	wGU, _ := view(m.GateUp, ex.e, cw, 2*iw)
	bGU, _ := view(m.GateUpBias, ex.e, 1, 2*iw)
	wD, _ := view(m.Down, ex.e, iw, cw)
	bD, _ := view(m.DownBias, ex.e, 1, cw)
	if ex.xe, err = p.out(mr, cw); err != nil {
		return wrap(m.Name, err)
	}
	if err = p.B.Embedding(ex.xe, m.c.x, ex.ids); err != nil {
		return wrap(m.Name+" gather", err)
	}
	if ex.gu, err = p.out(mr, 2*iw); err != nil {
		return wrap(m.Name, err)
	}
	if err = p.B.Embedding(ex.gu, bGU, zeros); err != nil {
		return wrap(m.Name+" gate_up bias", err)
	}
	if err = p.B.GEMM(backend.GEMMArgs{A: ex.xe, B: wGU, C: ex.gu, Alpha: 1, Beta: 1}); err != nil {
		return wrap(m.Name+" gate_up", err)
	}
	if ex.a, err = p.out(mr, iw); err != nil {
		return wrap(m.Name, err)
	}
	if err = p.B.SwiGLUClamped(ex.a, ex.gu, m.Alpha, m.Limit); err != nil {
		return wrap(m.Name, err)
	}
	if ex.y, err = p.out(mr, cw); err != nil {
		return wrap(m.Name, err)
	}
	if err = p.B.Embedding(ex.y, bD, zeros); err != nil {
		return wrap(m.Name+" down bias", err)
	}
	if err = p.B.GEMM(backend.GEMMArgs{A: ex.a, B: wD, C: ex.y, Alpha: 1, Beta: 1}); err != nil {
		return wrap(m.Name+" down", err)
	}
	ys, err := p.out(mr, cw)
	if err != nil {
		return wrap(m.Name, err)
	}
	defer func() { _ = free(p.B, &ys) }()
	if err = p.B.Copy(ys, ex.y); err == nil {
		if err = p.B.ScaleRows(ys, ex.w); err == nil {
			err = p.B.EmbeddingBackward(out, ys, ex.ids)
		}
	}
	return wrap(m.Name+" combine", err)
}

// Backward implements FFN.
func (m *OSSMoE) Backward(p *Pass, dy T) (dx T, err error) {
	c := &m.c
	if !c.live {
		return T{}, fmt.Errorf("nn: %s: Backward without a cached Forward", m.Name)
	}
	defer m.Release(p)
	// The stacked experts' gradients that hold no values yet this step (Pass.Fresh) are
	// written (=) by the device path's grouped weight gradients, and zeroed first for the
	// experts' own GEMMs, which accumulate.
	if m.dev.active {
		return m.deviceBackward(p, p.B.Optional(), dy, p.Fresh.Take(m.GGateUp), p.Fresh.Take(m.GDown))
	}
	if err := zeroFresh(p, m.Name, m.GGateUp, m.GDown); err != nil {
		return T{}, err
	}
	ne, cw, iw := m.dims()
	n, k := c.n, m.TopK
	if dx, err = p.alloc(n, cw); err != nil {
		return T{}, wrap(m.Name, err)
	}
	dw := make([]float64, n*k) // d loss / d w[n, slot]
	for _, ex := range c.experts {
		if err = m.expertBackward(p, ex, dy, dx, dw, cw, iw); err != nil {
			_ = free(p.B, &dx)
			return T{}, err
		}
	}
	// Softmax over each token's top-k: dl_j = w_j (dw_j - sum_i w_i dw_i), zero elsewhere.
	dl := make([]float32, n*ne)
	for t := 0; t < n; t++ {
		d := 0.0
		for j := 0; j < k; j++ {
			d += float64(c.w[t*k+j]) * dw[t*k+j]
		}
		for j := 0; j < k; j++ {
			dl[t*ne+int(c.sel[t*k+j])] = float32(float64(c.w[t*k+j]) * (dw[t*k+j] - d))
		}
	}
	dlt, err := backend.FromFloat32(p.B, dl, p.DType, n, ne)
	if err != nil {
		_ = free(p.B, &dx)
		return T{}, wrap(m.Name, err)
	}
	defer func() { _ = p.B.Free(dlt) }()
	if err = m.Router.Backward(p, dx, dlt, c.x, true); err != nil {
		_ = free(p.B, &dx)
		return T{}, err
	}
	return dx, nil
}

func (m *OSSMoE) expertBackward(p *Pass, ex *ossExpert, dy, dx T, dw []float64, cw, iw int) error {
	mr := len(ex.tok)
	zeros, _ := m.c.zeros.Rows(0, mr)
	wGU, _ := view(m.GateUp, ex.e, cw, 2*iw)
	wD, _ := view(m.Down, ex.e, iw, cw)
	gGU, _ := view(m.GGateUp, ex.e, cw, 2*iw)
	gbGU, _ := view(m.GGateUpBias, ex.e, 1, 2*iw)
	gD, _ := view(m.GDown, ex.e, iw, cw)
	gbD, _ := view(m.GDownBias, ex.e, 1, cw)
	var dye, rd, da, dxe T
	defer func() { _ = free(p.B, &dye, &rd, &da, &dxe) }()
	var err error
	if dye, err = p.out(mr, cw); err != nil {
		return wrap(m.Name, err)
	}
	if err = p.B.Embedding(dye, dy, ex.ids); err != nil {
		return wrap(m.Name+" gather", err)
	}
	if rd, err = p.outF32(mr); err != nil {
		return wrap(m.Name, err)
	}
	if err = p.B.RowDot(rd, dye, ex.y); err != nil {
		return wrap(m.Name, err)
	}
	rdh, err := backend.ToFloat32(p.B, rd)
	if err != nil {
		return wrap(m.Name, err)
	}
	for r, t := range ex.tok {
		dw[int(t)*m.TopK+ex.slot[r]] += float64(rdh[r])
	}
	if err = p.B.ScaleRows(dye, ex.w); err != nil {
		return wrap(m.Name, err)
	}
	if !gbD.IsNil() {
		if err = p.B.EmbeddingBackward(gbD, dye, zeros); err != nil {
			return wrap(m.Name+" down bias", err)
		}
	}
	if !gD.IsNil() {
		if err = p.B.GEMM(backend.GEMMArgs{A: ex.a, B: dye, C: gD, TransA: true, Alpha: 1, Beta: 1}); err != nil {
			return wrap(m.Name+" down", err)
		}
	}
	if da, err = p.out(mr, iw); err != nil {
		return wrap(m.Name, err)
	}
	if err = p.B.GEMM(backend.GEMMArgs{A: dye, B: wD, C: da, TransB: true, Alpha: 1}); err != nil {
		return wrap(m.Name+" down", err)
	}
	// gu becomes its gradient (the op reads each pair before writing it).
	if err = p.B.SwiGLUClampedBackward(ex.gu, da, ex.gu, m.Alpha, m.Limit); err != nil {
		return wrap(m.Name, err)
	}
	if !gbGU.IsNil() {
		if err = p.B.EmbeddingBackward(gbGU, ex.gu, zeros); err != nil {
			return wrap(m.Name+" gate_up bias", err)
		}
	}
	if !gGU.IsNil() {
		if err = p.B.GEMM(backend.GEMMArgs{A: ex.xe, B: ex.gu, C: gGU, TransA: true, Alpha: 1, Beta: 1}); err != nil {
			return wrap(m.Name+" gate_up", err)
		}
	}
	if dxe, err = p.out(mr, cw); err != nil {
		return wrap(m.Name, err)
	}
	if err = p.B.GEMM(backend.GEMMArgs{A: ex.gu, B: wGU, C: dxe, TransB: true, Alpha: 1}); err != nil {
		return wrap(m.Name+" gate_up", err)
	}
	return wrap(m.Name+" scatter", p.B.EmbeddingBackward(dx, dxe, ex.ids))
}

func (ex *ossExpert) release(p *Pass) {
	_ = free(p.B, &ex.ids, &ex.w, &ex.xe, &ex.gu, &ex.a, &ex.y)
}

// Release implements FFN.
func (m *OSSMoE) Release(p *Pass) {
	for _, ex := range m.c.experts {
		ex.release(p)
	}
	_ = free(p.B, &m.c.zeros)
	m.c = ossCache{}
	m.dev.release(p.B)
}
