package cpu

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// attnBlock is the number of query (or key) rows per parallel task.
const attnBlock = 64

// attnGeom is a validated AttentionShape with host copies of the document boundaries.
type attnGeom struct {
	cuQ, cuK  []int32
	nh, nkv   int
	hd, group int
	scale     float32
	window    int
	nq, nk    int
	qw, kw    int // row widths NH*HD and NKV*HD
	maxK      int
}

// block is a range of rows [lo, hi) of one document.
type block struct{ doc, lo, hi int }

func parseGeom(op string, s backend.AttentionShape, nq, nk int) (*attnGeom, error) {
	g := &attnGeom{nh: s.NH, nkv: s.NKV, hd: s.HD, window: s.Window, nq: nq, nk: nk}
	if s.NH <= 0 || s.NKV <= 0 || s.HD <= 0 || s.NH%s.NKV != 0 {
		return nil, fmt.Errorf("cpu: %s: need NH, NKV, HD > 0 and NH %% NKV == 0 (got NH=%d NKV=%d HD=%d)", op, s.NH, s.NKV, s.HD)
	}
	if s.Window < 0 {
		return nil, fmt.Errorf("cpu: %s: Window %d is negative", op, s.Window)
	}
	g.group = s.NH / s.NKV
	g.qw, g.kw = s.NH*s.HD, s.NKV*s.HD
	g.scale = s.Scale
	if g.scale == 0 {
		g.scale = float32(1 / math.Sqrt(float64(s.HD)))
	}
	var err error
	if g.cuQ, err = ints(op, "CuSeqlens", s.CuSeqlens); err != nil {
		return nil, err
	}
	if err := checkCu(op, "CuSeqlens", g.cuQ, nq); err != nil {
		return nil, err
	}
	g.cuK = g.cuQ
	if !s.CuSeqlensK.IsNil() {
		if g.cuK, err = ints(op, "CuSeqlensK", s.CuSeqlensK); err != nil {
			return nil, err
		}
		if len(g.cuK) != len(g.cuQ) {
			return nil, fmt.Errorf("cpu: %s: CuSeqlensK has %d entries, CuSeqlens %d; they must describe the same documents", op, len(g.cuK), len(g.cuQ))
		}
		if err := checkCu(op, "CuSeqlensK", g.cuK, nk); err != nil {
			return nil, err
		}
	} else if nk != nq {
		return nil, fmt.Errorf("cpu: %s: K has %d rows and Q %d; set CuSeqlensK when they differ", op, nk, nq)
	}
	for d := 0; d+1 < len(g.cuQ); d++ {
		lq, lk := int(g.cuQ[d+1]-g.cuQ[d]), int(g.cuK[d+1]-g.cuK[d])
		if lq > lk {
			return nil, fmt.Errorf("cpu: %s: document %d has %d queries but only %d keys", op, d, lq, lk)
		}
		g.maxK = max(g.maxK, lk)
	}
	return g, nil
}

func checkCu(op, name string, cu []int32, n int) error {
	if len(cu) < 1 || cu[0] != 0 {
		return fmt.Errorf("cpu: %s: %s must start with 0 (got %v)", op, name, head(cu))
	}
	for d := 1; d < len(cu); d++ {
		if cu[d] < cu[d-1] {
			return fmt.Errorf("cpu: %s: %s[%d] = %d < %s[%d] = %d: boundaries must not decrease", op, name, d, cu[d], name, d-1, cu[d-1])
		}
	}
	if int(cu[len(cu)-1]) != n {
		return fmt.Errorf("cpu: %s: %s ends at %d but the tensor has %d rows", op, name, cu[len(cu)-1], n)
	}
	return nil
}

func head(s []int32) []int32 { return s[:min(len(s), 8)] }

// blocks splits each document's rows (queries when keys is false) into attnBlock-sized tasks.
func (g *attnGeom) blocks(keys bool) []block {
	cu := g.cuQ
	if keys {
		cu = g.cuK
	}
	var bs []block
	for d := 0; d+1 < len(cu); d++ {
		for lo := int(cu[d]); lo < int(cu[d+1]); lo += attnBlock {
			bs = append(bs, block{d, lo, min(lo+attnBlock, int(cu[d+1]))})
		}
	}
	return bs
}

