package cpu

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
)

func init() {
	dsv4Fills = append(dsv4Fills, func(b *Backend, o *backend.DSV4Ops) {
		o.SinkSoftmax = b.SinkSoftmax
		o.SinkSoftmaxBackward = b.SinkSoftmaxBackward
	})
}

// sinkSoftmaxRows is how many rows of S columns one worker takes at a time.
func sinkSoftmaxRows(s int) int { return max(1, convChunk/max(1, s)) }

// SinkSoftmax implements backend.DSV4Ops.SinkSoftmax: per row, the softmax over the visible
// columns (sink attention's rule, sinkView) and the head's sink logit, in float64 over the
// fp32 scores. A row that sees nothing gets P 0 and LSE the sink.
func (b *Backend) SinkSoftmax(a backend.SinkSoftmaxArgs) error {
	const op = "sink softmax"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	view := sinkView{n: d.N, comp: d.S - d.N, window: a.Window, rate: a.Rate}
	if !a.Mask.IsNil() && view.comp > 0 {
		if view.mask, err = ints(op, "Mask", a.Mask); err != nil {
			return err
		}
	}
	x, err := f32only(op, "X", a.X)
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
	p, flush, err := b.out(op, "P", a.P, false)
	if err != nil {
		return err
	}
	H, S := d.H, d.S
	b.pool.rows(d.N*H, sinkSoftmaxRows(S), func(lo, hi int) {
		var ks []int
		for r := lo; r < hi; r++ {
			t, h := r/H, r%H
			ks = view.keys(ks[:0], t)
			xr, pr := x[r*S:(r+1)*S], p[r*S:(r+1)*S]
			var l float64
			if a.UseLSE {
				l = float64(lse[r])
			} else {
				m := float64(sinks[h])
				for _, s := range ks {
					m = math.Max(m, float64(xr[s]))
				}
				z := math.Exp(float64(sinks[h]) - m)
				for _, s := range ks {
					z += math.Exp(float64(xr[s]) - m)
				}
				l = m + math.Log(z)
				lse[r] = float32(l)
			}
			clear(pr)
			for _, s := range ks {
				pr[s] = float32(math.Exp(float64(xr[s]) - l))
			}
		}
	})
	flush()
	return nil
}

// SinkSoftmaxBackward implements backend.DSV4Ops.SinkSoftmaxBackward: Δ and DS per row
// (every element of P read before DS is written, so DS may be P), then GSinks per head over
// the queries in increasing order.
func (b *Backend) SinkSoftmaxBackward(a backend.SinkSoftmaxBackwardArgs) error {
	const op = "sink softmax backward"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	p, err := b.in(op, "P", a.P)
	if err != nil {
		return err
	}
	dp, err := f32only(op, "DP", a.DP)
	if err != nil {
		return err
	}
	lse, err := f32only(op, "LSE", a.LSE)
	if err != nil {
		return err
	}
	sinks, err := b.in(op, "Sinks", a.Sinks)
	if err != nil {
		return err
	}
	ds, flush, err := b.out(op, "DS", a.DS, false)
	if err != nil {
		return err
	}
	N, H, S := d.N, d.H, d.S
	delta := make([]float64, N*H)
	b.pool.rows(N*H, sinkSoftmaxRows(S), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			pr, dpr, dsr := p[r*S:(r+1)*S], dp[r*S:(r+1)*S], ds[r*S:(r+1)*S]
			var dl float64
			for s, v := range pr {
				dl += float64(v) * float64(dpr[s])
			}
			delta[r] = dl
			for s, v := range pr {
				dsr[s] = float32(float64(v) * (float64(dpr[s]) - dl))
			}
		}
	})
	flush()
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
