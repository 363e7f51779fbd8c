package cpu

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
)

func init() {
	dsv4Fills = append(dsv4Fills, func(b *Backend, o *backend.DSV4Ops) {
		o.SinkAttention = b.SinkAttention
		o.SinkAttentionBackward = b.SinkAttentionBackward
	})
}

// sinkView is which keys each query of a sink attention sees (backend.SinkAttentionArgs):
// own key s ≤ t within the window, then compressed entry w < (t+1)/Rate that the mask picked.
type sinkView struct {
	n, comp, window, rate int
	mask                  []int32 // [n, comp]; nil: every entry under the causal bound
}

func newSinkView(op string, a backend.SinkAttentionArgs, d backend.SinkAttentionDims) (sinkView, error) {
	v := sinkView{n: d.N, comp: d.S - d.N, window: a.Window, rate: a.Rate}
	if !a.Mask.IsNil() && v.comp > 0 {
		m, err := ints(op, "Mask", a.Mask)
		if err != nil {
			return v, err
		}
		v.mask = m
	}
	return v, nil
}

// own returns the own keys [lo, hi) that query t sees.
func (v sinkView) own(t int) (lo, hi int) {
	if v.window > 0 {
		lo = max(0, t-v.window+1)
	}
	return lo, t + 1
}

// comps returns the bound on the compressed entries query t sees: w < comps(t) (before the
// mask).
func (v sinkView) comps(t int) int {
	if v.comp == 0 {
		return 0
	}
	return min(v.comp, (t+1)/v.rate)
}

// picked reports whether the mask lets query t see compressed entry w.
func (v sinkView) picked(t, w int) bool { return v.mask == nil || v.mask[t*v.comp+w] != 0 }

// ownQueries returns the queries [lo, hi) that see own key s.
func (v sinkView) ownQueries(s int) (lo, hi int) {
	hi = v.n
	if v.window > 0 {
		hi = min(v.n, s+v.window)
	}
	return s, hi
}

// compQueries returns the first query that may see compressed entry w (every later one may
// too, before the mask).
func (v sinkView) compQueries(w int) int { return (w+1)*v.rate - 1 }

// keys appends to ks the keys (rows of KV) query t sees, in increasing order.
func (v sinkView) keys(ks []int, t int) []int {
	lo, hi := v.own(t)
	for s := lo; s < hi; s++ {
		ks = append(ks, s)
	}
	for w := 0; w < v.comps(t); w++ {
		if v.picked(t, w) {
			ks = append(ks, v.n+w)
		}
	}
	return ks
}

func dot64(a, b []float32) float64 {
	var s float64
	for i, x := range a {
		s += float64(x) * float64(b[i])
	}
	return s
}

// sinkQueryRows is how many query rows one worker takes at a time.
func sinkQueryRows(h, d, s int) int { return max(1, convChunk/max(1, h*d*s/8)) }

// SinkAttention implements backend.DSV4Ops.SinkAttention: per query row and head, the
// softmax over the visible keys and the head's sink logit, in float64 over the fp32 operands.
// A query that sees no key puts all its weight on the sink (Out 0, LSE the sink).
func (b *Backend) SinkAttention(a backend.SinkAttentionArgs) error {
	const op = "sink attention"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	view, err := newSinkView(op, a, d)
	if err != nil {
		return err
	}
	q, err := b.in(op, "Q", a.Q)
	if err != nil {
		return err
	}
	kv, err := b.in(op, "KV", a.KV)
	if err != nil {
		return err
	}
	sinks, err := b.in(op, "Sinks", a.Sinks)
	if err != nil {
		return err
	}
	lse, err := f32only(op, "LSE", a.LSE)
	if err != nil {
		return err
	}
	out, flush, err := b.out(op, "Out", a.Out, false)
	if err != nil {
		return err
	}
	N, H, D := d.N, d.H, d.D
	scale := float64(a.Scale)
	b.pool.rows(N, sinkQueryRows(H, D, d.S), func(lo, hi int) {
		var ks []int
		sc := make([]float64, 0, d.S)
		acc := make([]float64, D)
		for t := lo; t < hi; t++ {
			ks = view.keys(ks[:0], t)
			for h := 0; h < H; h++ {
				qh := q[(t*H+h)*D : (t*H+h+1)*D]
				m := float64(sinks[h])
				sc = sc[:0]
				for _, s := range ks {
					x := scale * dot64(qh, kv[s*D:(s+1)*D])
					sc = append(sc, x)
					m = math.Max(m, x)
				}
				z := math.Exp(float64(sinks[h]) - m)
				for _, x := range sc {
					z += math.Exp(x - m)
				}
				l := m + math.Log(z)
				clear(acc)
				for i, s := range ks {
					p := math.Exp(sc[i] - l)
					for c, x := range kv[s*D : (s+1)*D] {
						acc[c] += p * float64(x)
					}
				}
				o := out[(t*H+h)*D : (t*H+h+1)*D]
				for c := range o {
					o[c] = float32(acc[c])
				}
				lse[t*H+h] = float32(l)
			}
		}
	})
	flush()
	return nil
}