// visible returns the key range [jlo, jhi) (absolute rows) that query row q of document d sees.
func (g *attnGeom) visible(d, q int) (int, int) {
	qs, ks := int(g.cuQ[d]), int(g.cuK[d])
	off := int(g.cuK[d+1]-g.cuK[d]) - int(g.cuQ[d+1]-g.cuQ[d])
	last := q - qs + off // local index of the last visible key
	first := 0
	if g.window > 0 {
		first = max(0, last-g.window+1)
	}
	return ks + first, ks + last + 1
}

// queries returns the query range [ilo, ihi) (absolute rows) that see key row k of document d.
func (g *attnGeom) queries(d, k int) (int, int) {
	qs, ks := int(g.cuQ[d]), int(g.cuK[d])
	lq := int(g.cuQ[d+1] - g.cuQ[d])
	off := int(g.cuK[d+1]-g.cuK[d]) - lq
	j := k - ks
	lo := max(0, j-off) // local query i sees j iff i+off >= j
	hi := lq
	if g.window > 0 {
		hi = min(hi, j-off+g.window) // and i+off-j < window
	}
	if hi < lo {
		hi = lo
	}
	return qs + lo, qs + hi
}

func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// Attention is causal GQA attention over packed documents; it caches LSE per (token, head).
func (b *Backend) Attention(a backend.AttentionArgs) error {
	const op = "attention"
	if a.Q.IsNil() || a.K.IsNil() || a.V.IsNil() {
		return fmt.Errorf("cpu: %s: Q, K and V are required", op)
	}
	if a.NH <= 0 || a.NKV <= 0 || a.HD <= 0 {
		return fmt.Errorf("cpu: %s: need NH, NKV, HD > 0 (got %d, %d, %d)", op, a.NH, a.NKV, a.HD)
	}
	nq := a.Q.Numel() / (a.NH * a.HD)
	nk := a.K.Numel() / (a.NKV * a.HD)
	g, err := parseGeom(op, a.AttentionShape, nq, nk)
	if err != nil {
		return err
	}
	if err := numel(op, "Q", a.Q, nq*g.qw, "N*NH*HD"); err != nil {
		return err
	}
	if err := numel(op, "K", a.K, nk*g.kw, "Nk*NKV*HD"); err != nil {
		return err
	}
	if err := numel(op, "V", a.V, nk*g.kw, "Nk*NKV*HD"); err != nil {
		return err
	}
	if err := numel(op, "Out", a.Out, nq*g.qw, "N*NH*HD"); err != nil {
		return err
	}
	for _, in := range []struct {
		n string
		t T
	}{{"Q", a.Q}, {"K", a.K}, {"V", a.V}} {
		if err := overlapErr(op, "Out", a.Out, in.n, in.t); err != nil {
			return err
		}
	}
	var lse []float32
	if !a.LSE.IsNil() {
		if err := numel(op, "LSE", a.LSE, nq*g.nh, "N*NH"); err != nil {
			return err
		}
		if lse, err = f32only(op, "LSE", a.LSE); err != nil {
			return err
		}
	}
	qs, err := b.in(op, "Q", a.Q)
	if err != nil {
		return err
	}
	ks, err := b.in(op, "K", a.K)
	if err != nil {
		return err
	}
	vs, err := b.in(op, "V", a.V)
	if err != nil {
		return err
	}
	os, flush, err := b.out(op, "Out", a.Out, false)
	if err != nil {
		return err
	}
	g.forward(b, qs, ks, vs, os, lse)
	flush()
	return nil
}

