package cpu

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// ShortConv implements backend.Optional.ShortConv: the reference the device kernel is tested
// against. Rows are shared out to the workers; each token's taps read the rows before it in its
// document (shortconv.go in engine/backend states the contract).
func (b *Backend) ShortConv(a backend.ShortConvArgs) error {
	const op = "short conv"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	bcx, err := b.in(op, "BCX", a.BCX)
	if err != nil {
		return err
	}
	w, err := b.in(op, "W", a.W)
	if err != nil {
		return err
	}
	var bias []float32
	if !a.Bias.IsNil() {
		if bias, err = b.in(op, "Bias", a.Bias); err != nil {
			return err
		}
	}
	pos, err := ints(op, "Positions", a.Positions)
	if err != nil {
		return err
	}
	conv, flushC, err := b.out(op, "Conv", a.Conv, false)
	if err != nil {
		return err
	}
	gated, flushG, err := b.out(op, "Gated", a.Gated, false)
	if err != nil {
		return err
	}
	round := roundTo(a.Conv.DType())
	n, ch, l := d.N, d.C, d.L
	b.pool.rows(n, max(1, convChunk/(ch*l)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			for j := 0; j < ch; j++ {
				var acc float32
				if bias != nil {
					acc = bias[j]
				}
				for k := 0; k < l; k++ {
					back := l - 1 - k
					if int(pos[r]) < back || r < back {
						continue
					}
					src := (r - back) * 3 * ch
					acc += w[j*l+k] * round(bcx[src+j]*bcx[src+2*ch+j])
				}
				cv := round(acc)
				conv[r*ch+j] = cv
				gated[r*ch+j] = bcx[r*3*ch+ch+j] * cv
			}
		}
	})
	flushC()
	flushG()
	return nil
}

// ShortConvBackward implements backend.Optional.ShortConvBackward: the reference of the
// device kernels. The input gradient gathers, for each token, the taps of the later tokens of
// its document that read it; the filter and bias gradients are sums over all tokens per
// channel, accumulated in float64 and added once.
func (b *Backend) ShortConvBackward(a backend.ShortConvBackwardArgs) error {
	const op = "short conv backward"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	dg, err := b.in(op, "DGated", a.DGated)
	if err != nil {
		return err
	}
	bcx, err := b.in(op, "BCX", a.BCX)
	if err != nil {
		return err
	}
	w, err := b.in(op, "W", a.W)
	if err != nil {
		return err
	}
	pos, err := ints(op, "Positions", a.Positions)
	if err != nil {
		return err
	}
	conv, err := b.in(op, "Conv", a.Conv)
	if err != nil {
		return err
	}
	dbcx, flush, err := b.out(op, "DBCX", a.DBCX, false)
	if err != nil {
		return err
	}
	n, ch, l := d.N, d.C, d.L
	round := roundTo(a.Conv.DType())
	dconv := func(r, j int) float32 { return dg[r*ch+j] * bcx[r*3*ch+ch+j] }
	b.pool.rows(n, max(1, convChunk/(ch*l)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			row := bcx[r*3*ch : (r+1)*3*ch]
			out := dbcx[r*3*ch : (r+1)*3*ch]
			for j := 0; j < ch; j++ {
				var dbx float32
				for back := 0; back < l && r+back < n; back++ {
					if int(pos[r+back]) >= back {
						dbx += w[j*l+l-1-back] * dconv(r+back, j)
					}
				}
				out[j] = dbx * row[2*ch+j]
				out[ch+j] = dg[r*ch+j] * conv[r*ch+j]
				out[2*ch+j] = dbx * row[j]
			}
		}
	})
	flush()
	if a.GW.IsNil() && a.GBias.IsNil() {
		return nil
	}
	gw := make([]float64, ch*l)
	gb := make([]float64, ch)
	b.pool.rows(ch, 1, func(lo, hi int) {
		for j := lo; j < hi; j++ {
			for r := 0; r < n; r++ {
				g := float64(dconv(r, j))
				gb[j] += g
				for k := 0; k < l; k++ {
					back := l - 1 - k
					if int(pos[r]) < back || r < back {
						continue
					}
					src := (r - back) * 3 * ch
					gw[j*l+k] += g * float64(round(bcx[src+j]*bcx[src+2*ch+j]))
				}
			}
		}
	})
	return b.addGrads(op, gradSum{"GW", a.GW, gw}, gradSum{"GBias", a.GBias, gb})
}

// roundTo rounds a float32 to dt (the identity for F32).
func roundTo(dt tensor.DType) func(float32) float32 {
	switch dt {
	case tensor.BF16:
		return func(v float32) float32 { return tensor.BF16ToF32(tensor.F32ToBF16(v)) }
	case tensor.F16:
		return func(v float32) float32 { return tensor.F16ToF32(tensor.F32ToF16(v)) }
	}
	return func(v float32) float32 { return v }
}