// SinkAttentionBackward implements backend.DSV4Ops.SinkAttentionBackward with the
// probabilities recomputed from the forward's LSE, in three deterministic passes: Δ = DOut·Out
// and DQ per query row; DKV per key row, over the queries that see it in increasing order and
// each one's heads; GSinks per head over the queries in increasing order.
func (b *Backend) SinkAttentionBackward(a backend.SinkAttentionBackwardArgs) error {
	const op = "sink attention backward"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	view, err := newSinkView(op, a.SinkAttentionArgs, d)
	if err != nil {
		return err
	}
	in := func(name string, t T) []float32 {
		if err != nil {
			return nil
		}
		var v []float32
		v, err = b.in(op, name, t)
		return v
	}
	q, kv, sinks := in("Q", a.Q), in("KV", a.KV), in("Sinks", a.Sinks)
	out, dout := in("Out", a.Out), in("DOut", a.DOut)
	if err != nil {
		return err
	}
	lse, err := f32only(op, "LSE", a.LSE)
	if err != nil {
		return err
	}
	N, S, H, D := d.N, d.S, d.H, d.D
	scale := float64(a.Scale)
	delta := make([]float64, N*H)
	// p and dlogit of query row t, head h, for key s.
	grad := func(t, h, s int) (p, dl float64) {
		qh, ks := q[(t*H+h)*D:(t*H+h+1)*D], kv[s*D:(s+1)*D]
		p = math.Exp(scale*dot64(qh, ks) - float64(lse[t*H+h]))
		dp := dot64(dout[(t*H+h)*D:(t*H+h+1)*D], ks)
		return p, p * (dp - delta[t*H+h]) * scale
	}

	dq, flushQ, err := b.out(op, "DQ", a.DQ, true)
	if err != nil {
		return err
	}
	per := sinkQueryRows(H, D, S)
	b.pool.rows(N, per, func(lo, hi int) {
		var ks []int
		acc := make([]float64, D)
		for t := lo; t < hi; t++ {
			ks = view.keys(ks[:0], t)
			for h := 0; h < H; h++ {
				r := (t*H + h) * D
				delta[t*H+h] = dot64(dout[r:r+D], out[r:r+D])
				clear(acc)
				for _, s := range ks {
					_, dl := grad(t, h, s)
					for c, x := range kv[s*D : (s+1)*D] {
						acc[c] += dl * float64(x)
					}
				}
				for c := range acc {
					dq[r+c] += float32(acc[c])
				}
			}
		}
	})
	flushQ()

	dkv, flushKV, err := b.out(op, "DKV", a.DKV, true)
	if err != nil {
		return err
	}
	b.pool.rows(S, per, func(lo, hi int) {
		acc := make([]float64, D)
		add := func(t, s int) {
			for h := 0; h < H; h++ {
				p, dl := grad(t, h, s)
				r := (t*H + h) * D
				for c := range acc {
					acc[c] += p*float64(dout[r+c]) + dl*float64(q[r+c])
				}
			}
		}
		for s := lo; s < hi; s++ {
			clear(acc)
			if s < N {
				t0, t1 := view.ownQueries(s)
				for t := t0; t < t1; t++ {
					add(t, s)
				}
			} else {
				w := s - N
				for t := view.compQueries(w); t < N; t++ {
					if view.picked(t, w) {
						add(t, s)
					}
				}
			}
			for c := range acc {
				dkv[s*D+c] += float32(acc[c])
			}
		}
	})
	flushKV()

	if a.GSinks.IsNil() {
		return nil
	}
	gs := make([]float64, H)
	for h := range gs {
		for t := 0; t < N; t++ {
			gs[h] -= math.Exp(float64(sinks[h])-float64(lse[t*H+h])) * delta[t*H+h]
		}
	}
	return b.addGrads(op, gradSum{"GSinks", a.GSinks, gs})
}