// AttentionBackward recomputes probabilities from Q, K and LSE and writes dQ, dK, dV (=).
// Queries and keys are handled in two passes so each output row has a single writer.
func (b *Backend) AttentionBackward(a backend.AttentionBackwardArgs) error {
	const op = "attention-backward"
	if a.Q.IsNil() || a.K.IsNil() || a.V.IsNil() {
		return fmt.Errorf("cpu: %s: Q, K and V are required", op)
	}
	if a.NH <= 0 || a.NKV <= 0 || a.HD <= 0 {
		return fmt.Errorf("cpu: %s: need NH, NKV, HD > 0 (got %d, %d, %d)", op, a.NH, a.NKV, a.HD)
	}
	nq := a.Q.Numel() / (a.NH * a.HD)
	nk := a.K.Numel() / (a.NKV * a.HD)
	g, err := parseGeom(op, a.AttentionShape, nq, nk)
	if err != nil {
		return err
	}
	checks := []struct {
		n    string
		t    T
		want int
		desc string
	}{
		{"Q", a.Q, nq * g.qw, "N*NH*HD"}, {"K", a.K, nk * g.kw, "Nk*NKV*HD"}, {"V", a.V, nk * g.kw, "Nk*NKV*HD"},
		{"Out", a.Out, nq * g.qw, "N*NH*HD"}, {"dOut", a.DOut, nq * g.qw, "N*NH*HD"},
		{"dQ", a.DQ, nq * g.qw, "N*NH*HD"}, {"dK", a.DK, nk * g.kw, "Nk*NKV*HD"}, {"dV", a.DV, nk * g.kw, "Nk*NKV*HD"},
		{"LSE", a.LSE, nq * g.nh, "N*NH"},
	}
	for _, c := range checks {
		if err := numel(op, c.n, c.t, c.want, c.desc); err != nil {
			return err
		}
	}
	for _, o := range []struct {
		n string
		t T
	}{{"dQ", a.DQ}, {"dK", a.DK}, {"dV", a.DV}} {
		for _, in := range checks[:5] {
			if err := overlapErr(op, o.n, o.t, in.n, in.t); err != nil {
				return err
			}
		}
	}
	lse, err := f32only(op, "LSE", a.LSE)
	if err != nil {
		return err
	}
	var qs, ks, vs, os, dos []float32
	for _, p := range []struct {
		dst *[]float32
		n   string
		t   T
	}{{&qs, "Q", a.Q}, {&ks, "K", a.K}, {&vs, "V", a.V}, {&os, "Out", a.Out}, {&dos, "dOut", a.DOut}} {
		if *p.dst, err = b.in(op, p.n, p.t); err != nil {
			return err
		}
	}
	dq, flushQ, err := b.out(op, "dQ", a.DQ, false)
	if err != nil {
		return err
	}
	dk, flushK, err := b.out(op, "dK", a.DK, false)
	if err != nil {
		return err
	}
	dv, flushV, err := b.out(op, "dV", a.DV, false)
	if err != nil {
		return err
	}
	g.backward(b, qs, ks, vs, os, dos, lse, dq, dk, dv)
	flushQ()
	flushK()
	flushV()
	return nil
}

// task is one unit of attention work: a block of rows of one document for one kv head.
type task struct {
	block
	kvh int
}

func (g *attnGeom) tasks(keys bool) []task {
	var ts []task
	for _, bl := range g.blocks(keys) {
		for h := 0; h < g.nkv; h++ {
			ts = append(ts, task{bl, h})
		}
	}
	return ts
}

// keySpan returns the keys seen by any query of rows [lo, hi) of document d.
func (g *attnGeom) keySpan(d, lo, hi int) (int, int) {
	a, _ := g.visible(d, lo)
	_, z := g.visible(d, hi-1)
	return a, z
}

// querySpan returns the queries that see any key of rows [lo, hi) of document d.
func (g *attnGeom) querySpan(d, lo, hi int) (int, int) {
	a, _ := g.queries(d, lo)
	_, z := g.queries(d, hi-1)
	if z < a {
		z = a
	}
	return a, z
}

// gather copies the rows [lo, lo+rows) of heads h0..h0+g-1 (width hd, row stride w) into dst
// stacked head-major: dst[(hh*rows+r)*hd:] = src[(lo+r)*w+(h0+hh)*hd:].
func gather(dst, src []float32, lo, rows, w, h0, g, hd int) {
	for hh := 0; hh < g; hh++ {
		for r := 0; r < rows; r++ {
			o := (lo+r)*w + (h0+hh)*hd
			copy(dst[(hh*rows+r)*hd:(hh*rows+r+1)*hd], src[o:o+hd])
		}
	}
}

// scatter is the inverse of gather.
func scatter(dst, src []float32, lo, rows, w, h0, g, hd int) {
	for hh := 0; hh < g; hh++ {
		for r := 0; r < rows; r++ {
			o := (lo+r)*w + (h0+hh)*hd
			copy(dst[o:o+hd], src[(hh*rows+r)*hd:(hh*rows+r+1)*hd])
		}
	}
}

// scratch is a set of pooled buffers released together.
type scratch []*[]float32

func (s *scratch) get(n int) []float32 {
	p := getScratch(n)
	*s = append(*s, p)
	return *p
}

func (s *scratch) release() {
	for _, p := range *s {
		putScratch(p)
	}
	*s = nil
}

// forward computes, for each task (query block x kv head), S = scale*Q K^T for the queries of
// all heads of the kv group stacked as rows (so K is packed once), a masked softmax per row
// (recording LSE), and Out = P V. Score blocks are [group*64 x span] per task: the [N, N]
// matrix never exists.
func (g *attnGeom) forward(b *Backend, qs, ks, vs, os, lse []float32) {
	hd, gr := g.hd, g.group
	ts := g.tasks(false)
	b.pool.run(len(ts), func(ti int) {
		t := ts[ti]
		var sc scratch
		defer sc.release()
		var ws gemmScratch
		defer ws.release()
		jlo, jhi := g.keySpan(t.doc, t.lo, t.hi)
		m, l := t.hi-t.lo, jhi-jlo
		rows := gr * m
		h0 := t.kvh * gr
		qst, s, ost := sc.get(rows*hd), sc.get(rows*l), sc.get(rows*hd)
		gather(qst, qs, t.lo, m, g.qw, h0, gr, hd)
		gemmSerial(false, true, rows, l, hd, g.scale, qst, hd, ks[jlo*g.kw+t.kvh*hd:], g.kw, 0, s, l, &ws)
		for x := 0; x < rows; x++ {
			hh, r := x/m, x%m
			a, z := g.visible(t.doc, t.lo+r)
			row := s[x*l : (x+1)*l]
			vis := row[a-jlo : z-jlo]
			mx := float32(math.Inf(-1))
			for _, v := range vis {
				mx = max(mx, v)
			}
			for j := range vis {
				vis[j] -= mx
			}
			expVec(vis, vis)
			var sum float64
			for _, e := range vis {
				sum += float64(e)
			}
			clear(row[:a-jlo])
			clear(row[z-jlo:])
			inv := float32(1 / sum)
			for j := range vis {
				vis[j] *= inv
			}
			if lse != nil {
				lse[(t.lo+r)*g.nh+h0+hh] = mx + float32(math.Log(sum))
			}
		}
		gemmSerial(false, false, rows, hd, l, 1, s, l, vs[jlo*g.kw+t.kvh*hd:], g.kw, 0, ost, hd, &ws)
		scatter(os, ost, t.lo, m, g.qw, h0, gr, hd)
	})
}

// backward recomputes probabilities blockwise from Q, K and LSE. Pass 1 (query blocks) writes
// dQ; pass 2 (key blocks) writes dK and dV, with the queries of all heads of a kv group stacked
// so one product sums over them. Every output row has one writer, so no locks or atomics are
// needed and results do not depend on the number of workers.
func (g *attnGeom) backward(b *Backend, qs, ks, vs, os, dos, lse, dq, dk, dv []float32) {
	hd, gr := g.hd, g.group
	dd := make([]float32, g.nq*g.nh) // D[i,h] = dOut[i,h] . Out[i,h]
	b.pool.rows(g.nq, 64, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			for h := 0; h < g.nh; h++ {
				o := i*g.qw + h*hd
				dd[i*g.nh+h] = dot(dos[o:o+hd], os[o:o+hd])
			}
		}
	})
	qt := g.tasks(false)
	b.pool.run(len(qt), func(ti int) {
		t := qt[ti]
		var sc scratch
		defer sc.release()
		var ws gemmScratch
		defer ws.release()
		jlo, jhi := g.keySpan(t.doc, t.lo, t.hi)
		m, l := t.hi-t.lo, jhi-jlo
		rows := gr * m
		h0 := t.kvh * gr
		qst, dost, dqst := sc.get(rows*hd), sc.get(rows*hd), sc.get(rows*hd)
		p, dp := sc.get(rows*l), sc.get(rows*l)
		gather(qst, qs, t.lo, m, g.qw, h0, gr, hd)
		gather(dost, dos, t.lo, m, g.qw, h0, gr, hd)
		gemmSerial(false, true, rows, l, hd, g.scale, qst, hd, ks[jlo*g.kw+t.kvh*hd:], g.kw, 0, p, l, &ws)
		gemmSerial(false, true, rows, l, hd, 1, dost, hd, vs[jlo*g.kw+t.kvh*hd:], g.kw, 0, dp, l, &ws)
		for x := 0; x < rows; x++ {
			hh, r := x/m, x%m
			i := t.lo + r
			a, z := g.visible(t.doc, i)
			li, di := lse[i*g.nh+h0+hh], dd[i*g.nh+h0+hh]
			row, drow := p[x*l:(x+1)*l], dp[x*l:(x+1)*l]
			vis, dvis := row[a-jlo:z-jlo], drow[a-jlo:z-jlo]
			for j := range vis {
				vis[j] -= li
			}
			expVec(vis, vis)
			for j, pr := range vis {
				vis[j] = pr * (dvis[j] - di) // dS
			}
			clear(row[:a-jlo])
			clear(row[z-jlo:])
		}
		gemmSerial(false, false, rows, hd, l, g.scale, p, l, ks[jlo*g.kw+t.kvh*hd:], g.kw, 0, dqst, hd, &ws)
		scatter(dq, dqst, t.lo, m, g.qw, h0, gr, hd)
	})
	kt := g.tasks(true)
	b.pool.run(len(kt), func(ti int) {
		t := kt[ti]
		ilo, ihi := g.querySpan(t.doc, t.lo, t.hi)
		m, l := t.hi-t.lo, ihi-ilo
		if l == 0 {
			for j := t.lo; j < t.hi; j++ {
				clear(dk[j*g.kw+t.kvh*hd : j*g.kw+(t.kvh+1)*hd])
				clear(dv[j*g.kw+t.kvh*hd : j*g.kw+(t.kvh+1)*hd])
			}
			return
		}
		var sc scratch
		defer sc.release()
		var ws gemmScratch
		defer ws.release()
		cols := gr * l // queries of every head of the group, head-major
		h0 := t.kvh * gr
		qst, dost := sc.get(cols*hd), sc.get(cols*hd)
		pt, dpt := sc.get(m*cols), sc.get(m*cols)
		gather(qst, qs, ilo, l, g.qw, h0, gr, hd)
		gather(dost, dos, ilo, l, g.qw, h0, gr, hd)
		gemmSerial(false, true, m, cols, hd, g.scale, ks[t.lo*g.kw+t.kvh*hd:], g.kw, qst, hd, 0, pt, cols, &ws)
		gemmSerial(false, true, m, cols, hd, 1, vs[t.lo*g.kw+t.kvh*hd:], g.kw, dost, hd, 0, dpt, cols, &ws)
		for r := 0; r < m; r++ {
			qa, qz := g.queries(t.doc, t.lo+r)
			ca, cz := qa-ilo, max(qz-ilo, qa-ilo)
			for hh := 0; hh < gr; hh++ {
				h := h0 + hh
				row := pt[r*cols+hh*l : r*cols+(hh+1)*l]
				drow := dpt[r*cols+hh*l : r*cols+(hh+1)*l]
				vis, dvis := row[ca:cz], drow[ca:cz]
				for c := range vis {
					vis[c] -= lse[(ilo+ca+c)*g.nh+h]
				}
				expVec(vis, vis)
				for c, pr := range vis {
					dvis[c] = pr * (dvis[c] - dd[(ilo+ca+c)*g.nh+h]) // dS^T
				}
				clear(row[:ca])
				clear(row[cz:])
				clear(drow[:ca])
				clear(drow[cz:])
			}
		}
		gemmSerial(false, false, m, hd, cols, 1, pt, cols, dost, hd, 0, dv[t.lo*g.kw+t.kvh*hd:], g.kw, &ws)
		gemmSerial(false, false, m, hd, cols, g.scale, dpt, cols, qst, hd, 0, dk[t.lo*g.kw+t.kvh*hd:], g.kw, &ws)
	})
}
